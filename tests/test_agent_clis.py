"""Real agent CLIs, unmodified, against the adapters on the tiny model.

Claude Code talks to the AnthropicAdapter (`ANTHROPIC_BASE_URL`), Codex to the OpenAIAdapter
(Responses API); the session id is their API key. The tiny model's answers are nonsense, so
what is checked is the protocol (every request the CLI sends succeeds, the CLI finishes
without an API or stream error) and the exported trajectory (the segments are exactly what
vLLM saw and sampled, and make valid `Sample`s).

Their first prompt is 40-50k characters (~12-15k tiny-model tokens), so these tests use the
32k-context `long_context_server`, not the shared 4k one. Sampling is made deterministic with
a session default `seed` (the CLIs send no seed) and quick with a small `max_tokens` (the adapter
samples at most the smaller of the request's and the defaults' `max_tokens`) and, where the
turn must end normally, `stop_token_ids` (see `sampling_defaults`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path

import pytest
from aiohttp import web

from vime.agent.adapters import AnthropicAdapter, OpenAIAdapter
from vime.agent.trajectory import segments_to_samples
from vime.testing.engine import RecordingEngineClient, check_segments_against_engine

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parent.parent
CLI_TIMEOUT_S = 240


def sampling_defaults(tokenizer) -> dict:
    """Short, seeded turns that end by themselves. A random tiny model almost never samples its
    end-of-turn token, and a turn cut at `max_tokens` is not a normal end for an agent CLI
    (Claude Code answers `stop_reason: "max_tokens"` by asking the model to resume, three
    times, then reports an error). So every token that starts a new word or line also ends the
    turn (`stop_token_ids`, a third of the vocabulary): a turn is a few tokens and ends with
    `finish_reason: "stop"`, as a trained model's would. The ids are still exactly vLLM's."""
    ends = sorted(i for piece, i in tokenizer.get_vocab().items() if "\u0120" in piece or "\u010a" in piece)
    return {"max_tokens": 32, "seed": 0, "stop_token_ids": [tokenizer.eos_token_id, *ends]}


def cli_binary(name: str, env_var: str) -> str | None:
    """$VIME_<NAME>_BIN, the repo's node_modules (scripts/setup.sh installs the CLIs), or PATH."""
    local = ROOT / "node_modules" / ".bin" / name
    return os.environ.get(env_var) or (str(local) if local.exists() else shutil.which(name))


CLAUDE = cli_binary("claude", "VIME_CLAUDE_BIN")
CODEX = cli_binary("codex", "VIME_CODEX_BIN")


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


class TimedEngine(RecordingEngineClient):
    """`RecordingEngineClient` that also keeps each turn's time in vLLM (`.seconds`)."""

    def __init__(self, base_url: str, tokenizer) -> None:
        super().__init__(base_url, timeout=600.0)
        self.tokenizer = tokenizer
        self.seconds: list[float] = []

    async def generate(self, *args, **kwargs):
        t0 = time.monotonic()
        out = await super().generate(*args, **kwargs)
        self.seconds.append(time.monotonic() - t0)
        return out


def tokenizer_decode(engine: TimedEngine, ids: list[int]) -> str:
    return engine.tokenizer.decode(ids, skip_special_tokens=False)[:60]


def record_requests(adapter) -> list[dict]:
    """Every request the adapter answers: method, path, body size, status (before start())."""
    seen: list[dict] = []

    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        seen.append({"method": request.method, "path": request.path_qs, "bytes": request.content_length or 0,
                     "status": response.status})

    adapter.app.on_response_prepare.append(on_prepare)
    return seen


async def run_cli(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
    except asyncio.TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        raise AssertionError(f"{argv[0]} ran past {CLI_TIMEOUT_S} s\nstdout: {out.decode()[-2000:]}\n"
                             f"stderr: {err.decode()[-2000:]}") from None
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), time.monotonic() - t0


