"""The quickstart's toy task through `vime train` and through TRL's GRPOTrainer, side by side.

    .venv/bin/python bench/toy_vs_trl.py [--steps 24] [--repeats 1] [--out DIR]

Needs TRL (a bench dependency, not a runtime one): `.venv/bin/pip install -e '.[bench]'`.

Both sides train the tiny test model (`tiny_model_dir()`, no downloads) on the quickstart's
prompts (chat messages, chat template applied) with the quickstart's reward
(`examples.quickstart.reward.capitals`, called as it is from TRL's completion ids): 8 prompts x
8 samples per step, at most 16 new tokens, temperature 1.0, GRPO, AdamW lr 1e-2, beta2 0.99, one
optimizer step per rollout batch, the same number of steps. Each side runs as a user would run
it, in its own process: vime as `python -m examples.quickstart.run` (its own Temporal, vLLM
server and workers), TRL as this script with `--trl-only`. Runs alternate (vime, TRL, vime, ...)
so drifting machine load hits both.

Printed for each: steps to a mean reward (over the step's 64 samples) of 0.9, seconds from the
first rollout to that step's end, median seconds per step (between step ends), and seconds from
process launch to the end of step 1; then vime/TRL ratios next to the goals of issue #10.

TRL settings that differ from its defaults, to match vime's: loss_type "grpo" (vime's loss is the
mean over samples of each sample's token mean; TRL's default "dapo" averages over all tokens),
scale_rewards "group" (vime divides by the group std unless --disable-grpo-std-normalization),
beta 0 (no reference model, vime's default), constant LR (vime's default; TRL's is linear decay),
fp32 (vime's CPU trainer; TRL defaults to bf16), no gradient checkpointing, logging every step.
What still differs, and why it stays: TRL generates with transformers' `generate` inside the
trainer (use_vllm=False: TRL's vLLM modes are built for GPUs, server mode sending weights over
NCCL, colocate mode sharing the training GPUs), while vime samples from a vLLM CPU server and
syncs weights into it after each step; that difference is what this bench measures. TRL adds 1e-4
to the group std, vime 1e-6 (neither is a flag). Samplers and seeds differ, so reward curves
agree only statistically: use --repeats for steps-to-0.9. vime gets `--save-interval STEPS`
(one checkpoint, after the last step is timed) and TRL saves nothing, so neither pays for
checkpoints inside the figures.

A run that failed (non-zero exit, missing steps, or vime samples stored with errors) fails the
bench: one line, no figures, exit 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TARGET = 0.9
INSTALL = ".venv/bin/pip install -e '.[bench]'  (TRL 1.16.0)"
GOAL_STEP_TIME, GOAL_STEPS, GOAL_LAUNCH = 1.5, 1.1, 45.0


class BenchFailed(Exception):
    """A run failed; the message names the run and where its console output is."""


@dataclass
class RunFigures:
    """One run: per-step mean reward and wall-clock step ends (`time.time()` on this machine),
    when its first rollout began, and seconds from process launch to the end of step 1."""

    rewards: list[float]
    step_ends: list[float]
    first_rollout: float
    launch_to_first_step: float

    @property
    def steps_to_target(self) -> int | None:
        return next((i + 1 for i, r in enumerate(self.rewards) if r >= TARGET), None)

    @property
    def seconds_to_target(self) -> float | None:
        n = self.steps_to_target
        return None if n is None else self.step_ends[n - 1] - self.first_rollout

    @property
    def median_step(self) -> float:
        return statistics.median(b - a for a, b in zip(self.step_ends, self.step_ends[1:]))


def run_vime(run_dir: Path, steps: int) -> RunFigures:
    """The quickstart as a user starts it; launch-to-first-step ends at its "] step 1/" line."""
    from vime.store import SampleStore

    argv = [sys.executable, "-m", "examples.quickstart.run", "--run-dir", str(run_dir), "--num-rollout", str(steps),
            "--save-interval", str(steps)]
    console = run_dir.with_suffix(".out")
    first_step = None
    launched = time.time()
    with open(console, "w") as log, subprocess.Popen(argv, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        for line in p.stdout:
            if first_step is None and "] step 1/" in line:
                first_step = time.time()
            log.write(line)
    if p.returncode != 0 or first_step is None:
        raise BenchFailed(f"the vime run exited {p.returncode}; see {console}")
    metrics = sorted(json.loads((run_dir / "summary.json").read_text())["metrics"], key=lambda m: m["step"])
    with SampleStore.open(run_dir) as store:
        manifests = [store.read_step_manifest(run_dir.name, s) for s in range(steps)]
    errors = sum(m.meta.get("errors", 0) for m in manifests if m is not None)
    if errors or any(m is None for m in manifests) or len(metrics) != steps:
        raise BenchFailed(f"the vime run stored {errors} failed samples or is missing steps "
                          f"({len(metrics)}/{steps} in summary.json); see {console}")
    m0 = metrics[0]
    first_rollout = m0["finished_at"] - m0["rollout_wait_seconds"] - m0["train_phase_seconds"] - m0["sync_seconds"]
    return RunFigures([m["reward_mean"] for m in metrics], [m["finished_at"] for m in metrics], first_rollout,
                      first_step - launched)


def run_trl(run_dir: Path, steps: int) -> RunFigures:
    """This script with --trl-only in a fresh process; its callback's JSON lines give the figures."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--trl-only", "--out", str(run_dir), "--steps", str(steps)]
    console = run_dir.with_suffix(".out")
    launched = time.time()
    with open(console, "w") as log:
        code = subprocess.run(argv, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
                              stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    events = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()] \
        if (run_dir / "steps.jsonl").exists() else []
    logged = [e for e in events if "reward" in e]
    begin = next((e["t"] for e in events if e.get("event") == "begin"), None)
    if code != 0 or len(logged) != steps or begin is None:
        raise BenchFailed(f"the TRL run exited {code} after {len(logged)}/{steps} logged steps; see {console}")
    return RunFigures([e["reward"] for e in logged], [e["t"] for e in logged], begin, logged[0]["t"] - launched)


