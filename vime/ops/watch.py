"""`vime status RUN --follow`: the run's progress line per step, as `vime train` prints it, and
the reason whenever it waits, until it ends.

It starts nothing and needs no launch of the run: it asks the run's Temporal once a second (the
`progress` query, answered by whichever rollout worker serves the run, and `describe`), and the
run's vLLM servers' `/health`. So it follows a run on long-lived workers started with
`temporal workflow start` as well as one `vime train` runs. Steps finished before it started are
not printed (the status line before says where the run stands); a waiting reason is printed when
it appears or changes (`vime.ops.waiting`). It returns when the run ends: 0 when it finished, 1
when it failed or was cancelled (the line says what starting it again will do).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from vime.launcher.follow import format_progress
from vime.ops.waiting import observe, reason
from vime.temporal.training_contract import PROGRESS_QUERY, TrainingState, failure_message

QUERY_TIMEOUT_S = 5.0


@dataclass
class Watch:
    """Follows `train-<run_id>` in `client`'s namespace. `restart()` is the clause saying what
    starting the run again does (read from its store when it ends short)."""

    client: Client
    run_id: str
    restart: Callable[[], str]
    engine_urls: list[str] = field(default_factory=list)
    poll: float = 1.0
    out: Callable[[str], None] = field(default=lambda line: print(line, flush=True))
    seen: set = field(default_factory=set)  # (kind, step) of step lines already there or printed
    noticed: set = field(default_factory=set)  # workers' notices already there or printed
    started: bool = False  # a first progress answer was read (what it held was not new)
    waiting: str | None = None  # the reason printed last
    total: int = 0

    async def follow(self) -> int:
        handle = self.client.get_workflow_handle(f"train-{self.run_id}", result_type=TrainingState)
        while True:
            try:
                described = await handle.describe()
            except RPCError as e:
                if e.status != RPCStatusCode.NOT_FOUND:
                    raise
                self._wait(f"no workflow train-{self.run_id} yet: waiting for it to start")
                await asyncio.sleep(self.poll)
                continue
            if described.status != WorkflowExecutionStatus.RUNNING:
                return await self._ended(handle, described.status)
            seen = await observe(self.client, described, self.engine_urls)
            if described.task_queue not in seen.idle_queues and (progress := await self._query(handle)) is not None:
                self._show(progress)
            self._wait(reason(seen))
            await asyncio.sleep(self.poll)

    def _wait(self, line: str | None) -> None:
        if line and line != self.waiting:
            self.out(f"[wait] run {self.run_id}: {line}")
        self.waiting = line

    def _show(self, p: dict) -> None:
        self.total = p.get("num_rollout") or self.total
        for n in p.get("notices", []):
            key = (n["at"], n["line"])
            if key not in self.noticed:
                self.noticed.add(key)
                if self.started:
                    self.out(n["line"])
        self._steps(p.get("metrics", []))
        self.started = True

    def _steps(self, metrics: list[dict]) -> None:
        for m in metrics:
            key = ("eval" if m.get("eval_only") else "step", m["step"])
            if key not in self.seen:
                self.seen.add(key)
                if self.started:
                    self.out(format_progress(m, self.total))

    async def _query(self, handle: WorkflowHandle) -> dict | None:
        try:
            return await handle.query(PROGRESS_QUERY, rpc_timeout=timedelta(seconds=QUERY_TIMEOUT_S))
        except Exception:  # noqa: BLE001 - no worker answers (the reason says so), or one is busy: ask again
            return None

    async def _ended(self, handle: WorkflowHandle, status: WorkflowExecutionStatus) -> int:
        """The run's last step lines and one line on how it ended."""
        if status == WorkflowExecutionStatus.COMPLETED:
            state = await handle.result()
            self._steps(state.metrics)
            self.out(f"[vime] run {self.run_id} finished: {state.step} steps"
                     + (f", checkpoint {state.checkpoint}" if state.checkpoint else ""))
            return 0
        if status == WorkflowExecutionStatus.FAILED:
            try:
                await handle.result()
                why = "failed"
            except WorkflowFailureError as e:
                why = f"failed: {failure_message(e)}"
            self.out(f"[vime] run {self.run_id} {why}; fix it, then {self.restart()}")
            return 1
        how = {WorkflowExecutionStatus.CANCELED: "was cancelled", WorkflowExecutionStatus.TERMINATED:
               "was terminated", WorkflowExecutionStatus.TIMED_OUT: "timed out"}.get(status, status.name.lower())
        self.out(f"[vime] run {self.run_id} {how}; its samples stay in the store; {self.restart()}")
        return 1
