"""Following a run from `vime train`: one line per step, and every part it started kept alive.

`Follower.follow` waits for the training workflow's result while, once a second:
- the embedded Temporal dev server and the vLLM servers (and router) are checked; a dead one is
  restarted (same address, same database file, current weights) and what happened is printed;
- the workflow's progress is queried (for at most `QUERY_TIMEOUT_S`: the worker that answers may
  have just died) and each step finished *during this launch* is printed (steps finished before
  it are not: a rerun reports the steps it actually trained), with the lines workers sent it
  for the console since (a hook a step has waited on for long).

Workers are watched apart from that loop: the supervisor says the moment a worker process exits,
and its death is handled then: restarted, printed, and reported to Temporal (`vime.launcher.recovery`), so
its work is retried now rather than after a heartbeat timeout.

Failures that restarting cannot fix (a server dying again and again, a worker that stops on a
configuration error) end the launch with one line: the run itself stays in Temporal, resumable.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import CancelledError
from temporalio.service import RPCError

from vime.errors import ConfigError
from vime.log import get_logger
from vime.launcher.recovery import recover_from_worker_death
from vime.launcher.supervisor import Supervisor
from vime.temporal.restart_plan import restart_plan
from vime.temporal.training_contract import PROGRESS_QUERY, TRAINER_LOST_SIGNAL, TrainingState, failure_message

log = get_logger(__name__)

QUERY_TIMEOUT_S = 10.0


def format_eval(m: dict) -> str:
    """An eval round's sets, `eval heldout 0.620 pass@4 0.750`: mean reward, and the pass@k of
    the most samples per prompt when there are several."""
    sets = sorted({k.split("/")[1] for k in m if k.startswith("eval/") and k.endswith("/reward_mean")})
    parts = []
    for name in sets:
        ks = sorted(int(k.rsplit("@", 1)[1]) for k in m if k.startswith(f"eval/{name}/pass@"))
        top = f" pass@{ks[-1]} {m[f'eval/{name}/pass@{ks[-1]}']:.3f}" if ks and ks[-1] > 1 else ""
        parts.append(f"eval {name} {m[f'eval/{name}/reward_mean']:.3f}{top}")
    return " | ".join(parts)


def format_progress(m: dict, total: int) -> str:
    """One line per finished step: a bar, reward, KL, length, throughput and time per phase, and
    the eval round before the step when there was one. The round after the last step has a line
    of its own."""
    if m.get("eval_only"):  # the round after the last step, or one checkpoint of `vime eval`
        where = m["eval_checkpoint"] if "eval_checkpoint" in m else f"after step {m['step']}/{total}"
        return f"[eval] {where} | {format_eval(m)} | {m.get('eval_seconds', 0):.1f}s"
    done = m["step"] + 1
    bar = "#" * int(20 * done / max(1, total))
    kl = m.get("kl_loss", m.get("ref_kl"))
    return (f"[{bar:<20}] step {done}/{total} | reward {m.get('reward_mean', float('nan')):.3f}"
            + (f" | kl {kl:.4f}" if kl is not None else "")
            + (f" | teacher kl {m['opd_reverse_kl']:.3f}" if "opd_reverse_kl" in m else "")
            + f" | len {m.get('response_length_mean', 0):.1f} | {m.get('train_tokens_per_second', 0):.0f} tok/s"
            + (f" | stale {m['staleness_mean']:.1f}/{m['staleness_max']}" if "staleness_mean" in m else "")
            + (f" dropped {m['dropped_groups']}" if m.get("dropped_groups") else "")
            + (f" | failed {m['failed_samples']}" if m.get("failed_samples") else "")
            + f" | rollout {m.get('rollout_wait_seconds', 0):.1f}s train {m.get('train_phase_seconds', 0):.1f}s"
            + f" sync {m.get('sync_seconds', 0):.2f}s (pause {m.get('sync_pause_seconds', 0):.3f}s)"
            + (f" | {format_eval(m)} ({m.get('eval_seconds', 0):.1f}s)" if "eval_seconds" in m else ""))


class RunFailed(ConfigError):
    """The training workflow failed or was cancelled (`ended`); the message is its cause, in one line."""

    def __init__(self, message: str, ended: str = "failed") -> None:
        super().__init__(message)
        self.ended = ended


@dataclass
class Follower:
    """Watches one launch of a run. `services` are things with `async check() -> list[str] | str | None`."""

    client: Client
    handle: WorkflowHandle
    run_id: str
    supervisor: Supervisor
    services: list = field(default_factory=list)
    poll: float = 1.0
    start_step: int | None = None  # the step the run was at when this launch attached
    started_at: float = field(default_factory=time.time)  # steps that finished after this are this launch's
    progress: dict = field(default_factory=dict)  # the last progress the workflow reported
    printed: list[int] = field(default_factory=list)  # steps finished (and printed) by this launch
    evals_printed: list[int] = field(default_factory=list)  # eval rounds after the last step, printed
    noticed: set = field(default_factory=set)  # workers' notices printed, as (time, line)
    restart: Callable[[], str] = lambda: restart_plan(None)  # what starting the run again does (its store says)

    async def follow(self) -> TrainingState:
        result = asyncio.create_task(self._result())
        workers = asyncio.create_task(self._watch_workers())
        try:
            while not result.done():
                await asyncio.wait([result, workers], timeout=self.poll, return_when=asyncio.FIRST_COMPLETED)
                if workers.done():
                    await workers  # raises what stopped it: a worker that restarting cannot help
                await self._check_services()
                await self._show_progress()
            state = await result
        finally:
            result.cancel()
            workers.cancel()
        await self._show_progress(final=state)
        return state

    @property
    def steps_trained(self) -> int:
        return len(self.printed)

    async def _result(self) -> TrainingState:
        """The workflow's result; a connection lost while the Temporal server restarts is retried."""
        while True:
            try:
                return await self.handle.result()
            except WorkflowFailureError as e:
                if isinstance(e.cause, CancelledError):
                    raise RunFailed(f"run {self.run_id} was cancelled (vime cancel, the Web UI or the Temporal CLI); "
                                    f"its samples are kept; {self.restart()}", ended="cancelled") from None
                raise RunFailed(f"run {self.run_id} failed: {failure_message(e)} (fix it, then {self.restart()})"
                                ) from None
            except RPCError as e:
                log.info("follow.result_retry", error=str(e)[:200])
                await asyncio.sleep(1.0)

    async def _check_services(self) -> None:
        for service in self.services:
            lines = await service.check()
            for line in [lines] if isinstance(lines, str) else (lines or []):
                print(line, flush=True)

    async def _watch_workers(self) -> None:
        """Handle each worker's death as the supervisor reports its exit (`poll` s at the latest)."""
        exited = asyncio.Event()
        loop = asyncio.get_running_loop()
        self.supervisor.on_exit(lambda: loop.call_soon_threadsafe(exited.set))
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(exited.wait(), self.poll)
            exited.clear()
            await self._check_workers()

    async def _check_workers(self) -> None:
        for death in self.supervisor.check():
            print(f"[vime] worker {death.name} died ({death.cause}); restarted it (the run continues)", flush=True)
            try:
                await recover_from_worker_death(self.client, self.run_id, death.identity,
                                                f"worker {death.identity} died ({death.cause})")
                if death.name == "trainer":  # also what was only scheduled on its queue
                    await self.handle.signal(TRAINER_LOST_SIGNAL)
            except Exception as e:  # noqa: BLE001 - best effort: heartbeat timeouts still recover
                log.warning("follow.recovery_failed", error=str(e)[:300])

    async def _show_progress(self, final: TrainingState | None = None) -> None:
        p = await self._query() if final is None else {
            "step": final.step, "metrics": final.metrics, "checkpoint": final.checkpoint,
            "checkpoint_step": final.checkpoint_step}
        if p is None:
            return
        self.progress = {**self.progress, **p}
        total = self.progress.get("num_rollout") or 0
        for n in p.get("notices", []):  # a worker's line for the console (a hook the step waits on)
            key = (n["at"], n["line"])
            if n["at"] >= self.started_at and key not in self.noticed:
                self.noticed.add(key)
                print(n["line"], flush=True)
        for m in p.get("metrics", []):
            mine = m["step"] >= self.start_step if self.start_step is not None else (
                m.get("finished_at", 0.0) >= self.started_at)  # attached: what finished since this launch began
            seen = self.evals_printed if m.get("eval_only") else self.printed
            if mine and m["step"] not in seen:
                seen.append(m["step"])
                print(format_progress(m, total), flush=True)
                if seen is self.printed and len(seen) == 1:
                    at = m.get("finished_at") or time.time()
                    print(f"[vime] first step {at - self.started_at:.1f} s after the launch", flush=True)

    async def _query(self) -> dict | None:
        try:
            return await self.handle.query(PROGRESS_QUERY,
                                           rpc_timeout=timedelta(seconds=QUERY_TIMEOUT_S))
        except Exception:  # noqa: BLE001 - a query fails while a worker or Temporal restarts: ask again
            return None


def elapsed(t0: float) -> str:
    return f"{time.monotonic() - t0:.0f} s"
