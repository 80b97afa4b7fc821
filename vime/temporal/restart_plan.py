"""What starting a stopped, failed or cancelled run again really does, in words, for the lines
`vime cancel`, `vime status` and `vime train` print when a run ends short (here, below both the
launcher and the ops commands, beside the training workflow's other contracts).

A start of `train-<run>` (the same `vime train` command, or `temporal workflow start` with the
run's `vime config` JSON) reads what the store recorded of the run (`workflows/durable_start.py`):
the trainer loads the newest checkpoint the store records (none without `--save`: the base
weights), the steps recorded after it train again on their stored rollouts (nothing is sampled
twice), and sampling goes on after the last recorded step. So a run without `--save` does not
come back "from its last checkpoint": it retrains every recorded step from the base weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RESTART = "the same command (or `temporal workflow start` with its `vime config` JSON)"


@dataclass
class Recorded:
    """What the store holds of a run that a restart reads."""

    trained_steps: int
    checkpoint_step: int | None  # the newest checkpoint the store records; None: none (no --save)


def restart_plan(r: Recorded | None) -> str:
    """One clause: what a start of the run again will do, from what the store records."""
    return f"{RESTART} starts it again {restart_point(r)}"


def restart_point(r: Recorded | None) -> str:
    """Where a start of the run again begins: `from its checkpoint after step 4, retrains ...`."""
    if r is None:  # the store could not be read here: the rule, without the numbers
        return ("from the newest checkpoint its store records (the base weights without --save), retraining the "
                "recorded steps after it on their stored rollouts")
    if r.trained_steps == 0:
        return "from scratch (no step was trained)"
    if r.checkpoint_step is None:
        return (f"from the base weights (no checkpoint: it ran without --save) and retrains the "
                f"{_steps(r.trained_steps)} recorded on their stored rollouts, then samples on")
    again = r.trained_steps - r.checkpoint_step
    return (f"from its checkpoint after step {r.checkpoint_step}"
            + (f", retrains the {_steps(again)} recorded after it on their stored rollouts" if again > 0 else "")
            + ", then samples on")


def _steps(n: int) -> str:
    return f"{n} step" + ("" if n == 1 else "s")


def recorded(location: str | Path, run_id: str) -> Recorded | None:
    """The store's record of `run_id` at `location` (a URL or a run directory); None when no store
    is there or it cannot be read."""
    from vime.store import SampleStore
    from vime.store.database import DB_FILENAME

    if "://" not in str(location) and not (Path(location) / DB_FILENAME).is_file():
        return None
    try:
        with SampleStore.open(str(location), lock_wait_s=30) as store:
            trained = max(store.trained_counts(run_id), default=-1) + 1
            checkpoint = store.run_progress(run_id).checkpoint
    except Exception:  # noqa: BLE001 - best effort: the line falls back to the rule
        return None
    return Recorded(trained, checkpoint["step"] if checkpoint else None)