def clean_env(**extra: str) -> dict[str, str]:
    """The environment minus anything that would point a CLI elsewhere or log it in."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANTHROPIC_", "OPENAI_", "CLAUDE_", "CODEX_"))}
    return {**env, **extra}


def check_trajectory(segments, engine, session_id: str, seen: list[dict], label: str, wall_s: float) -> None:
    """Every request succeeded, the segments are exactly what vLLM sampled, and make Samples."""
    print(f"\n{label}: {wall_s:.1f} s wall, {len(seen)} requests, {len(engine.calls)} turns, "
          f"{len(segments)} segments")
    for r in seen:
        print(f"  {r['method']} {r['path']} {r['bytes']} bytes -> {r['status']}")
    for k, call in enumerate(engine.calls):
        print(f"  turn {k}: prompt {len(call.prompt_ids)} tokens, sampled {len(call.output.token_ids)} "
              f"({call.output.finish_reason}), {engine.seconds[k]:.1f} s in vLLM, "
              f"text {tokenizer_decode(engine, call.output.token_ids)!r}")
    for i, seg in enumerate(segments):
        print(f"  segment {i}: {len(seg.token_ids)} tokens, {len(seg.turns)} turns, {seg.started_because[:120]!r}")
    assert [r for r in seen if r["status"] >= 400] == [], seen
    assert engine.calls, f"{label}: no turn reached vLLM; requests: {seen}"
    assert len(segments) >= 1
    check_segments_against_engine(segments, engine.calls)
    samples = segments_to_samples(segments, rollout_id=session_id, reward=0.0)
    assert len(samples) == len(segments)
    for sample, segment in zip(samples, segments):
        sample.validate()
        assert sample.tokens == segment.token_ids and sum(sample.loss_mask) == sum(segment.loss_mask) > 0
        assert set(sample.loss_mask) <= {0, 1} and sample.rollout_id == session_id


async def run_claude_code(tokenizer, server, tmp_path, session_id: str, sampling: dict):
    """`claude -p "Say hi"` against an AnthropicAdapter on `server`; returns its JSON result, the
    exported segments, the recording engine, the requests seen and the wall time."""
    engine = TimedEngine(server.url, tokenizer)
    adapter = AnthropicAdapter(tokenizer, server.url, engine=engine, max_turns=16)
    seen = record_requests(adapter)
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    work = tmp_path / "work"
    work.mkdir()
    try:
        async with adapter.serve() as url:
            adapter.open_session(session_id, sampling_defaults=sampling)
            env = clean_env(ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY=session_id, HOME=str(home),
                            CLAUDE_CONFIG_DIR=str(home / ".claude"), DISABLE_TELEMETRY="1",
                            DISABLE_AUTOUPDATER="1", DISABLE_ERROR_REPORTING="1",
                            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
            rc, out, err, wall_s = await run_cli(
                [CLAUDE, "-p", "Say hi", "--output-format", "json", "--max-turns", "2"], env, work)
            segments = await adapter.finish_session(session_id)
    finally:
        await engine.close()
    lines = [line for line in out.splitlines() if line.strip().startswith("{")]
    assert lines, f"no JSON result from Claude Code (rc {rc})\nstdout: {out[-2000:]}\nstderr: {err[-2000:]}"
    result = json.loads(lines[-1])
    print(f"\nclaude result: { {k: result.get(k) for k in ('subtype', 'is_error', 'terminal_reason', 'num_turns')} }")
    return result, segments, engine, seen, err, wall_s


@pytest.mark.skipif(CLAUDE is None, reason="Claude Code not installed (npm install @anthropic-ai/claude-code)")
async def test_claude_code_completes_a_session_and_its_trajectory_is_exported(tokenizer, long_context_server,
                                                                              tmp_path):
    session_id = "claude-code-session"
    result, segments, engine, seen, err, wall_s = await run_claude_code(
        tokenizer, long_context_server, tmp_path, session_id, sampling_defaults(tokenizer))
    check_trajectory(segments, engine, session_id, seen, "claude", wall_s)
    assert result.get("terminal_reason") != "api_error" and result.get("is_error") is False, (result, err[-2000:])


@pytest.mark.skipif(CLAUDE is None, reason="Claude Code not installed (npm install @anthropic-ai/claude-code)")
async def test_claude_code_resumes_truncated_turns_and_they_extend_one_segment(tokenizer, long_context_server,
                                                                              tmp_path):
    """Turns cut at the session's `max_tokens` (a rollout's response cap) answer
    `stop_reason: "max_tokens"`; Claude Code then asks the model to resume (three times) and gives
    up with an error result of its own. The protocol holds through it: every request succeeds,
    and each resume extends the same segment (the client sends the truncated answer back)."""
    session_id = "claude-code-truncated"
    result, segments, engine, seen, _, wall_s = await run_claude_code(
        tokenizer, long_context_server, tmp_path, session_id, {"max_tokens": 16, "seed": 0})
    check_trajectory(segments, engine, session_id, seen, "claude (truncated turns)", wall_s)
    assert result.get("terminal_reason") != "api_error" and result.get("api_error_status") is None, result
    truncated = [c for c in engine.calls if c.output.finish_reason == "length"]
    assert truncated, "no turn was cut at max_tokens"
    assert len(engine.calls) >= 2 and len(segments) == 1 and len(segments[0].turns) == len(engine.calls), \
        [s.started_because for s in segments]


@pytest.mark.skipif(CODEX is None, reason="Codex CLI not installed (npm install @openai/codex)")
async def test_codex_completes_a_session_over_the_responses_api_and_its_trajectory_is_exported(
        tokenizer, long_context_server, tmp_path):
    engine = TimedEngine(long_context_server.url, tokenizer)
    adapter = OpenAIAdapter(tokenizer, long_context_server.url, engine=engine, max_turns=16)
    seen = record_requests(adapter)
    session_id = "codex-session"
    home = tmp_path / "codex-home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    try:
        async with adapter.serve() as url:
            adapter.open_session(session_id, sampling_defaults=sampling_defaults(tokenizer))
            provider = (f'model_providers.local={{name="local",base_url="{url}/v1",env_key="OPENAI_API_KEY",'
                        'wire_api="responses"}')
            env = clean_env(OPENAI_API_KEY=session_id, CODEX_HOME=str(home), HOME=str(tmp_path))
            rc, out, err, wall_s = await run_cli(
                [CODEX, "exec", "--skip-git-repo-check", "-c", provider, "-c", "model_provider=local",
                 "-m", "tiny", "Say hi"], env, work)
            segments = await adapter.finish_session(session_id)
    finally:
        await engine.close()
    protocol_errors = [line for line in err.splitlines()
                       if "error" in line.lower() and any(w in line.lower() for w in ("stream", "protocol", "sse",
                                                                                       "decode", "parse", "retry"))]
    assert rc == 0 and protocol_errors == [], f"rc {rc}\nstdout: {out[-2000:]}\nstderr: {err[-3000:]}"
    print(f"\ncodex stdout tail: {out[-300:]!r}")
    check_trajectory(segments, engine, session_id, seen, "codex", wall_s)
