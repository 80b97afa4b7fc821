"""Per-step metrics on disk: `<run_dir>/metrics.jsonl` always, and the same lines to each sink:
TensorBoard event files under `<run_dir>/tensorboard` when the `tensorboard` package is installed
(`pip install vime[tensorboard]`), W&B with `--use-wandb`, the rollout worker's Prometheus
endpoint with `--metrics-port` (`vime.metrics`).

One JSON object per finished step (reward, KL, entropy, response length, clip fraction, grad
norm, staleness, seconds per phase, tokens/s, infra failures: whatever the step reported), in
step order. Writing a step that is already in the file does nothing, so a retried activity or a
restarted worker never duplicates a line. `vime report` reads this file.

The file is the record and the sinks follow it: a line reaches each sink once, after the file has
it. When a run's log opens (a relaunch, a restarted worker), each sink that can tell which steps it
has is given the lines it lacks first (a crash between the file and a sink, TensorBoard installed
later), so every dashboard ends with exactly the file's lines. Each sink is fed on a thread of its
own, and a sink that fails is logged and skipped: a dashboard never holds up or fails a step.
"""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import Any, Protocol

from vime.log import get_logger
from vime.metrics.tags import BOOKKEEPING
from vime.metrics.tensorboard_sink import TENSORBOARD_DIR, TensorBoardSink, tensorboard_installed

log = get_logger(__name__)

METRICS_FILE = "metrics.jsonl"
__all__ = ["BOOKKEEPING", "METRICS_FILE", "TENSORBOARD_DIR", "MetricsLog", "MetricsSink", "SinkFeeder", "read_metrics",
           "run_sinks"]


class MetricsSink(Protocol):
    def written(self, step: int) -> bool:
        """The sink already has `step` (the catch-up at open skips it)."""

    def write(self, step: int, metrics: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


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


def run_sinks(args: Any) -> list[MetricsSink]:
    """The sinks a run's flags ask for: TensorBoard when installed, W&B with `--use-wandb`."""
    sinks: list[MetricsSink] = [TensorBoardSink(args.run_dir)] if tensorboard_installed() else []
    if args.use_wandb:
        from vime.metrics.wandb_sink import WandbConfig, WandbSink

        sinks.append(WandbSink(args.run_dir, WandbConfig.from_args(args)))
    return sinks


class SinkFeeder:
    """One sink's lines, written in order on a thread of its own: a slow or hung dashboard (W&B's
    servers unreachable) never holds up the step whose line the file already has. Every call to
    the sink, `close` included, is made from that thread."""

    def __init__(self, sink: MetricsSink) -> None:
        self.sink = sink
        self.name = type(sink).__name__
        self._lines: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=f"metrics-{self.name}", daemon=True)
        self._thread.start()

    def put(self, step: int, line: dict[str, Any]) -> None:
        self._lines.put((step, line))

    def flush(self) -> None:
        """Return once the sink has been handed every line put so far."""
        self._lines.join()

    def close(self, timeout: float = 60.0) -> None:
        self._lines.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("metrics.sink_close_timeout", sink=self.name, seconds=timeout)

    def _run(self) -> None:
        while True:
            item = self._lines.get()
            try:
                if item is None:
                    self.sink.close()
                    return
                self.sink.write(*item)
            except Exception as e:  # noqa: BLE001 - the file has the line; the dashboard misses it, logged
                log.warning("metrics.sink_failed", sink=self.name, step=item and item[0], error=repr(e))
            finally:
                self._lines.task_done()


class MetricsLog:
    def __init__(self, run_dir: str | Path, sinks: list[MetricsSink] | None = None) -> None:
        """`sinks`: default TensorBoard when installed (`run_sinks(args)` for a run's own)."""
        self.run_dir = Path(run_dir)
        sinks = ([TensorBoardSink(run_dir)] if tensorboard_installed() else []) if sinks is None else sinks
        self.sinks = sinks
        self._feeders: list[SinkFeeder] = []
        self._lock = threading.Lock()
        self._written: set[int] | None = None
        self._size = 0  # of the file as this log last saw it: another process's lines mean a re-read

    def write(self, step: int, metrics: dict[str, Any]) -> bool:
        """Append `metrics` for `step` unless it is already there; True when it was written. The
        sinks get the line on their own threads (`flush` waits for them)."""
        with self._lock:
            if self._written is None:
                self._open()
            elif self._file_size() != self._size:
                self._written = {m["step"] for m in read_metrics(self.run_dir)}
            if step in self._written:
                return False
            self.run_dir.mkdir(parents=True, exist_ok=True)
            line = {**metrics, "step": step}
            with open(self.run_dir / METRICS_FILE, "a") as f:
                f.write(json.dumps(line, default=str) + "\n")
            self._size = self._file_size()
            self._written.add(step)
            for feeder in self._feeders:
                feeder.put(step, line)
            return True

    def _open(self) -> None:
        """The file's steps, and each sink caught up on the lines it lacks, in step order."""
        lines = read_metrics(self.run_dir)
        self._written = {m["step"] for m in lines}
        self._size = self._file_size()
        for sink in self.sinks:
            feeder = SinkFeeder(sink)
            self._feeders.append(feeder)
            try:
                missing = [m for m in lines if not sink.written(m["step"])]
            except Exception as e:  # noqa: BLE001 - an unreadable sink is a warning, not a failed step
                log.warning("metrics.sink_unreadable", sink=feeder.name, error=repr(e))
                continue
            for m in missing:
                feeder.put(m["step"], m)

    def _file_size(self) -> int:
        try:
            return (self.run_dir / METRICS_FILE).stat().st_size
        except FileNotFoundError:
            return 0

    def flush(self) -> None:
        """Return once every sink has been handed every line written so far."""
        for feeder in self._feeders:
            feeder.flush()

    def close(self) -> None:
        """Hand each sink its last lines and close it (a W&B run is finished); the file needs nothing."""
        with self._lock:
            feeders, self._feeders, self._written = self._feeders, [], None
        for feeder in feeders:
            feeder.close()