def trl_train(out: Path, steps: int) -> int:
    """The TRL side, run in its own process: GRPOTrainer on the quickstart's task, on CPU, with a
    callback that appends {"event": "begin", "t"} before step 1's generation and {"step", "t",
    "reward"} after each step to OUT/steps.jsonl."""
    import asyncio
    from types import SimpleNamespace

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from examples.quickstart.reward import capitals
    from examples.quickstart.run import write_prompts
    from vime.testing.tiny_model import tiny_model_dir

    model = str(tiny_model_dir())
    out.mkdir(parents=True, exist_ok=True)
    write_prompts(out / "prompts.jsonl")
    dataset = Dataset.from_list([json.loads(line) for line in (out / "prompts.jsonl").read_text().splitlines()])
    rm_args = SimpleNamespace(hf_checkpoint=model)

    async def capitals_reward(prompts: list, completions: list, completion_ids: list[list[int]],
                              **kwargs: Any) -> list[float]:
        """The quickstart's reward on TRL's completion ids (the sampled tokens, EOS included, as in vime)."""
        samples = [SimpleNamespace(tokens=list(ids), response_length=len(ids)) for ids in completion_ids]
        return list(await asyncio.gather(*(capitals(rm_args, s) for s in samples)))

    class StepLog(TrainerCallback):
        def _write(self, record: dict) -> None:
            with open(out / "steps.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 0:
                self._write({"event": "begin", "t": time.time()})

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
            if logs and logs.get("reward") is not None:
                self._write({"step": state.global_step, "t": time.time(), "reward": logs["reward"]})

    config = GRPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, fp16=False, model_init_kwargs={"dtype": "float32"},
        max_steps=steps, per_device_train_batch_size=64, gradient_accumulation_steps=1, num_generations=8,
        max_completion_length=16, temperature=1.0, top_p=1.0, top_k=0, use_vllm=False, shuffle_dataset=True,
        learning_rate=1e-2, adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0,
        lr_scheduler_type="constant", warmup_steps=0, gradient_checkpointing=False,
        beta=0.0, epsilon=0.2, num_iterations=1, loss_type="grpo", scale_rewards="group",
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True,
    )
    GRPOTrainer(model=model, reward_funcs=[capitals_reward], args=config, train_dataset=dataset,
                callbacks=[StepLog()]).train()
    return 0


def fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def median(values: list[float | None]) -> float | None:
    """Median over repeats; None if any repeat never reached the target."""
    return None if any(v is None for v in values) else statistics.median(values)  # type: ignore[arg-type]


