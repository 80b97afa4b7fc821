"""How steps are numbered where people read them: from 1, one numbering everywhere.

Step N is the N-th step trained; it ends with the policy of N steps, saved as `step_N` (zero
padded) by `--save`, and the eval round "at step N" evaluates that policy (N = 0: the policy
before training). The console ("step 1/4"), `vime report`'s plots and tables, `vime samples`
(its STEP column, `--step` and `--json`), `vime rescore` and `vime show` ("trained at step 1")
all count this way.

The store and `metrics.jsonl` keep the step's 0-based index (`trained_step`, `"step"` on a train
line; an eval-only line's `"step"` is already the number of steps trained): those keys are read
by scripts and stay as they are. These functions are the one place that converts.
"""

from __future__ import annotations


def step_number(index: int | None) -> int | None:
    """The step people read for a stored 0-based index (`trained_step`, `metrics.jsonl`'s `step`)."""
    return None if index is None else index + 1


def step_index(number: int | None) -> int | None:
    """The stored 0-based index of step `number` (1 or more): what `--step N` looks up."""
    return None if number is None else number - 1


def step_text(index: int) -> str:
    """"step N" for a stored 0-based index."""
    return f"step {step_number(index)}"
