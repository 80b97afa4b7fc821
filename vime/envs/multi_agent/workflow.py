"""MultiAgentRolloutWorkflow: one run of the multi-agent system on one prompt, as a durable workflow.

    solvers (K turns) → rewriter (1 turn) → selector (1 turn) → store (rewards, one fan-out)

One workflow per rollout, id `<run>-rollout-<position>-<i>`, grouped per prompt by
`MultiAgentGroupWorkflow` (the group workflow the training workflow starts). Each role is one
activity: it samples its turns with vime's generate and stores them in the store's turn table
(turns 0..K-1 the solvers, K the rewriter, K+1 the selector) before it returns. So a worker
killed mid-rollout costs only the role it was running: the finished roles' results are in the
workflow's history and their turns in the store, and the retried role samples just its own turns
(a role whose turns are already stored returns them without sampling). The store activity turns
the stored turns into the rollout's samples, rewarded, and writes them once.

When no solver sampled a usable draft there is nothing to rewrite or select: the rollout ends
with its solvers only (an uneven fan-out, and an incorrect final answer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from vime.envs import GroupInput, GroupOutput, SampleInput
    from vime.envs.group_workflow import fan_out_children, finish_group, finish_rollout, gathered_previews
    from vime.temporal.retry import rollout_retry_policy
    from vime.temporal.search_attributes import POLICY_VERSION, ROLLOUT_ID, ROLLOUT_STATUS, RUN_ID
    from vime.types import RolloutRef

SOLVERS = "multi_agent_solvers"
REWRITER = "multi_agent_rewriter"
SELECTOR = "multi_agent_selector"
STORE = "multi_agent_store"
ROLE_ACTIVITIES = {"solver": SOLVERS, "rewriter": REWRITER, "selector": SELECTOR}


@dataclass
class MultiAgentRolloutInput(SampleInput):
    """One rollout of the group: the sample's fields are all it needs."""


@dataclass
class RoleOutput:
    """What a role activity tells the workflow: small numbers; the turns are in the store."""

    role: str
    rollout_id: str
    turns: list[int] = field(default_factory=list)  # the turn numbers it holds
    scores: list[float] = field(default_factory=list)
    usable: int = 0  # turns with a reply the next role can build on
    pick: str | None = None  # the selector's pick ("A", ...)
    sampled_by: str = ""  # "<activity id>#<attempt>" that sampled the turns


@dataclass
class MultiAgentRolloutOutput:
    rollout: RolloutRef
    reward_mean: float | None = None  # the mean of its samples' rewards
    correct: bool = False  # the selector picked a correct candidate
    roles: list[str] = field(default_factory=list)  # the role of each stored sample, in order
    preview: list[dict] | None = None  # what the Web UI shows of its samples (role, turn, reward, texts)


@workflow.defn(name="MultiAgentRolloutWorkflow")
class MultiAgentRolloutWorkflow:
    def __init__(self) -> None:
        self.phases: list[str] = []

    @workflow.query
    def progress(self) -> dict:
        return {"phases": list(self.phases)}

    @workflow.run
    async def run(self, inp: MultiAgentRolloutInput) -> MultiAgentRolloutOutput:
        if workflow.info().typed_search_attributes.get(RUN_ID) is None:
            workflow.upsert_search_attributes([RUN_ID.value_set(inp.run_id), ROLLOUT_STATUS.value_set("running"),
                                               POLICY_VERSION.value_set(inp.weight_version)])
        solvers = await self._role("solver", inp)
        workflow.upsert_search_attributes([ROLLOUT_ID.value_set(solvers.rollout_id)])
        if solvers.usable:
            await self._role("rewriter", inp)
            await self._role("selector", inp)
        self.phases.append("store")
        out = await workflow.execute_activity(
            STORE, inp, result_type=MultiAgentRolloutOutput, start_to_close_timeout=timedelta(minutes=5),
            heartbeat_timeout=timedelta(seconds=inp.heartbeat_seconds),  # a lost start: found in seconds
            retry_policy=rollout_retry_policy())
        finish_rollout("completed", out.reward_mean, out.preview)  # each role's turn in the memo
        return out

    async def _role(self, role: str, inp: MultiAgentRolloutInput) -> RoleOutput:
        self.phases.append(role)
        return await workflow.execute_activity(
            ROLE_ACTIVITIES[role], inp, result_type=RoleOutput, start_to_close_timeout=timedelta(minutes=30),
            heartbeat_timeout=timedelta(seconds=inp.heartbeat_seconds),
            retry_policy=rollout_retry_policy())  # infra failures retry; a ConfigError ends the run


@workflow.defn(name="MultiAgentGroupWorkflow")
class MultiAgentGroupWorkflow:
    """A prompt group for the training workflow: one `MultiAgentRolloutWorkflow` per sample,
    summarized as one `GroupOutput` (its rollout ids; the mean reward counts each rollout once)."""

    @workflow.run
    async def run(self, inp: GroupInput) -> GroupOutput:
        outs = await fan_out_children(
            inp, MultiAgentRolloutWorkflow.run,
            lambda i: MultiAgentRolloutInput.of(inp, i), "multi-agent")
        return finish_group(summarize_group(inp.position, outs))


def summarize_group(position: int, outs: list[MultiAgentRolloutOutput]) -> GroupOutput:
    rewards = [o.reward_mean for o in outs if o.reward_mean is not None]
    return GroupOutput(position, [o.rollout.rollout_id for o in outs],
                       reward_mean=sum(rewards) / len(rewards) if rewards else None,
                       samples=sum(len(o.rollout.samples) for o in outs), preview=gathered_previews(outs))