def report(vime: list[RunFigures], trl: list[RunFigures], steps: int) -> None:
    """Per-run lines, then medians over repeats with vime/TRL ratios and the goals."""
    for name, runs in (("vime", vime), ("TRL", trl)):
        for i, r in enumerate(runs, 1):
            reached = (f"{TARGET} at step {r.steps_to_target}, {fmt(r.seconds_to_target)} s after the first rollout"
                       if r.steps_to_target else f"{TARGET} not reached")
            print(f"{name:>4} #{i}: reward {r.rewards[0]:.2f} at step 1 -> {sum(r.rewards[-3:]) / 3:.2f} over the "
                  f"last 3; {reached}; median {r.median_step:.2f} s/step; launch to step 1 "
                  f"{r.launch_to_first_step:.1f} s", flush=True)
    rows = [
        ("steps to mean reward 0.9", "steps_to_target", "g", f"<= {GOAL_STEPS}x", GOAL_STEPS),
        ("s from first rollout to 0.9", "seconds_to_target", ".1f", "", None),
        ("median s/step", "median_step", ".2f", f"<= {GOAL_STEP_TIME}x", GOAL_STEP_TIME),
        ("launch to first step (s)", "launch_to_first_step", ".1f", f"vime <= {GOAL_LAUNCH:.0f} s", None),
    ]
    print(f"\n{'median of ' + str(len(vime)) + ' repeat(s), ' + str(steps) + ' steps':<34}{'vime':>8}{'TRL':>8}"
          f"{'vime/TRL':>10}  goal")
    for label, attr, spec, goal, bound in rows:
        v, t = median([getattr(r, attr) for r in vime]), median([getattr(r, attr) for r in trl])
        ratio = None if v is None or t is None or t == 0 else v / t
        if attr == "launch_to_first_step":
            verdict = "met" if v is not None and v <= GOAL_LAUNCH else "missed"
        elif bound is None:
            verdict = ""
        elif ratio is None:  # vime never reached 0.9: missed; only TRL never did: no ratio to judge
            verdict = "missed" if v is None else "n/a"
        else:
            verdict = "met" if ratio <= bound else "missed"
        print(f"{label:<34}{fmt(v, spec):>8}{fmt(t, spec):>8}{fmt(ratio, '.2f'):>10}  {goal} {verdict}".rstrip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=24, help="training steps of each run")
    parser.add_argument("--repeats", type=int, default=1, help="vime/TRL pairs, run alternately")
    parser.add_argument("--out", default=str(REPO / "runs" / time.strftime("toy-vs-trl-%Y%m%d-%H%M%S")))
    parser.add_argument("--trl-only", action="store_true", help=argparse.SUPPRESS)  # the TRL child process
    opts = parser.parse_args()
    out = Path(opts.out)
    if importlib.util.find_spec("trl") is None:
        print(f"toy_vs_trl: TRL is not installed; install the bench extra: {INSTALL}", file=sys.stderr)
        return 2
    if opts.trl_only:
        return trl_train(out, opts.steps)
    if opts.steps < 2:
        parser.error("--steps must be >= 2 (s/step needs two step ends)")

    from importlib.metadata import version

    from vime.testing.tiny_model import tiny_model_dir

    tiny_model_dir()  # built once here, so neither run's launch pays for the build
    out.mkdir(parents=True, exist_ok=True)
    print(f"toy_vs_trl: {opts.steps} steps x {opts.repeats} repeat(s) each of vime and TRL {version('trl')} "
          f"(8 prompts x 8 samples, 16 new tokens); runs and logs in {out}", flush=True)
    vime: list[RunFigures] = []
    trl: list[RunFigures] = []
    try:
        for i in range(1, opts.repeats + 1):
            print(f"toy_vs_trl: repeat {i}/{opts.repeats}: vime ...", flush=True)
            vime.append(run_vime(out / f"vime-{i}", opts.steps))
            print(f"toy_vs_trl: repeat {i}/{opts.repeats}: TRL ...", flush=True)
            trl.append(run_trl(out / f"trl-{i}", opts.steps))
    except BenchFailed as e:
        print(f"toy_vs_trl: FAILED: {e}", flush=True)
        return 1
    report(vime, trl, opts.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
