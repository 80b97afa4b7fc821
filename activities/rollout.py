"""The `generate_group` activity: one prompt group → generate + reward → the store → refs.

Idempotent on (run, rollout ids of the group): a retry after a crash finds the group already
stored and returns its refs without generating again; a retry after a crash mid-generation
generates again and writes once (the store keeps the first write of a rollout).
"""

from __future__ import annotations

from typing import Any

from temporalio import activity

from activities.heartbeat import heartbeating
from vime.rollout.data_source import make_data_source
from vime.rollout.filters import apply_dynamic_filter
from vime.plugins import call_hook_async, load_hook
from vime.rollout.group import run_group
from vime.store import SampleStore
from vime.types import RolloutRef, Sample, SampleRef
from workflows.rollout import RolloutInput, RolloutOutput, RolloutStepInput, RolloutStepOutput


def _summary(position: int, rollouts: list[RolloutRef], keep: bool, reason: str | None) -> RolloutOutput:
    rewards = [s.reward for r in rollouts for s in r.samples[-1:] if s.reward is not None]
    failed = all(r.infra_failure for r in rollouts) if rollouts else False
    return RolloutOutput(position, rollouts, keep=keep and not failed, filter_reason=reason,
                         reward_mean=sum(rewards) / len(rewards) if rewards else None,
                         status="failed" if failed else "completed")


def _ref(run_id: str, rollout_id: str, refs: list[SampleRef], weight_version: int,
         samples: list[Sample]) -> RolloutRef:
    failure = next((str(s.metadata["infra_failure"]) for s in samples if s.metadata.get("infra_failure")), None)
    return RolloutRef(run_id, rollout_id, refs, weight_version, failure)


class RolloutActivities:
    def __init__(self, args: Any, store: SampleStore) -> None:
        self.args = args
        self.store = store
        self.data_source = make_data_source(args)

    @activity.defn(name="generate_group")
    async def generate_group(self, inp: RolloutInput) -> RolloutOutput:
        group = self.data_source.prompt_group(inp.position)
        ids = [str(slot.index) for slot in group]  # the slot's id is the rollout's idempotency key
        stored = [self.store.rollout_refs(inp.run_id, rid) for rid in ids]
        if all(stored):  # a retry of a group that was written: answer from the store
            results = [self.store.read_rollout(inp.run_id, rid) for rid in ids]
            return self._output(inp, ids, results, stored)

        async with heartbeating():
            results = await run_group(self.args, group, evaluation=inp.evaluation)
        keep, reason = apply_dynamic_filter(self.args, [s for r in results for s in r])
        for rid, siblings in zip(ids, results):
            for s in siblings:
                s.rollout_id = rid
                s.metadata.setdefault("weight_version", inp.weight_version)
                s.metadata["filter"] = {"keep": keep, "reason": reason}
        written = self.store.write_rollouts(inp.run_id, dict(zip(ids, results)))
        return self._output(inp, ids, results, [written[rid] for rid in ids])

    @activity.defn(name="generate_rollout_step")
    async def generate_rollout_step(self, inp: RolloutStepInput) -> RolloutStepOutput:
        """A whole step by `--rollout-function-path generate_rollout(args, rollout_id, data_source)`.

        The data source starts at the workflow's position; the groups are stored with
        deterministic ids (`s<step>-g<group>-<i>` where the function set none), so a retried
        step stores each rollout once. The data source's buffer does not outlive the activity.
        """
        fn = load_hook(self.args, "rollout_function_path")
        source = make_data_source(self.args)
        source.load_state_dict({"position": inp.position})
        async with heartbeating():
            groups = await call_hook_async(fn, self.args, inp.step, source, evaluation=False)
        outputs = []
        for g, group in enumerate(groups):
            by_rollout: dict[str, list[Sample]] = {}
            for i, s in enumerate(group):
                s.rollout_id = str(s.rollout_id) if s.rollout_id is not None else f"s{inp.step}-g{g}-{i}"
                s.metadata.setdefault("weight_version", inp.weight_version)
                by_rollout.setdefault(s.rollout_id, []).append(s)
            written = self.store.write_rollouts(inp.run_id, by_rollout)
            ids = list(by_rollout)
            outputs.append(self._output(RolloutInput(inp.run_id, inp.step, g, inp.weight_version), ids,
                                        [by_rollout[r] for r in ids], [written[r] for r in ids]))
        return RolloutStepOutput(outputs, getattr(source, "position", inp.position))

    def _output(self, inp: RolloutInput, ids: list[str], results: list[list[Sample]],
                refs: list[list[SampleRef]]) -> RolloutOutput:
        rollouts = [_ref(inp.run_id, rid, r, inp.weight_version, samples) for rid, r, samples in zip(ids, refs, results)]
        verdict = results[0][0].metadata.get("filter", {}) if results and results[0] else {}
        return _summary(inp.position, rollouts, bool(verdict.get("keep", True)), verdict.get("reason"))
