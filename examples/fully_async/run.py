"""The quickstart's task in fully async mode: rollouts never wait for the trainer, nor for each other.

    python -m examples.fully_async.run [vime flags that override the defaults below]

The same tiny model, prompts and reward as `examples.quickstart`, with `--fully-async`: the
training workflow keeps `--max-concurrent-rollouts` prompt groups generating at all times and
builds each step from the first `--rollout-batch-size` groups to finish, at most
`--max-staleness` weight versions behind the trainer (`--use-tis` corrects for the lag).
Upstream's spelling of the mode works too: add
`--rollout-function-path vime.rollout.fully_async_rollout.generate_rollout_fully_async`.
Writes `reward_curve.png`, `summary.json` and `summary.txt` to the run directory.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

from examples.quickstart.run import default_flags, prepare, summarize
from vime.errors import VimeError
from vime.log import configure_logging
from vime.config.preflight import checked_args

ASYNC_FLAGS = ["--fully-async", "--max-staleness", "1", "--max-concurrent-rollouts", "8", "--use-tis"]


def main(argv: list[str] | None = None) -> int:
    configure_logging(level="WARNING")
    argv = list(sys.argv[1:] if argv is None else argv)
    run_dir, model = prepare(argv, "fully_async")
    try:
        args = checked_args(default_flags(run_dir, model) + ASYNC_FLAGS + argv)
    except VimeError as e:
        print(f"fully_async: error: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    resume = shlex.join([sys.executable, "-m", "examples.fully_async.run", *argv,
                         *([] if "--run-dir" in argv else ["--run-dir", str(run_dir)])])
    from vime.launcher.launch import run_to_end  # after the checks: torch, vLLM and Temporal load here

    code, state = run_to_end(args, resume, checked=True)
    if state is None:
        return code
    stale = [m.get("staleness_mean", 0.0) for m in state.metrics]
    dropped = sum(m.get("dropped_groups", 0) for m in state.metrics)
    summarize("fully_async", Path(args.run_dir), state.metrics, time.monotonic() - t0,
              f", mean staleness {sum(stale) / len(stale):.2f}, {dropped} groups dropped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
