"""Sandbox activities (the sandbox task queue): boot, capture the diff, grade, tear down.

A sandbox outlives each activity: `boot_sandbox` starts one and returns its id; the session,
`capture_diff` and `teardown_sandbox` attach to it by id, from any worker on the host (bwrap)
or anywhere (E2B). A sandbox that is gone when an activity attaches raises the non-retryable
`SandboxLost`, which the workflow answers by booting another one.

Grading never reuses the agent's sandbox: the diff is applied in a fresh one holding the clean
task repository, with the task's own test files put back, so nothing the agent left behind
(processes, edited tests, caches) can change the reward.
"""

from __future__ import annotations

import hashlib
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from vime.agent.coding.config import sandbox_options
from vime.agent.coding.grading import grade_in_sandbox, task_test_files
from vime.agent.recorder import TrajectoryRecorder
from vime.agent.sandbox import SandboxGone, attach_sandbox, make_sandbox
from vime.agent.sandbox.git import capture_diff, init_base
from vime.log import get_logger
from vime.store import SampleStore
from workflows.coding_agent import (PATCH_DOES_NOT_APPLY, SANDBOX_LOST, AgentTask, DiffInput, DiffOutput,
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


class SandboxActivities:
    def __init__(self, args: Any, store: SampleStore) -> None:
        self.args = args
        self.store = store
        self.booted: set[str] = set()  # by this process and not torn down yet

    async def destroy_booted(self) -> int:
        """Destroy every sandbox this process booted and nobody tore down (the worker is
        stopping: a workflow that still needs one boots another and resumes into it)."""
        count = 0
        for sandbox_id in list(self.booted):
            if await self.teardown_sandbox(SandboxRef(sandbox_id)):
                count += 1
        return count

    @activity.defn(name="boot_sandbox")
    async def boot_sandbox(self, task: AgentTask) -> SandboxRef:
        sbx = make_sandbox(self.args.sandbox_backend, **sandbox_options(self.args, task.repo_dir))
        await sbx.boot()
        try:
            await init_base(sbx)
        except BaseException:
            await sbx.destroy()
            raise
        self.booted.add(sbx.sandbox_id)
        log.info("sandbox.booted", sandbox_id=sbx.sandbox_id, rollout_id=task.rollout_id)
        return SandboxRef(sbx.sandbox_id)

    @activity.defn(name="capture_diff")
    async def capture_diff(self, inp: DiffInput) -> DiffOutput:
        """The workspace's diff against the task's base; if the sandbox is gone (its worker was
        killed after the session finished), the diff stored with the session's last step."""
        try:
            sbx = await attach_sandbox(self.args.sandbox_backend, inp.sandbox_id, **sandbox_options(self.args))
        except SandboxGone:
            restored = TrajectoryRecorder(self.store, inp.run_id, inp.rollout_id).load()
            return DiffOutput(diff_id(restored.diff), restored.diff, source="checkpoint")
        diff = await capture_diff(sbx)
        return DiffOutput(diff_id(diff), diff)

    @activity.defn(name="grade_diff")
    async def grade_diff(self, inp: GradeInput) -> GradeOutput:
        task = inp.task

        def fresh():
            return make_sandbox(self.args.sandbox_backend, **sandbox_options(self.args, task.repo_dir))

        result = await grade_in_sandbox(fresh, inp.diff, task.test_command,
                                        test_files=task_test_files(task.repo_dir),
                                        timeout=self.args.agent_command_timeout)
        if result.outcome == "patch_failed":
            raise ApplicationError(result.reason, type=PATCH_DOES_NOT_APPLY, non_retryable=True)
        return GradeOutput(result.reward, result.outcome, result.reason)

    @activity.defn(name="teardown_sandbox")
    async def teardown_sandbox(self, ref: SandboxRef) -> bool:
        """Destroy the sandbox; True if it was still there (a retry finds it gone: fine)."""
        self.booted.discard(ref.sandbox_id)
        try:
            sbx = await attach_sandbox(self.args.sandbox_backend, ref.sandbox_id, **sandbox_options(self.args))
        except SandboxGone:
            return False
        await sbx.destroy()
        log.info("sandbox.destroyed", sandbox_id=ref.sandbox_id)
        return True

    def all(self) -> list:
        return [self.boot_sandbox, self.capture_diff, self.grade_diff, self.teardown_sandbox]
