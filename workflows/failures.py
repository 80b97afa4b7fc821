"""How many of a step's samples a hook failed, and whether the step may still train.

A reward or generate hook that raises (or times out) on some samples costs those samples, not
the run: their groups are dropped whole (`activities.rollout`) and the training workflow draws
others in their place, like groups a dynamic-sampling filter drops, so the step keeps its batch
size. `StepFailures` counts every sample drawn for the step, kept or not, and stops the run
with the first hook error when

- every sample drawn so far failed (checked after each sampling round: nothing will come of
  drawing more), or
- at the end of the step, more than `--max-failed-sample-ratio` of its samples failed.

Groups answered from the store (`RolloutOutput.earlier`, a run resumed after it stopped on
them) are dropped but not counted: they were counted when generated.

Light and deterministic: imported by workflows.
"""

from __future__ import annotations

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

    def over_bound(self) -> bool:
        return self.all_failed() or self.share > self.max_ratio

    def stop_message(self, step: int) -> str:
        first = self.first_error or "no error message"
        if self.all_failed():
            return (f"step {step}: every one of its {self.samples} samples failed, so there is nothing to train on; "
                    f"the first error: {first}")
        return (f"step {step}: {self.failed} of its {self.samples} samples failed ({self.share:.0%}, above "
                f"--max-failed-sample-ratio {self.max_ratio:g}); the first error: {first}")
