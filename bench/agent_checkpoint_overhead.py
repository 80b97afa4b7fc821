"""What durability costs an agent session: steps with and without a per-step checkpoint.

    python bench/agent_checkpoint_overhead.py [--steps 12] [--repeats 3]

The same scripted session (read a file, run the tests, edit, run them again, ... then finish)
runs in a bubblewrap sandbox through the real adapter twice per repeat, alternating: once
plain, once storing a checkpoint after every step the way the `agent_session` activity does
(`capture_diff` in the sandbox + `TrajectoryRecorder.save` into SQLite). A scripted engine
stands in for vLLM so the model's time does not hide the checkpoint's; with a real model each
step also waits for sampling, so the ratio here is an upper bound. Prints ms per step for both,
the difference and the ratio.

A session that does not finish (the agent stopped early, a step raised) is not a timing: the
script then prints one line naming how many sessions failed and the first error, prints no
figures and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from examples.coding_agent_rl.gold_edits import gold_edits  # noqa: E402
from examples.coding_agent_rl.tasks.prepare import load_tasks  # noqa: E402
from vime.agent.adapters import AnthropicAdapter  # noqa: E402
from vime.envs.coding_agent.agent import AgentConfig, AgentState, CodingAgent  # noqa: E402
from vime.agent.recorder import TrajectoryRecorder  # noqa: E402
from vime.sandbox import make_sandbox  # noqa: E402
from vime.sandbox.git import capture_diff, init_base  # noqa: E402
from vime.log import configure_logging  # noqa: E402
from vime.store import SampleStore  # noqa: E402
from vime.testing.scripted import ScriptedEngine, tool_call_text  # noqa: E402


def script(task, steps: int) -> list[str]:
    edit = gold_edits(task)[0]
    replies = [tool_call_text("read_file", {"path": edit.path})]
    while len(replies) < steps - 2:
        replies.append(tool_call_text("run", {"command": "python3 -m unittest -q"}))
    replies += [tool_call_text("edit_file", edit.arguments()), tool_call_text("finish", {"summary": "done"})]
    return replies


async def session(tokenizer, task, steps: int, store: SampleStore | None, rollout: str) -> float:
    """Seconds per step of one session; with `store`, a checkpoint after every step."""
    replies = iter(script(task, steps))
    adapter = AnthropicAdapter(tokenizer, "http://scripted", engine=ScriptedEngine(tokenizer, lambda _: next(replies)),
                               max_context_tokens=65536)
    async with adapter.serve() as url, make_sandbox("bwrap", repo_dir=task.repo) as sbx:
        await init_base(sbx)
        recorder = TrajectoryRecorder(store, "bench", rollout) if store else None
        sessions: dict[str, str] = {}

        def open_chain(name: str) -> str:
            sessions[name] = f"{rollout}/{name}"
            adapter.open_session(sessions[name])
            return sessions[name]

        async def on_step(state: AgentState) -> None:
            if recorder is not None:
                chains = {n: adapter.core.session_segments(s) for n, s in sessions.items()}
                recorder.save(chains, state.to_dict(), await capture_diff(sbx))

        t0 = time.perf_counter()
        state = await CodingAgent(sbx, url, open_chain, AgentConfig(max_turns=steps + 1)).run(AgentState.new(task.prompt),
                                                                                            on_step)
        elapsed = time.perf_counter() - t0
        if not state.finished:
            raise SessionFailed(f"session {rollout} stopped before finishing: {state.stop_reason}")
    return elapsed / steps


class SessionFailed(Exception):
    """A benchmark session that did not finish its script."""


@dataclass
class Failures:
    sessions: int = 0
    failed: int = 0
    first: str | None = None

    async def timed(self, run) -> float | None:
        """`await run` (seconds per step), or None after recording why it failed."""
        self.sessions += 1
        try:
            return await run
        except Exception as e:  # noqa: BLE001 - any failed session voids the figures; reported in one line
            self.failed += 1
            self.first = self.first or " ".join(f"{type(e).__name__}: {e}".split())[:400]
            return None


async def main(steps: int, repeats: int) -> int:
    from transformers import AutoTokenizer

    from vime.testing.tiny_model import tiny_model_dir

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir())
    task = load_tasks()[0]
    plain, durable, failures = [], [], Failures()
    with tempfile.TemporaryDirectory() as tmp, SampleStore.open(tmp) as store:
        store.ensure_run("bench")
        await failures.timed(session(tokenizer, task, steps, None, "warmup"))
        for i in range(repeats):
            plain.append(await failures.timed(session(tokenizer, task, steps, None, f"p{i}")))
            durable.append(await failures.timed(session(tokenizer, task, steps, store, f"d{i}")))
    if failures.failed:
        print(f"agent_checkpoint_overhead: FAILED: {failures.failed} of {failures.sessions} sessions failed; "
              f"first error: {failures.first}; no figures printed", file=sys.stderr)
        return 1
    p, d = statistics.median(plain) * 1e3, statistics.median(durable) * 1e3
    print(f"agent step ({steps} steps x {repeats} sessions, median): plain {p:.1f} ms, "
          f"checkpointed {d:.1f} ms, +{d - p:.1f} ms per step, ratio x{d / p:.2f}")
    return 0


if __name__ == "__main__":
    configure_logging(level="WARNING")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args()
    sys.exit(asyncio.run(main(opts.steps, opts.repeats)))
