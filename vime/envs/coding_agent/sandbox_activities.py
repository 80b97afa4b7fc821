"""Sandbox activities: boot, capture the diff, grade, tear down.

A sandbox outlives each activity: `boot_sandbox` starts one and returns its id; the session,
`capture_diff` and `teardown_sandbox` attach to it by id. A local (bubblewrap) sandbox exists on
its host only, so every worker serves two queues: the shared sandbox queue (`boot_sandbox`,
`grade_diff`, and `teardown_sandbox` for sandboxes whose host is gone) and a queue of its own
(`sandbox_host_queue`: the session, `capture_diff`, `teardown_sandbox`), which `boot_sandbox`
returns in `SandboxRef.task_queue` so the workflow sends the sandbox's later activities there.
Cloud sandboxes (E2B) take the same path; for them the host queue is merely unneeded. A sandbox
that is gone when an activity attaches raises the non-retryable `SandboxLost`, which the
workflow answers by booting another one.

A boot is keyed (`BootInput.boot_key`, the same on every retry of that boot): the backend
replaces a sandbox an earlier attempt booted under the same key (its completion was lost, or
its worker died before reporting it), so a retried boot leaves one sandbox, not two.

Grading never reuses the agent's sandbox: the diff is applied in a fresh one holding the clean
task repository, with the task's own test files put back, so nothing the agent left behind
(processes, edited tests, caches) can change the reward.
"""

from __future__ import annotations

import hashlib
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from vime.temporal.store_calls import store_call
from vime.envs.coding_agent.config import sandbox_options
from vime.envs.coding_agent.flags import coding_flags
from vime.envs.coding_agent.grading import grade_in_sandbox, task_test_files
from vime.agent.recorder import TrajectoryRecorder
from vime.sandbox import SandboxGone, attach_sandbox, make_sandbox
from vime.sandbox.git import capture_diff, init_base
from vime.log import get_logger
from vime.store import SampleStore
from vime.envs.coding_agent.workflow import (PATCH_DOES_NOT_APPLY, SANDBOX_LOST, BootInput, DiffInput, DiffOutput,
                                    GradeInput, GradeOutput, SandboxRef)

log = get_logger(__name__)


async def attach(args: Any, sandbox_id: str):
    """The running sandbox `sandbox_id`, or `SandboxLost` (non-retryable) when it is gone."""
    try:
        return await attach_sandbox(args.sandbox_backend, sandbox_id, **sandbox_options(args))
    except SandboxGone as e:
        raise ApplicationError(str(e), type=SANDBOX_LOST, non_retryable=True) from e


def diff_id(diff: str) -> str:
    return "sha256:" + hashlib.sha256(diff.encode()).hexdigest()


