"""Synthetic SFT traces: the built-in agent solving each task with the gold fix, as training data.

    python -m examples.coding_agent_rl.sft_traces --hf-checkpoint MODEL --out traces.jsonl

A randomly initialised model never emits a well-formed tool call, so RL on it sees reward 0
everywhere and learns nothing. The warm start shows it the format: each trace is the real
agent loop (`run_coding_agent`) through the real adapter and a real sandbox, with a scripted
policy (`ScriptedEngine`) that answers with the task's gold edits as `edit_file` calls and then
`finish`. The adapter records the trace exactly as it records a sampled session (same system
prompt, tool block and chat template), so SFT trains the tokens an RL rollout will sample;
each trace is checked by running the task's tests in the sandbox before it is kept.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from examples.coding_agent_rl.gold_edits import gold_edits
from examples.coding_agent_rl.tasks.prepare import CodingTask, load_tasks
from vime.agent.adapters import AnthropicAdapter
from vime.envs.coding_agent.agent import AgentConfig, run_coding_agent
from vime.agent.fanout import trajectory_to_samples
from vime.sandbox import make_sandbox
from vime.testing.scripted import ScriptedEngine, tool_call_text


def _gold_policy(task: CodingTask):
    replies = [tool_call_text("edit_file", e.arguments()) for e in gold_edits(task)]
    replies.append(tool_call_text("finish", {"summary": "Fixed."}))
    step = iter(replies)
    return lambda prompt: next(step)


async def trace_task(tokenizer: Any, task: CodingTask, config: AgentConfig) -> list[dict]:
    """The gold trace of `task` as `Sample.to_dict()`s, after checking that it fixes the task."""
    adapter = AnthropicAdapter(tokenizer, "http://scripted", engine=ScriptedEngine(tokenizer, _gold_policy(task)),
                               max_context_tokens=65536)
    async with adapter.serve():
        async with make_sandbox("bwrap", repo_dir=task.repo) as sbx:
            run = await run_coding_agent(adapter, sbx, task.prompt, session_prefix=task.task_id, config=config)
            check = await sbx.exec("/usr/bin/python3 " + task.test_command.removeprefix("python "), timeout=60)
    if not run.state.finished or not check.ok:
        raise RuntimeError(f"gold trace of {task.task_id} does not solve it: {run.state.stop_reason}, "
                           f"tests rc {check.rc}: {(check.stderr or check.stdout)[-300:]}")
    samples = trajectory_to_samples(run.segments, rollout_id=task.task_id, reward=1.0, tokenizer=tokenizer)
    return [s.to_dict() for s in samples]


async def write_traces(model: str, out: Path, tasks: list[CodingTask], config: AgentConfig | None = None,
                       repeat: int = 1) -> int:
    """Write every task's trace (`repeat` copies) to `out` as JSONL; returns the sample count."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rows = []
    for task in tasks:
        rows += await trace_task(tokenizer, task, config or AgentConfig())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for _ in range(repeat):
            for row in rows:
                f.write(json.dumps(row) + "\n")
    tmp.replace(out)
    return len(rows) * repeat


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf-checkpoint", required=True, help="model whose tokenizer renders the traces")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tasks", default=None, help="tasks.jsonl (default: the shipped task set)")
    opts = parser.parse_args(argv)
    tasks = load_tasks(opts.tasks) if opts.tasks else load_tasks()
    n = asyncio.run(write_traces(opts.hf_checkpoint, opts.out, tasks))
    print(f"wrote {n} trace samples for {len(tasks)} tasks to {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
