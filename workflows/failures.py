"""How many of a step's samples a hook failed, and whether the step may still train.

A reward or generate hook that raises (or times out) on some samples costs those samples, not
the run: their groups are dropped whole (`activities.rollout`) and the training workflow draws
others in their place, like groups a dynamic-sampling filter drops, so the step keeps its batch
size. `StepFailures` counts every sample drawn for the step, kept or not, and stops the run
with the first hook error when

- every sample drawn so far failed (checked after each sampling round: nothing will come of
  drawing more), or
- at the end of the step, more of its samples failed than a hook failing at the rate
  `--max-failed-sample-ratio` would fail by chance: `ratio x n` plus 2.5 standard deviations
  of that count (`allowed`). A bare share would not do: at 64 samples a step, a hook that fails
  one sample in 20 puts a step above a 10% share about once in 25 steps, and a run of a few
  hundred steps could never finish; with the margin such a hook trains to the end while one
  failing 40% stops at its first step.

Groups answered from the store (`RolloutOutput.earlier`, a run resumed after it stopped on
them) are dropped but not counted: they were counted when generated.

Light and deterministic: imported by workflows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


class _Group(Protocol):  # workflows.rollout.RolloutOutput
    samples: int
    failed: int
    first_error: str | None
    earlier: bool


@dataclass
class StepFailures:
    max_ratio: float
    samples: int = 0
    failed: int = 0
    first_error: str | None = None

    def add(self, groups: list[_Group]) -> None:
        for g in groups:
            if g.earlier:
                continue
            self.samples += g.samples
            self.failed += g.failed
            if g.failed and self.first_error is None:
                self.first_error = g.first_error

    @property
    def share(self) -> float:
        return self.failed / self.samples if self.samples else 0.0

    def all_failed(self) -> bool:
        return self.samples > 0 and self.failed == self.samples

    @property
    def allowed(self) -> float:
        """The failures a hook failing at exactly `max_ratio` stays within ~99 steps in 100."""
        n, p = self.samples, self.max_ratio
        return n * p + 2.5 * math.sqrt(n * p * (1 - p))

    def over_bound(self) -> bool:
        return self.all_failed() or self.failed > self.allowed

    def stop_message(self, step: int) -> str:
        first = self.first_error or "no error message"
        if self.all_failed():
            return (f"step {step}: every one of its {self.samples} samples failed, so there is nothing to train on; "
                    f"the first error: {first}")
        return (f"step {step}: {self.failed} of its {self.samples} samples failed ({self.share:.0%}, more than "
                f"--max-failed-sample-ratio {self.max_ratio:g} allows by chance: {self.allowed:.1f}); "
                f"the first error: {first}")
