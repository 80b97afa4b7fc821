"""Pass rate of coding-agent checkpoints on a task set (held-out or training tasks).

    python -m examples.coding_agent_rl.evaluate --tasks-file prompts.jsonl --n 8 MODEL [MODEL ...]

The Temporal training loop does not evaluate (`--eval-interval` is read, not acted on, by the
training workflow), so the example evaluates what the run saved: the SFT model and every
`--save` checkpoint. Each model gets its own vLLM server and runs the same agent, sandbox,
sampling and grading as a training rollout (the coding agent's `generate` hook), `n` times per
task; the pass rate is the mean 0/1 reward. One server per model costs ~30 s of start-up,
cheaper here than syncing weights into a running one, and keeps checkpoints independent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from vime.config.args import parse_args
from vime.engine.server import VLLMServer
from vime.types import Sample

from vime.agent.shared_adapter import close_shared_adapters
from vime.envs.coding_agent.generate import generate


@dataclass
class EvalResult:
    """Per task, the 0/1 rewards of its `n` attempts."""

    model: str
    rewards: dict[str, list[float]] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    """How the attempts ended: the grade's outcome (`passed`, `failed`, ...), counted."""

    @property
    def pass_rate(self) -> float:
        flat = [r for rs in self.rewards.values() for r in rs]
        return sum(flat) / len(flat) if flat else 0.0

    def per_task(self) -> dict[str, float]:
        return {t: sum(rs) / len(rs) for t, rs in self.rewards.items()}


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def _attempts(args, records: list[dict], n: int, concurrency: int) -> EvalResult:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, k: int, rec: dict) -> tuple[str, float, str]:
        sample = Sample(group_index=i, index=i * n + k, rollout_id=f"eval-{i}-{k}", prompt=rec["prompt"],
                        label=rec.get("label"), metadata=dict(rec.get("metadata") or {}))
        async with gate:
            out = await generate(args, sample, {})
        last = out[-1]
        reward = last.reward if isinstance(last.reward, (int, float)) else 0.0
        outcome = (last.metadata.get("grade") or {}).get("outcome") or str(last.status.value)
        return rec["metadata"].get("task_id") or str(rec.get("label")), float(reward), outcome

    try:
        results = await asyncio.gather(*(one(i, k, r) for i, r in enumerate(records) for k in range(n)))
    finally:
        await close_shared_adapters()
    result = EvalResult(str(args.hf_checkpoint))
    for task_id, reward, outcome in results:
        result.rewards.setdefault(task_id, []).append(reward)
        result.outcomes[outcome] = result.outcomes.get(outcome, 0) + 1
    return result


def evaluate(model: str | Path, sets: dict[str, Path], agent_flags: list[str], n: int | dict[str, int] = 8,
             concurrency: int = 8,
             log_path: Path | None = None) -> dict[str, EvalResult]:
    """`model`'s pass rate on every record of each prompt file in `sets` (n attempts each),
    through one vLLM server; `agent_flags` are the run's `--agent-*`/`--rollout-*`/`--sandbox-*`
    flags, so an eval attempt is a training rollout without the update."""
    log_path = log_path or Path(model) / "eval-vllm.log"
    out = {}
    with VLLMServer(model, server_args=["--max-model-len", "2048"], log_path=log_path) as server:
        for name, prompts in sets.items():
            args = parse_args(["--hf-checkpoint", str(model), "--prompt-data", str(prompts), *agent_flags,
                               "--vllm-router-ip", server.host, "--vllm-router-port", str(server.port)])
            attempts = n[name] if isinstance(n, dict) else n
            out[name] = asyncio.run(_attempts(args, _records(prompts), attempts, concurrency))
    return out


def describe(result: EvalResult) -> str:
    tasks = " ".join(f"{t}={p:.2f}" for t, p in result.per_task().items())
    return f"pass rate {result.pass_rate:.3f}; outcomes {result.outcomes}; per task {tasks}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="HF model directories (the SFT model, checkpoints)")
    parser.add_argument("--tasks-file", required=True, type=Path, help="prompt file (write_prompts' format)")
    parser.add_argument("--n", type=int, default=8, help="attempts per task")
    parser.add_argument("--temperature", default="1.0")
    opts = parser.parse_args(argv)
    flags = ["--rollout-env", "coding_agent", "--sandbox-backend", "bwrap", "--agent-max-turns", "4",
             "--agent-max-tokens", "160", "--agent-command-timeout", "30", "--rollout-temperature", opts.temperature]
    for model in opts.models:
        result = evaluate(model, {"eval": opts.tasks_file}, flags, n=opts.n)["eval"]
        print(f"{model}: {describe(result)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
