from dataclasses import dataclass


@dataclass(frozen=True)
class Interval:
    """The half-open time range [start, end)."""

    start: int
    end: int


def overlaps(a, b):
    return a.start <= b.end and b.start <= a.end
