"""Per-step metrics on disk: `<run_dir>/metrics.jsonl` always, TensorBoard event files under
`<run_dir>/tensorboard` when the `tensorboard` package is installed (`pip install vime[tensorboard]`).

One JSON object per finished step (reward, KL, entropy, response length, clip fraction, grad
norm, staleness, seconds per phase, tokens/s, infra failures: whatever the step reported), in
step order. Writing a step that is already in the file does nothing, so a retried activity or a
restarted worker never duplicates a line. `vime report` reads this file.
"""

from __future__ import annotations

import importlib.util
import json
import math
import threading
import time
from pathlib import Path
from typing import Any

from vime.log import get_logger

log = get_logger(__name__)

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
BOOKKEEPING = frozenset({"step", "finished_at"})
"""Keys of a metrics line that are not figures: no TensorBoard scalar (the step is the x axis)."""


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The run's per-step metrics, one dict per step, by step; [] when none were written."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    by_step: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a crash mid-write: the step is written again
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            by_step.setdefault(record["step"], record)
    return [by_step[s] for s in sorted(by_step)]


class MetricsLog:
    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._lock = threading.Lock()
        self._written: set[int] | None = None
        self._tensorboard = None

    def write(self, step: int, metrics: dict[str, Any]) -> bool:
        """Append `metrics` for `step` unless it is already there; True when it was written."""
        with self._lock:
            if self._written is None:
                self._written = {m["step"] for m in read_metrics(self.run_dir)}
            if step in self._written:
                return False
            self.run_dir.mkdir(parents=True, exist_ok=True)
            line = json.dumps({**metrics, "step": step}, default=str)
            with open(self.run_dir / METRICS_FILE, "a") as f:
                f.write(line + "\n")
            self._written.add(step)
            self._to_tensorboard(step, metrics)
            return True

    def _to_tensorboard(self, step: int, metrics: dict[str, Any]) -> None:
        """Each finite number as a scalar at `step` (eval figures too: `eval/<set>/reward_mean` at
        the round's step). TensorBoard's own event writer, not torch's `SummaryWriter`: the rollout
        worker that records metrics never imports torch (seconds of CPU, hundreds of MB)."""
        if self._tensorboard is None:
            if importlib.util.find_spec("tensorboard") is None:  # the JSONL is the record
                self._tensorboard = False
                return
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self._tensorboard = EventFileWriter(str(self.run_dir / TENSORBOARD_DIR))
        if self._tensorboard is False:
            return
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=name, simple_value=float(value)) for name, value in metrics.items()
                  if name not in BOOKKEEPING and isinstance(value, int | float) and not isinstance(value, bool)
                  and math.isfinite(value)]
        self._tensorboard.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))
        self._tensorboard.flush()
