"""Many quickstarts on one machine, a few at a time: does the whole stack hold up under load?

    .venv/bin/python bench/quickstart_soak.py [--runs 20] [--parallel 2] [--out runs/soak]

Each run is `python -m examples.quickstart.run` with its own run directory: its own Temporal dev
server, vLLM server, workers and trainer. A run passes when it exits 0, its mean reward over the
last 3 steps is >= 0.9, no vLLM engine crashed (no `CPU Generator does not use offset`, no
restarted server) and nothing of it is left running. Prints one line per run and the tally; exits
1 when any run failed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vime.procs import leftover_processes  # noqa: E402

CRASH = "CPU Generator does not use offset"


@dataclass
class Outcome:
    index: int
    ok: bool
    seconds: float
    reward: float | None
    why: str


def one(index: int, out: Path) -> Outcome:
    run_dir = out / f"quickstart-{index:02d}"
    t0 = time.monotonic()
    with open(out / f"quickstart-{index:02d}.out", "w") as console:
        proc = subprocess.run([sys.executable, "-m", "examples.quickstart.run", "--run-dir", str(run_dir)],
                              cwd=REPO, stdout=console, stderr=subprocess.STDOUT, timeout=3600)
    seconds = time.monotonic() - t0
    text = (out / f"quickstart-{index:02d}.out").read_text(errors="replace")
    logs = "".join(p.read_text(errors="replace") for p in run_dir.glob("vllm-*.log"))
    summary = run_dir / "summary.txt"
    match = re.search(r"-> ([0-9.]+) over the last 3", summary.read_text()) if summary.exists() else None
    reward = float(match.group(1)) if match else None
    problems = []
    if proc.returncode != 0:
        problems.append(f"exit code {proc.returncode}")
    if CRASH in logs:
        problems.append("a vLLM engine crashed")
    if re.search(r"vLLM server \d+ .* died", text):
        problems.append("a vLLM server died and was restarted")
    if reward is None or reward < 0.9:
        problems.append(f"mean reward {reward} < 0.9")
    if leftover_processes(run_dir):
        problems.append("processes left running")
    return Outcome(index, not problems, seconds, reward, "; ".join(problems) or "ok")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--out", default=str(REPO / "runs" / time.strftime("soak-%Y%m%d-%H%M%S")))
    opts = parser.parse_args()
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"soak: {opts.runs} quickstarts, {opts.parallel} at a time, in {out}", flush=True)
    outcomes = []
    with ThreadPoolExecutor(opts.parallel) as pool:
        for outcome in pool.map(lambda i: one(i, out), range(opts.runs)):
            outcomes.append(outcome)
            print(f"run {outcome.index:2d}: {'PASS' if outcome.ok else 'FAIL'} in {outcome.seconds:.0f} s, "
                  f"final reward {outcome.reward}: {outcome.why}", flush=True)
    passed = sum(o.ok for o in outcomes)
    times = sorted(o.seconds for o in outcomes)
    print(f"soak: {passed}/{len(outcomes)} passed; run time median {times[len(times) // 2]:.0f} s, "
          f"max {times[-1]:.0f} s", flush=True)
    return 0 if passed == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
