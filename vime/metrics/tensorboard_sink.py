"""TensorBoard event files under `<run_dir>/tensorboard`, one event per metrics line, grouped tags.

TensorBoard's own event writer, not torch's `SummaryWriter`: the rollout worker that records
metrics never imports torch (seconds of CPU, hundreds of MB). Each process writes a file of its
own (TensorBoard reads the folder); `steps()` reads them all back, so a relaunch knows which lines
TensorBoard already has and writes each line exactly once.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

from vime.metrics.tags import figures

TENSORBOARD_DIR = "tensorboard"


def tensorboard_installed() -> bool:
    return importlib.util.find_spec("tensorboard") is not None


class TensorBoardSink:
    def __init__(self, run_dir: str | Path) -> None:
        self.dir = Path(run_dir) / TENSORBOARD_DIR
        self._writer = None
        self._steps: set[int] | None = None

    def written(self, step: int) -> bool:
        if self._steps is None:
            self._steps = self.steps()
        return step in self._steps

    def steps(self) -> set[int]:
        """The steps whose scalars are in the folder's event files (a file cut by a crash is read
        up to its last whole event)."""
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

        found: set[int] = set()
        for path in sorted(self.dir.glob("events.out.tfevents.*")):
            found.update(event.step for event in EventFileLoader(str(path)).Load() if event.summary.value)
        return found

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=name, simple_value=value) for name, value in figures(metrics).items()]
        if not values:
            return
        if self._writer is None:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self._writer = EventFileWriter(str(self.dir))
        self._writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))
        self._writer.flush()

    def close(self) -> None:
        self._steps = None  # read again at the next open: this log's own lines are there now
        if self._writer is not None:
            self._writer.close()
            self._writer = None
