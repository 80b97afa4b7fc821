"""CodingAgentRolloutWorkflow: one agent rollout on one coding task, as a durable workflow.

    task → boot sandbox → agent session → capture diff → grade in a clean sandbox → store
                       └──────────── tear down the sandbox, always ────────────┘

One workflow per rollout (an agent rollout takes seconds to hours, so the workflow costs
nothing next to it), id `<run>-rollout-<position>-<i>`. Each step is its own activity with its
own timeouts and retries: the session heartbeats every turn and stores its trajectory per
step, so a retried session resumes after its last stored step; a sandbox that vanished
(`SandboxLost`) is booted again and the session restored into it from the stored diff.

Where the steps run: `boot_sandbox` and `grade_diff` on the shared sandbox queue; everything
that touches the booted sandbox afterwards (the agent session, `capture_diff`,
`teardown_sandbox`) on the queue of the worker that booted it (`SandboxRef.task_queue`),
because a local (bubblewrap) sandbox exists on that one host only. A host whose worker is gone
takes nothing from its queue: the `schedule_to_start_timeout` there is the workflow's cue that
the sandbox is lost with its host (`SandboxLost`: boot another, resume); its teardown then
falls back to the shared queue, where a cloud sandbox is still destroyed and a local one, gone
with its host, is a no-op. Each boot carries a key (`boot_key`: workflow id + boot ordinal), so
a retried boot replaces the sandbox an earlier attempt of the same boot left behind.

Failures are data: a diff that does not apply is a typed, non-retryable task outcome (reward
0); a sandbox or engine that stays broken after its retries is an infra failure, recorded with
its cause in `FailureClass` and kept out of advantage statistics. Search attributes: run,
rollout id, status, reward, policy version, failure class; the memo holds the trajectory id
(where the store keeps its turns), the diff id and its samples' previews (`samples`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from vime.envs.contract import GroupInput, GroupOutput, SampleInput
    from vime.envs.group_workflow import (fan_out_children, finish_group, finish_rollout, gathered_previews,
                                          sample_workflow_id)
    from vime.temporal.search_attributes import FAILURE_CLASS, POLICY_VERSION, ROLLOUT_ID, ROLLOUT_STATUS, RUN_ID
    from vime.types import RolloutRef
    from vime.temporal.error_types import root_message

AGENT_TASK = "agent_task"
AGENT_SESSION = "agent_session"
STORE_AGENT_ROLLOUT = "store_agent_rollout"
BOOT_SANDBOX = "boot_sandbox"
CAPTURE_DIFF = "capture_diff"
GRADE_DIFF = "grade_diff"
TEARDOWN_SANDBOX = "teardown_sandbox"

SANDBOX_LOST = "SandboxLost"
PATCH_DOES_NOT_APPLY = "PatchDoesNotApply"
MAX_SANDBOX_BOOTS = 3


@dataclass
class AgentRolloutInput(SampleInput):
    """One agent rollout: the sample, and where and how hard its sandbox and session are tried."""

    sandbox_task_queue: str = "vime-sandbox"
    session_attempts: int = 5  # tries of the agent session before the rollout is an infra failure
    # how long an activity may wait on the booting host's queue before the host counts as gone
    sandbox_host_seconds: float = 60.0


@dataclass
class AgentTask:
    """A coding task as the activities need it (resolved from the data source once)."""

    rollout_id: str
    group_index: int
    index: int
    prompt: str
    repo_dir: str
    test_command: str
    task_id: str = ""


@dataclass
class SessionInput:
    run_id: str
    task: AgentTask
    sandbox_id: str
    weight_version: int
    evaluation: bool = False  # an eval rollout: sampled with the eval settings, exactly `weight_version`
    eval_set: str | None = None


@dataclass
class SessionOutput:
    turns: int
    stop_reason: str
    finished: bool


@dataclass
class BootInput:
    task: AgentTask
    boot_key: str  # the same for every attempt of one boot: a retry replaces what an earlier attempt left
    run_id: str = ""  # whose config (sandbox backend and options) the boot uses; "": the worker's flags


@dataclass
class SandboxRef:
    sandbox_id: str
    task_queue: str = ""  # the booting worker's own queue: where the sandbox's later activities run
    run_id: str = ""  # the run it was booted for (its teardown attaches with that run's config)


@dataclass
class DiffInput:
    run_id: str
    rollout_id: str
    sandbox_id: str


@dataclass
class DiffOutput:
    diff_id: str  # "sha256:<hex>" of the text
    diff: str
    source: str = "sandbox"  # or "checkpoint" when the sandbox was gone and the last stored diff was used


@dataclass
class GradeInput:
    task: AgentTask
    diff: str
    run_id: str = ""  # whose config the grading sandbox and its timeout come from; "": the worker's flags


@dataclass
class GradeOutput:
    reward: float
    outcome: str
    reason: str


@dataclass
class StoreInput:
    run_id: str
    task: AgentTask
    weight_version: int
    reward: float | None
    outcome: str
    reason: str = ""
    diff: str = ""
    diff_id: str = ""
    infra_failure: str | None = None
    step: int = 0  # the rollout's group's (an eval rollout: its round, stored as the round's)
    evaluation: bool = False
    eval_set: str | None = None


@dataclass
class AgentRolloutOutput:
    rollout: RolloutRef
    reward: float | None = None
    status: str = "completed"
    failure_class: str = "none"
    outcome: str = ""
    diff_id: str = ""
    turns: int = 0
    phases: list[str] = field(default_factory=list)
    preview: list[dict] | None = None  # what the Web UI shows of its samples (turns, reward, texts)


agent_workflow_id = sample_workflow_id


def _retry(attempts: int, *non_retryable: str) -> RetryPolicy:
    return RetryPolicy(maximum_attempts=attempts, initial_interval=timedelta(seconds=1),
                       non_retryable_error_types=["ConfigError", *non_retryable])


def boot_key(workflow_id: str, ordinal: int) -> str:
    """The key of a workflow's `ordinal`-th sandbox boot: the same on every retry of that boot
    (and on a replay), different for every other boot, so a backend can find and replace what
    an earlier attempt of the same boot left behind."""
    return f"{workflow_id}/boot-{ordinal}"


def _host_lost(e: BaseException) -> bool:
    """An activity on a sandbox host's queue that no worker took in time: the host is gone.

    Only host-queue activities have a schedule-to-start timeout, and Temporal does not retry it."""
    return (isinstance(e, ActivityError) and isinstance(e.cause, TimeoutError)
            and e.cause.type == TimeoutType.SCHEDULE_TO_START)


def _error_type(e: BaseException) -> str:
    if _host_lost(e):
        return SANDBOX_LOST
    cause = e.cause if isinstance(e, ActivityError) else e
    return cause.type if isinstance(cause, ApplicationError) and cause.type else type(cause).__name__


def _message(e: BaseException) -> str:
    if _host_lost(e):
        return (f"{SANDBOX_LOST}: no worker took {e.activity_type} from the sandbox's host queue in time: "
                f"the worker that booted the sandbox is gone")[:500]
    cause = e.cause if isinstance(e, ActivityError) and e.cause is not None else e
    return f"{_error_type(e)}: {cause}"[:500]


def failure_class(error_type: str) -> str:
    """FailureClass of an activity error: who is to blame, for the UI and the statistics."""
    if error_type in (SANDBOX_LOST, "SandboxError", "SandboxGone"):
        return "infra:sandbox"
    if error_type in ("ServiceError", "EngineError", "AdapterError"):
        return "infra:engine"
    if error_type in ("TimeoutError", "ActivityTimeout"):
        return "infra:timeout"
    return f"infra:{error_type or 'unknown'}"


@workflow.defn(name="CodingAgentRolloutWorkflow")
class CodingAgentRolloutWorkflow:
    def __init__(self) -> None:
        self.phase = "starting"
        self.phases: list[str] = []
        self.sandbox: SandboxRef | None = None

    @workflow.query
    def progress(self) -> dict:
        return {"phase": self.phase, "phases": list(self.phases),
                "sandbox_id": self.sandbox.sandbox_id if self.sandbox else None,
                "sandbox_queue": self.sandbox.task_queue if self.sandbox else None}

    def _enter(self, phase: str) -> None:
        self.phase = phase
        self.phases.append(phase)

    @workflow.run
    async def run(self, inp: AgentRolloutInput) -> AgentRolloutOutput:
        self._enter("task")
        task = await workflow.execute_activity(
            AGENT_TASK, inp, result_type=AgentTask, start_to_close_timeout=timedelta(minutes=2),
            retry_policy=_retry(5))
        trajectory_id = f"{inp.run_id}/{task.rollout_id}"
        workflow.upsert_search_attributes([
            RUN_ID.value_set(inp.run_id), ROLLOUT_ID.value_set(task.rollout_id),
            POLICY_VERSION.value_set(inp.weight_version), ROLLOUT_STATUS.value_set("running"),
        ])
        workflow.upsert_memo({"trajectory_id": trajectory_id, "task_id": task.task_id})

        store = StoreInput(inp.run_id, task, inp.weight_version, reward=None, outcome="", step=inp.step,
                           evaluation=inp.evaluation, eval_set=inp.eval_set)
        turns = 0
        try:
            session, diff = await self._in_sandbox(inp, task)
            turns = session.turns
            store.diff, store.diff_id = diff.diff, diff.diff_id
            workflow.upsert_memo({"diff_id": diff.diff_id, "diff_source": diff.source})
            await self._teardown(inp)  # free the agent's sandbox before grading starts a clean one
            self._enter("grade")
            grade = await self._grade(inp, task, diff.diff)
            store.reward, store.outcome, store.reason = grade.reward, grade.outcome, grade.reason
        except (ActivityError, asyncio.CancelledError) as e:
            if is_cancelled_exception(e):  # the sandbox goes first, then the cancellation goes on
                self._enter("cancelled")
                await self._teardown(inp)
                workflow.upsert_search_attributes([ROLLOUT_STATUS.value_set("cancelled")])
                raise
            store.infra_failure, store.outcome = _message(e), failure_class(_error_type(e))
            workflow.logger.warning("rollout %s: infra failure: %s", task.rollout_id, store.infra_failure)
        finally:
            await self._teardown(inp)

        self._enter("store")
        out = await workflow.execute_activity(
            STORE_AGENT_ROLLOUT, store, result_type=AgentRolloutOutput,
            start_to_close_timeout=timedelta(minutes=5), retry_policy=_retry(10))
        out.turns, out.phases = turns, list(self.phases)
        finish_rollout(out.status, out.reward, out.preview, FAILURE_CLASS.value_set(out.failure_class))
        self.phase = "done"
        return out

    async def _in_sandbox(self, inp: AgentRolloutInput, task: AgentTask) -> tuple[SessionOutput, DiffOutput]:
        """Boot a sandbox, run the session in it and capture its diff, on the host that booted
        it. A lost sandbox or host is replaced (the session resumes from its stored steps), at
        most MAX_SANDBOX_BOOTS times."""
        for boot in range(MAX_SANDBOX_BOOTS):
            self._enter("boot")
            self.sandbox = ref = await workflow.execute_activity(
                BOOT_SANDBOX, BootInput(task, boot_key(workflow.info().workflow_id, boot), inp.run_id), result_type=SandboxRef,
                task_queue=inp.sandbox_task_queue, start_to_close_timeout=timedelta(minutes=10),
                retry_policy=_retry(3))
            try:
                self._enter("session")
                session = await _stopped_on_cancel(workflow.start_activity(
                    AGENT_SESSION, SessionInput(inp.run_id, task, ref.sandbox_id, inp.weight_version, inp.evaluation,
                                              inp.eval_set),
                    result_type=SessionOutput, **self._on_host(inp, ref), start_to_close_timeout=timedelta(hours=4),
                    heartbeat_timeout=timedelta(seconds=inp.heartbeat_seconds),
                    retry_policy=_retry(inp.session_attempts, SANDBOX_LOST),
                    # on cancel, wait until the session stopped using the sandbox before tearing it down
                    cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED))
                self._enter("diff")
                diff = await workflow.execute_activity(
                    CAPTURE_DIFF, DiffInput(inp.run_id, task.rollout_id, ref.sandbox_id), result_type=DiffOutput,
                    **self._on_host(inp, ref), start_to_close_timeout=timedelta(minutes=5), retry_policy=_retry(5))
                return session, diff
            except ActivityError as e:
                if _error_type(e) != SANDBOX_LOST or boot == MAX_SANDBOX_BOOTS - 1:
                    raise
                workflow.logger.warning("rollout %s: sandbox %s lost (%s); booting another", task.rollout_id,
                                        ref.sandbox_id, _message(e))
                await self._teardown(inp)
        raise AssertionError("unreachable")

    @staticmethod
    def _on_host(inp: AgentRolloutInput, ref: SandboxRef) -> dict:
        """Activity options that send an activity to the worker that booted `ref`, and give up
        (`SandboxLost`) when that worker does not take it in time."""
        return {"task_queue": ref.task_queue or inp.sandbox_task_queue,
                "schedule_to_start_timeout": timedelta(seconds=inp.sandbox_host_seconds)}

    async def _grade(self, inp: AgentRolloutInput, task: AgentTask, diff: str) -> GradeOutput:
        try:
            return await workflow.execute_activity(
                GRADE_DIFF, GradeInput(task, diff, inp.run_id), result_type=GradeOutput, task_queue=inp.sandbox_task_queue,
                start_to_close_timeout=timedelta(minutes=15), retry_policy=_retry(3, PATCH_DOES_NOT_APPLY))
        except ActivityError as e:
            if _error_type(e) != PATCH_DOES_NOT_APPLY:
                raise
            return GradeOutput(0.0, "patch_failed", _message(e))

    async def _teardown(self, inp: AgentRolloutInput) -> None:
        """Destroy the current sandbox (idempotent; runs even when the workflow is cancelled).

        On its host; if that host is gone, on the shared sandbox queue instead: a cloud sandbox
        is destroyed from anywhere, a local one went with its host (another host does not find
        it: a no-op)."""
        if self.sandbox is None:
            return
        ref, self.sandbox = self.sandbox, None
        self._enter("teardown")
        options = {"start_to_close_timeout": timedelta(minutes=2), "retry_policy": _retry(10)}
        try:
            await workflow.execute_activity(TEARDOWN_SANDBOX, ref, **self._on_host(inp, ref), **options)
        except ActivityError as e:
            if not _host_lost(e):
                raise
            workflow.logger.warning("sandbox %s: its host is gone; tearing down from %s", ref.sandbox_id,
                                    inp.sandbox_task_queue)
            await workflow.execute_activity(TEARDOWN_SANDBOX, ref, task_queue=inp.sandbox_task_queue, **options)


async def _stopped_on_cancel(handle: workflow.ActivityHandle):
    """The activity's result; when the workflow is cancelled meanwhile, the activity is asked to
    stop and awaited, and the cancellation goes on.

    Awaited directly, an activity with WAIT_CANCELLATION_COMPLETED that completes after the
    cancel was requested (a session between heartbeats finishing its last turn) hands back its
    result and the SDK drops the cancel: the rollout went on to grading and finished as if never
    cancelled. Shielded, the cancel reaches this code whatever the activity does."""
    try:
        return await asyncio.shield(handle)
    except asyncio.CancelledError:
        handle.cancel()
        try:
            await handle  # stopped (cancelled) or finished: either way the sandbox is free now
        except (ActivityError, asyncio.CancelledError):
            pass
        raise


@workflow.defn(name="CodingAgentGroupWorkflow")
class CodingAgentGroupWorkflow:
    """A prompt group of agent rollouts for the training workflow: one `CodingAgentRolloutWorkflow`
    per sample, summarized as one `GroupOutput`. Infra failures stay in the group (stored, kept
    out of advantage statistics, never trained); the group is kept when any rollout was graded."""

    @workflow.run
    async def run(self, inp: GroupInput) -> GroupOutput:
        outs = await fan_out_children(
            inp, CodingAgentRolloutWorkflow.run,
            lambda i: AgentRolloutInput.of(inp, i, sandbox_task_queue=inp.sandbox_task_queue), "agent")
        return finish_group(summarize_agent_group(inp.position, outs))  # it started "running"


def summarize_agent_group(position: int, outs: list[AgentRolloutOutput]) -> GroupOutput:
    """The group as the training workflow sees it: the stored rollouts' ids, and the mean of the
    graded rewards (infra failures count as samples, not as rewards)."""
    stored = [o for o in outs if o.rollout.samples]
    rewards = [o.reward for o in stored if o.reward is not None and not o.rollout.infra_failure]
    infra = sum(len(o.rollout.samples) for o in stored if o.rollout.infra_failure)
    return GroupOutput(position, [o.rollout.rollout_id for o in stored], keep=bool(rewards),
                       reward_mean=sum(rewards) / len(rewards) if rewards else None,
                       status="completed" if rewards else "failed",
                       samples=sum(len(o.rollout.samples) for o in stored), infra=infra,
                       preview=gathered_previews(stored))

