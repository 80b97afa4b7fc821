"""The fully async pool's staleness policy: which groups may start, and which may still be
trained, given the policy version the servers hold and `--max-staleness`.

A group's staleness is the number of weight versions between the policy it started under (its
oldest token's) and the policy it is trained on. Pure: no Temporal, no clock, no I/O, so the
rules are tested directly (tests/test_staleness.py); `workflows.async_pool` applies them inside
the training workflow.

- *Admissible*: a group started under version `v` may be trained while the servers hold at
  most `v + max_staleness`. A group past that is dropped and counted, never trained silently.
- *Pacing* (`pace`, the default): a new group starts only while the groups alive (in flight,
  finished and waiting, or taken by the step being trained) number fewer than
  `(max_staleness + 1) x batch_size`, so finished work seldom goes stale. `discard` starts
  groups whatever their age and relies on dropping alone: more throughput, burnt rollouts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

PACE = "pace"
DISCARD = "discard"


class _Started(Protocol):
    weight_version: int  # the policy version the group started under


G = TypeVar("G", bound=_Started)


@dataclass(frozen=True)
class StalenessPolicy:
    max_staleness: int
    batch_size: int  # groups per step (rollout_batch_size)
    control: str = PACE  # or DISCARD

    def staleness(self, started_under: int, version: int) -> int:
        """Versions between the group's policy and the one it would be trained on now."""
        return version - started_under

    def admissible(self, started_under: int, version: int) -> bool:
        return started_under >= version - self.max_staleness

    def split(self, groups: Iterable[G], version: int) -> tuple[list[G], list[G]]:
        """`(kept, dropped)`: the groups still admissible at `version`, in their order, and the rest."""
        kept: list[G] = []
        dropped: list[G] = []
        for g in groups:
            (kept if self.admissible(g.weight_version, version) else dropped).append(g)
        return kept, dropped

    def may_start(self, alive: int) -> bool:
        """Whether one more group may start while `alive` groups are in flight, waiting, or taken
        by the step being trained (pacing; `discard` does not pace)."""
        return self.control != PACE or alive < (self.max_staleness + 1) * self.batch_size