def sandbox_host_queue(sandbox_task_queue: str) -> str:
    """A queue for one worker process alone: `<shared queue>-<host>-<pid>-<random>`. Unique per
    process start, so a restarted worker never takes the activities of sandboxes its previous
    life booted (they died or were reaped with it); the workflow sees them time out instead."""
    return f"{sandbox_task_queue}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class SandboxActivities:
    """The sandbox activities of one worker process, whose own queue is `host_queue` (by default
    a fresh `sandbox_host_queue` under the worker's `--sandbox-task-queue`). Each activity uses
    the sandbox backend and options of the run its input names (`run_args`, by run id: one
    worker serves many runs); an input without a run id (older histories) uses the worker's."""

    def __init__(self, args: Any, store: SampleStore, host_queue: str | None = None,
                 run_args: Callable[[str], Awaitable[Any]] | None = None) -> None:
        self.args = args
        self.store = store
        self.host_queue = host_queue or sandbox_host_queue(args.sandbox_task_queue)
        self.booted: dict[str, str] = {}  # sandbox id -> its run id: booted by this process, not torn down yet
        self._run_args = run_args

    async def _args(self, run_id: str) -> Any:
        return await self._run_args(run_id) if run_id and self._run_args is not None else self.args

    async def destroy_booted(self) -> int:
        """Destroy every sandbox this process booted and nobody tore down (the worker is
        stopping: a workflow that still needs one boots another and resumes into it)."""
        count = 0
        for sandbox_id, run_id in list(self.booted.items()):
            if await self.teardown_sandbox(SandboxRef(sandbox_id, run_id=run_id)):
                count += 1
        return count

    @activity.defn(name="boot_sandbox")
    async def boot_sandbox(self, inp: BootInput) -> SandboxRef:
        """A fresh sandbox with the task repository committed as the diff base; the sandbox's
        later activities go to `SandboxRef.task_queue`, this worker's own queue."""
        task, args = inp.task, await self._args(inp.run_id)
        sbx = make_sandbox(args.sandbox_backend, boot_key=inp.boot_key or None, **sandbox_options(args, task.repo_dir))
        await sbx.boot()
        for replaced in sbx.replaced:
            self.booted.pop(replaced, None)
        if sbx.replaced:
            log.warning("sandbox.replaced", replaced=sbx.replaced, boot_key=inp.boot_key, sandbox_id=sbx.sandbox_id)
        try:
            await init_base(sbx)
        except BaseException:
            await sbx.destroy()
            raise
        self.booted[sbx.sandbox_id] = inp.run_id
        log.info("sandbox.booted", sandbox_id=sbx.sandbox_id, rollout_id=task.rollout_id, host_queue=self.host_queue)
        return SandboxRef(sbx.sandbox_id, self.host_queue, inp.run_id)

    @activity.defn(name="capture_diff")
    async def capture_diff(self, inp: DiffInput) -> DiffOutput:
        """The workspace's diff against the task's base; if the sandbox is gone (its worker was
        killed after the session finished), the diff stored with the session's last step."""
        args = await self._args(inp.run_id)
        try:
            sbx = await attach_sandbox(args.sandbox_backend, inp.sandbox_id, **sandbox_options(args))
        except SandboxGone:
            restored = await store_call(TrajectoryRecorder(self.store, inp.run_id, inp.rollout_id).load)
            return DiffOutput(diff_id(restored.diff), restored.diff, source="checkpoint")
        diff = await capture_diff(sbx)
        return DiffOutput(diff_id(diff), diff)

    @activity.defn(name="grade_diff")
    async def grade_diff(self, inp: GradeInput) -> GradeOutput:
        task, args = inp.task, await self._args(inp.run_id)

        def fresh():
            return make_sandbox(args.sandbox_backend, **sandbox_options(args, task.repo_dir))

        result = await grade_in_sandbox(fresh, inp.diff, task.test_command,
                                        test_files=task_test_files(task.repo_dir),
                                        timeout=coding_flags(args).agent_command_timeout)
        if result.outcome == "patch_failed":
            raise ApplicationError(result.reason, type=PATCH_DOES_NOT_APPLY, non_retryable=True)
        return GradeOutput(result.reward, result.outcome, result.reason)

    @activity.defn(name="teardown_sandbox")
    async def teardown_sandbox(self, ref: SandboxRef) -> bool:
        """Destroy the sandbox; True if it was still there (a retry finds it gone: fine)."""
        self.booted.pop(ref.sandbox_id, None)
        args = await self._args(ref.run_id)
        try:
            sbx = await attach_sandbox(args.sandbox_backend, ref.sandbox_id, **sandbox_options(args))
        except SandboxGone:
            return False
        await sbx.destroy()
        log.info("sandbox.destroyed", sandbox_id=ref.sandbox_id)
        return True

    def on_sandbox_queue(self) -> list:
        """The activities of the shared sandbox queue (any worker may take them)."""
        return [self.boot_sandbox, self.grade_diff, self.teardown_sandbox]

    def on_host_queue(self) -> list:
        """The activities of `host_queue` (they use a sandbox this worker booted)."""
        return [self.capture_diff, self.teardown_sandbox]
