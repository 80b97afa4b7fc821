"""The coding agent, specified against real parts: the `anthropic` SDK talking to the
`AnthropicAdapter`, a real bubblewrap sandbox over a task repository, and the tiny model's
tokenizer and chat template. Only the policy is scripted (`ScriptedEngine`): each test says
what the model replies, turn by turn, and checks what the agent, the sandbox and the
adapter's recorded segments make of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from vime.agent.adapters import AnthropicAdapter
from vime.agent.adapters.anthropic import to_chat
from vime.envs.coding_agent.agent import (COMPACT_PROMPT, DEFAULT_SYSTEM_PROMPT, SUMMARY_PREFIX, AgentConfig,
                                     AgentState, CodingAgent, run_coding_agent)
from vime.envs.coding_agent.claude_code import claude_code_available, claude_code_binds, run_claude_code
from vime.envs.coding_agent.tools import MAIN_TOOLS, tool_definitions
from vime.sandbox import BwrapSandbox
from vime.testing.engine import RecordingEngineClient, check_segments_against_engine
from vime.testing.scripted import ScriptedEngine, tool_call_text

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "examples" / "coding_agent_rl" / "tasks"
TASK = next(t for t in map(json.loads, (TASKS / "tasks.jsonl").read_text().splitlines())
            if t["task_id"] == "pagination_page_count")
REPO = TASKS / TASK["repo"]
TESTS = "/usr/bin/python3 -m unittest -q"  # commands run as uid 65534: the system python, not the venv


def gold_edits(diff: str) -> list[tuple[str, str, str]]:
    """(path, old, new) per hunk of a unified diff: old is its context and removed lines,
    new its context and added lines (the context makes old unique in the file)."""
    edits, path, old, new = [], None, None, None
    for line in diff.splitlines(keepends=True):
        if line.startswith(("@@", "diff ", "--- ")) and old is not None:
            edits.append((path, "".join(old), "".join(new)))
            old = new = None
        if line.startswith("+++ "):
            path = line[4:].strip().removeprefix("b/")
        elif line.startswith("@@"):
            old, new = [], []
        elif old is not None and line[:1] in (" ", "-", "+"):
            if line[0] in " -":
                old.append(line[1:])
            if line[0] in " +":
                new.append(line[1:])
    if old is not None:
        edits.append((path, "".join(old), "".join(new)))
    return edits


GOLD = gold_edits((TASKS / TASK["gold_patch"]).read_text())


class Script:
    """The policy: the given replies, in order, whatever the prompt; keeps every prompt."""

    def __init__(self, *replies: str) -> None:
        self.replies, self.prompts = list(replies), []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        assert len(self.prompts) <= len(self.replies), \
            f"the model was asked more than the {len(self.replies)} scripted turns"
        return self.replies[len(self.prompts) - 1]


def call(name: str, **arguments) -> str:
    return tool_call_text(name, arguments)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@contextlib.asynccontextmanager
async def scripted_adapter(tokenizer, policy, **kwargs):
    """(adapter, engine, base_url): an AnthropicAdapter served on a free port whose turns
    `policy` writes."""
    engine = ScriptedEngine(tokenizer, policy)
    adapter = AnthropicAdapter(tokenizer, "http://scripted", engine=engine, max_context_tokens=65536, **kwargs)
    async with adapter.serve() as url:
        yield adapter, engine, url


@pytest.fixture
async def sandbox():
    async with BwrapSandbox(REPO, wall_timeout=60.0) as sb:
        yield sb


def tool_results(chain) -> list[dict]:
    return [b for m in chain.messages if m["role"] == "user" and isinstance(m["content"], list)
            for b in m["content"] if b["type"] == "tool_result"]


def tool_calls(chain) -> list[tuple[str, dict]]:
    return [(b["name"], b["input"]) for m in chain.messages if m["role"] == "assistant"
            for b in m["content"] if b["type"] == "tool_use"]


def untimed(text: str) -> str:
    """unittest's output without its timing ("Ran 4 tests in 0.001s")."""
    return re.sub(r"in \d+\.\d+s", "in Xs", text)


def assert_turns_are_the_replies(segment, replies: list[str], tokenizer) -> None:
    """Each sampled turn is exactly a scripted reply's ids plus <|im_end|>, and only they
    carry loss_mask 1."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert [segment.token_ids[t.start:t.end] for t in segment.turns] == \
           [tokenizer.encode(r, add_special_tokens=False) + [end] for r in replies]
    assert sum(segment.loss_mask) == sum(t.end - t.start for t in segment.turns)


async def test_scripted_gold_fix_makes_the_tests_pass_in_one_segment(tokenizer, sandbox):
    assert (await sandbox.exec(TESTS)).rc != 0, "the task's tests must fail before the fix"
    (path, old, new), = GOLD
    replies = [call("read_file", path=path),
               tool_call_text("edit_file", {"path": path, "old": old, "new": new}, content="Found it: floor division."),
               call("run", command=TESTS),
               call("finish", summary="page_count rounds up now")]
    async with scripted_adapter(tokenizer, Script(*replies)) as (adapter, engine, _):
        run = await run_coding_agent(adapter, sandbox, TASK["prompt"], session_prefix="gold")
    state = run.state
    assert (state.finished, state.stop_reason, state.summary, state.main.turns) == \
           (True, "finish", "page_count rounds up now", 4)
    results = tool_results(state.main)
    assert results[1]["content"] == f"edited {path}" and not results[2].get("is_error")
    assert results[2]["content"].startswith("exit code 0\n") and results[2]["content"].rstrip().endswith("OK")
    assert (await sandbox.exec(TESTS)).rc == 0
    assert list(run.segments) == ["main"] and len(run.segments["main"]) == 1, \
        [s.started_because for s in run.segments["main"]]
    check_segments_against_engine(run.segments["main"], engine.calls)
    assert_turns_are_the_replies(run.segments["main"][0], replies, tokenizer)


async def test_tool_misuse_comes_back_as_error_results_and_the_loop_goes_on(tokenizer, sandbox):
    before = (sandbox.workdir / "pagination.py").read_text()
    replies = [call("read_file", path="missing.py"),
               call("edit_file", path="pagination.py", old="per_page", new="size"),
               call("edit_file", path="pagination.py"),
               call("run", command="sleep 5", timeout=0.5),
               call("delete_file", path="pagination.py"),
               call("run", command="seq 1 5000"),
               call("finish", summary="gave up")]
    config = AgentConfig(tool_output_chars=300)
    async with scripted_adapter(tokenizer, Script(*replies)) as (adapter, _, _):
        t0 = time.monotonic()
        run = await run_coding_agent(adapter, sandbox, TASK["prompt"], session_prefix="misuse", config=config)
    results = tool_results(run.state.main)
    errors = [(r.get("is_error", False), r["content"]) for r in results]
    assert errors[0] == (True, "no such file: missing.py")
    assert errors[1][0] and f"occurs {before.count('per_page')} times in pagination.py" in errors[1][1]
    assert errors[2] == (True, "edit_file: missing argument(s) old, new")
    assert errors[3][0] and errors[3][1].startswith("command timed out after 0.5 s")
    assert errors[4][0] and errors[4][1].startswith("unknown tool 'delete_file'")
    big = errors[5][1]
    assert not errors[5][0] and len(big) <= 300 and big.startswith("exit code 0\n1\n2\n")
    assert "characters cut" in big and big.endswith("4999\n5000\n")
    assert run.state.stop_reason == "finish" and run.state.main.turns == 7
    assert (sandbox.workdir / "pagination.py").read_text() == before
    assert time.monotonic() - t0 < 10
    assert len(run.segments["main"]) == 1


async def test_a_subagent_is_its_own_chain_and_session_and_its_summary_is_the_tool_result(tokenizer, sandbox):
    replies = [call("subagent", task="Run the tests and say which fail."),  # main
               call("run", command=TESTS),                                  # sub-1
               call("finish", summary="test_partial_last_page fails"),      # sub-1
               call("subagent", task="Look again."),                        # main: over max_subagents
               call("finish", summary="done")]                              # main
    async with scripted_adapter(tokenizer, Script(*replies)) as (adapter, engine, _):
        run = await run_coding_agent(adapter, sandbox, TASK["prompt"], session_prefix="r",
                                     config=AgentConfig(max_subagents=1))
    state = run.state
    assert list(state.chains) == ["main", "sub-1"] and state.subagents == 1
    sub = state.chains["sub-1"]
    assert (sub.session_id, sub.task, sub.turns, sub.stop_reason) == ("r/sub-1", "Run the tests and say which fail.",
                                                                       2, "finish")
    assert [c.session_id for c in engine.calls] == ["r/main", "r/sub-1", "r/sub-1", "r/main", "r/main"]
    main_results = tool_results(state.main)
    assert main_results[0]["content"] == "test_partial_last_page fails" and not main_results[0].get("is_error")
    assert main_results[1]["is_error"] and main_results[1]["content"].startswith("no more subagents")
    assert "FAILED" in tool_results(sub)[0]["content"]
    sub_prompt = engine.calls[1].prompt_ids
    assert '"name": "subagent"' not in tokenizer.decode(sub_prompt) and '"name": "run"' in tokenizer.decode(sub_prompt)
    assert {name: len(segs) for name, segs in run.segments.items()} == {"main": 1, "sub-1": 1}
    check_segments_against_engine(run.segments["main"] + run.segments["sub-1"], engine.calls)


async def test_compaction_replaces_the_history_with_a_summary_and_starts_a_new_segment(tokenizer, sandbox):
    (path, old, new), = GOLD
    summary = "pagination.py: page_count uses floor division; I changed it to round up."
    replies = [call("read_file", path=path),
               tool_call_text("edit_file", {"path": path, "old": old, "new": new}),
               summary,
               call("finish", summary="fixed")]
    messages, tools = to_chat({"system": DEFAULT_SYSTEM_PROMPT,
                               "messages": [{"role": "user", "content": TASK["prompt"]}],
                               "tools": tool_definitions(MAIN_TOOLS)})
    async with scripted_adapter(tokenizer, script := Script(*replies)) as (adapter, engine, _):
        first_prompt = adapter.core.count_tokens(messages, tools)
        config = AgentConfig(compact_at_tokens=first_prompt + 60)  # the file read pushes turn 2 over
        run = await run_coding_agent(adapter, sandbox, TASK["prompt"], session_prefix="compact", config=config)
    main = run.state.main
    assert (main.compactions, main.turns, main.stop_reason) == (1, 3, "finish")
    assert main.messages[:2] == [{"role": "user", "content": TASK["prompt"]},
                                 {"role": "user", "content": SUMMARY_PREFIX + summary}]
    assert COMPACT_PROMPT in script.prompts[2] and SUMMARY_PREFIX + summary in script.prompts[3]
    assert "<tool_response>" not in script.prompts[3]
    before, after = run.segments["main"]
    assert len(before.turns) == 3 and len(after.turns) == 1
    assert_turns_are_the_replies(before, replies[:3], tokenizer)
    assert after.started_because.startswith("prompt diverges from segment 0")
    check_segments_against_engine(run.segments["main"], engine.calls)


RESUME_REPLIES = [call("subagent", task="Run the tests."),
                  call("run", command=TESTS),
                  call("finish", summary="one test fails"),
                  call("read_file", path=GOLD[0][0]),
                  tool_call_text("edit_file", {"path": GOLD[0][0], "old": GOLD[0][1], "new": GOLD[0][2]}),
                  call("run", command=TESTS),
                  call("finish", summary="fixed")]


async def test_a_run_resumed_from_a_json_checkpoint_ends_as_an_uninterrupted_one(tokenizer):
    class Crash(Exception):
        pass

    async with BwrapSandbox(REPO) as sandbox, scripted_adapter(tokenizer, Script(*RESUME_REPLIES)) as (adapter, _, _):
        whole = (await run_coding_agent(adapter, sandbox, TASK["prompt"], session_prefix="whole")).state
        whole_file = (sandbox.workdir / GOLD[0][0]).read_text()

    checkpoints: list[str] = []

    def checkpoint(state: AgentState) -> None:
        checkpoints.append(json.dumps(state.to_dict()))
        if len(checkpoints) == 2:
            raise Crash

    async with BwrapSandbox(REPO) as sandbox, \
            scripted_adapter(tokenizer, Script(*RESUME_REPLIES)) as (adapter, engine, url):
        def open_chain(name: str) -> str:
            adapter.open_session(f"resumed/{name}")
            return f"resumed/{name}"

        with pytest.raises(Crash):
            await CodingAgent(sandbox, url, open_chain).run(AgentState.new(TASK["prompt"]), checkpoint)
        restored = AgentState.from_dict(json.loads(checkpoints[-1]))
        assert (restored.main.turns, restored.subagents, restored.stop_reason) == (2, 1, None)
        resumed = await CodingAgent(sandbox, url, open_chain).run(restored, checkpoint)
        segments = await adapter.finish_session("resumed/main")
        resumed_file = (sandbox.workdir / GOLD[0][0]).read_text()

    assert resumed is restored and len(checkpoints) == 5  # one per main step: 2, then 3 more
    assert (resumed.summary, resumed.stop_reason, resumed.main.turns, resumed.subagents) == \
           (whole.summary, whole.stop_reason, whole.main.turns, whole.subagents) == ("fixed", "finish", 5, 1)
    for name in ("main", "sub-1"):
        assert tool_calls(resumed.chains[name]) == tool_calls(whole.chains[name])
        assert [untimed(r["content"]) for r in tool_results(resumed.chains[name])] == \
               [untimed(r["content"]) for r in tool_results(whole.chains[name])]
    assert resumed_file == whole_file and len(segments) == 1 and len(engine.calls) == len(RESUME_REPLIES)


async def test_turn_limits_and_a_reply_without_tool_calls_stop_the_loop_with_the_reason(tokenizer, sandbox):
    forever = lambda prompt: call("run", command="true")  # noqa: E731
    async with scripted_adapter(tokenizer, forever) as (adapter, _, _):
        run = await run_coding_agent(adapter, sandbox, "loop", session_prefix="a", config=AgentConfig(max_turns=2))
    assert (run.state.stop_reason, run.state.main.turns, run.state.finished) == ("max_turns", 2, False)

    async with scripted_adapter(tokenizer, forever, max_turns=3) as (adapter, _, _):
        run = await run_coding_agent(adapter, sandbox, "loop", session_prefix="b", config=AgentConfig(max_turns=10))
    assert (run.state.stop_reason, run.state.main.turns) == ("rejected", 3)
    assert "max_turns" in run.state.main.error

    async with scripted_adapter(tokenizer, Script("I cannot fix this.")) as (adapter, _, _):
        run = await run_coding_agent(adapter, sandbox, "talk", session_prefix="c")
    assert (run.state.stop_reason, run.state.summary, run.state.finished) == \
           ("no_tool_call", "I cannot fix this.", False)


async def test_scripted_engine_cuts_a_reply_at_max_tokens(tokenizer):
    engine = ScriptedEngine(tokenizer, lambda prompt: "a reply of several tokens, longer than four")
    prompt = tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    whole = await engine.generate(prompt)
    cut = await engine.generate(prompt, {"max_tokens": 4})
    assert whole.finish_reason == "stop" and whole.token_ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert cut.finish_reason == "length" and cut.token_ids == whole.token_ids[:4] and cut.log_probs == [0.0] * 4


# ---- Claude Code, unmodified, in a network=True sandbox ---------------------------------------------------------

def processes_mentioning(marker: str) -> list[int]:
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes() and int(entry) != os.getpid():
                pids.append(int(entry))
    return pids


needs_claude = pytest.mark.skipif(not claude_code_available(), reason="Claude Code not installed (scripts/setup.sh)")


@needs_claude
async def test_claude_code_runs_its_tools_in_the_sandbox_against_the_adapter(tokenizer):
    """A scripted model makes Claude Code call its Bash tool: the command runs in the sandbox
    as uid 65534, and the CLI's requests reach the adapter on the host's loopback."""
    def policy(prompt: str) -> str:
        if "<tool_response>" in prompt.rsplit("<|im_start|>user", 1)[-1]:
            return "Done."
        return tool_call_text("Bash", {"command": "echo hello > hello.txt && id -u", "description": "Write the file"})

    async with scripted_adapter(tokenizer, policy) as (adapter, engine, url):
        async with BwrapSandbox(REPO, network=True, ro_binds=claude_code_binds()) as sandbox:
            root = sandbox.root
            adapter.open_session("claude-scripted")
            result = await run_claude_code(sandbox, url, "claude-scripted", "Write hello to hello.txt",
                                           timeout=120, max_turns=4)
            written = (sandbox.workdir / "hello.txt").read_text()
        segments = await adapter.finish_session("claude-scripted")
    assert result.ok, (result.rc, result.result, result.stderr_tail)
    assert result.result["result"] == "Done." and written == "hello\n"
    assert "<tool_response>\n65534\n</tool_response>" in tokenizer.decode(segments[-1].token_ids)
    check_segments_against_engine(segments, engine.calls)
    assert not root.exists() and processes_mentioning(str(root)) == []


def stop_at_word_boundaries(tokenizer) -> dict:
    """Short seeded turns that end by themselves (see tests/test_agent_clis.py)."""
    ends = sorted(i for piece, i in tokenizer.get_vocab().items() if "\u0120" in piece or "\u010a" in piece)
    return {"max_tokens": 32, "seed": 0, "stop_token_ids": [tokenizer.eos_token_id, *ends]}


@needs_claude
@pytest.mark.vllm
async def test_claude_code_in_the_sandbox_against_vllm_exports_its_trajectory(tokenizer, long_context_server):
    engine = RecordingEngineClient(long_context_server.url, timeout=600.0)
    adapter = AnthropicAdapter(tokenizer, long_context_server.url, engine=engine, max_turns=16)
    answered: list[int] = []

    async def on_prepare(request, response) -> None:
        answered.append(response.status)

    adapter.app.on_response_prepare.append(on_prepare)
    try:
        async with adapter.serve() as url, BwrapSandbox(REPO, network=True, ro_binds=claude_code_binds()) as sandbox:
            root = sandbox.root
            adapter.open_session("claude-vllm", sampling_defaults=stop_at_word_boundaries(tokenizer))
            result = await run_claude_code(sandbox, url, "claude-vllm", "Say hi", timeout=240, max_turns=2)
            segments = await adapter.finish_session("claude-vllm")
    finally:
        await engine.close()
    assert not result.timed_out and result.rc is not None and result.result is not None, result
    assert result.result.get("terminal_reason") != "api_error", result.result
    assert answered and all(status < 400 for status in answered), answered
    assert engine.calls and segments
    check_segments_against_engine(segments, engine.calls)
    assert not root.exists() and processes_mentioning(str(root)) == []
