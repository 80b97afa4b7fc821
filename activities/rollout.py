"""The `generate_group` activity: one prompt group → generate + reward → the store → rollout ids.

Idempotent on (run, rollout ids of the group): a retry after a crash finds the group already
stored and returns it without generating again; a retry after a crash mid-generation
generates again and writes once (the store keeps the first write of a rollout).

A group holding a sample that a hook failed (it raised or timed out: `metadata["hook_failure"]`,
see `vime.rollout.group`) is stored, so the failures can be read, and marked not kept (filter
reason `failed_samples`) without asking the dynamic-sampling filter: the training workflow
drops it whole, counts its failures against `--max-failed-sample-ratio` and draws a group in
its place. Under GRPO the group's advantages are normalised over its own rollouts; training the
rest of a group without its failed member would skew them. A group answered from the store
says so (`earlier`): its failures were counted when it was generated, or stopped the run that
generated it, so a run resumed after the hook is fixed does not stop on them again.

A group is stored whole or not at all: if any of its rollouts hit an infrastructure failure
(the engine died, was cut off or stalled), nothing is written and the activity fails with a
retryable `InfraFailure` after the engine answers again (or a bounded wait), so Temporal's retry
generates the group anew on a live engine (same seeds, same draws). Configuration errors (a
reward function that raised, a hook breaking the Sample contract) fail the activity for good
(`vime.temporal.retry`). Store calls run in a thread: the worker's event loop also runs workflow
tasks and heartbeats, and a write may wait for a lock.
"""

from __future__ import annotations

import time
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from vime.temporal.retry import final_config_errors
from vime.temporal.heartbeat import heartbeating, heartbeats_throughout
from activities.eval import EvalActivities
from activities.hook_notices import watch_hooks
from vime.temporal.store_calls import store_call
from vime.engine.health import wait_until_healthy
from vime.plugins import call_hook_async, load_hook
from vime.rollout.data_source import make_data_source
from vime.rollout.filters import apply_dynamic_filter
from vime.rollout.generate import router_url, serving_adapter
from vime.rollout.group import run_group
from vime.rollout.phase_times import collecting, timed
from vime.rollout.policy_check import check_on_policy
from vime.config.run_args import RunArgs, stored_config
from vime.envs.contract import hook_failures, summarize
from vime.store import SampleStore
from vime.types import Sample
from workflows.rollout import RolloutInput, RolloutOutput, RolloutStepInput, RolloutStepOutput
from workflows.steps import REGISTER_RUN, RunRegistration

INFRA_FAILURE = "InfraFailure"
ENGINE_WAIT_S = 30.0


FAILED_SAMPLES = "failed_samples"  # the filter reason of a group dropped for its failed samples


def _infra_cause(results: list[list[Sample]]) -> tuple[int, str] | None:
    """How many samples the infrastructure failed, and the first cause; None when none did. A
    sample the engine aborted counts: its server was stopping (a relaunch, a kill of the
    launcher), and a stored group is final here (nothing continues it), so an aborted sample
    stored unscored stopped the run at its step's training, on every rerun."""
    causes = [s.metadata["infra_failure"] if (s.metadata or {}).get("infra_failure") else "vLLM aborted the request"
              for r in results for s in r
              if (s.metadata or {}).get("infra_failure") or s.status == Sample.Status.ABORTED]
    return (len(causes), str(causes[0])) if causes else None


async def wait_for_engine(url: str, timeout: float = ENGINE_WAIT_S) -> bool:
    """Wait (heartbeating) until the engine at `url` answers `/health`, at most `timeout` s."""
    beat = (lambda: activity.heartbeat("waiting for the engine")) if activity.in_activity() else None
    return await wait_until_healthy(url, timeout, while_waiting=beat)


class RolloutActivities:
    """Generation for any run: each call reads its run's config by run id (`vime.config.run_args`)."""

    def __init__(self, args: Any, store: SampleStore) -> None:
        self.runs = RunArgs(args, store.run_argv)
        self.store = store
        self.evals = EvalActivities(self)  # eval rounds (workflows/eval_round.py)

    async def run_context(self, run_id: str) -> tuple[Any, Any]:
        """The run's args and data source (read and built in a store thread: files, the store)."""
        def load():
            return self.runs.args(run_id), self.runs.derived(run_id, "data_source", make_data_source)
        return await store_call(load)

    @activity.defn(name=REGISTER_RUN)
    @final_config_errors
    async def register_run(self, reg: RunRegistration) -> None:
        """Check a starting run's flags (one line if they are bad, nothing stored), then create
        the run if it is new and record its flags, which the workers serving it read. An eval
        run's flags were checked by the `vime eval` that started it (eval sets, no --prompt-data;
        its launch holds the run directory), so here they are only parsed."""
        args = await store_call(self.runs.checked, reg.run_id, reg.argv, reg.evaluation)
        await store_call(self.store.register_run, reg.run_id, reg.argv, stored_config(args))

    @activity.defn(name="generate_group")
    @final_config_errors
    @heartbeats_throughout
    async def generate_group(self, inp: RolloutInput) -> RolloutOutput:
        if inp.evaluation:  # an eval prompt's group: stored as the round's, never trained
            return await self.evals.evaluate_group(inp)
        with collecting() as times:
            out = await self._generate_group(inp, times)
        out.perf = {k: round(v, 4) for k, v in times.items()}
        return out

    async def _generate_group(self, inp: RolloutInput, times: dict[str, float]) -> RolloutOutput:
        t0 = time.perf_counter()
        args, data_source = await self.run_context(inp.run_id)
        group = data_source.prompt_group(inp.position)
        ids = [str(slot.index) for slot in group]  # the slot's id is the rollout's idempotency key
        stored = await store_call(self.stored_group, inp.run_id, ids)
        if stored is not None:  # a retry of a group that was written: answer from the store
            return self._output(inp.position, ids, stored)

        if activity.in_activity():
            watch_hooks(activity.client())
        t1 = time.perf_counter()
        times["context"] = t1 - t0
        async with heartbeating():
            with serving_adapter(args, inp.run_id, inp.weight_version):  # a LoRA run: the group's adapter
                results = await run_group(args, group, evaluation=inp.evaluation)
            times["run_group"] = time.perf_counter() - t1
            await self.retry_if_infra(args, results, f"group {inp.position}")
        check_on_policy((s for r in results for s in r), inp.weight_version, f"group {inp.position} of step {inp.step}")
        keep, reason = ((False, FAILED_SAMPLES) if hook_failures(results)
                        else apply_dynamic_filter(args, [s for r in results for s in r]))
        for rid, siblings in zip(ids, results):
            for s in siblings:
                s.rollout_id = rid
                s.metadata.setdefault("weight_version", inp.weight_version)
                s.metadata["filter"] = {"keep": keep, "reason": reason}
        with timed("store"):
            await store_call(self.store.write_rollouts, inp.run_id, dict(zip(ids, results)))
        return summarize(inp.position, ids, results, keep, reason)

    @activity.defn(name="generate_rollout_step")
    @final_config_errors
    @heartbeats_throughout
    async def generate_rollout_step(self, inp: RolloutStepInput) -> RolloutStepOutput:
        """A whole step by `--rollout-function-path generate_rollout(args, rollout_id, data_source)`.

        The data source starts at the workflow's position; the groups are stored with
        deterministic ids (`s<step>-g<group>-<i>` where the function set none), so a retried
        step stores each rollout once. The data source's buffer does not outlive the activity.
        """
        args, _ = await self.run_context(inp.run_id)
        fn = load_hook(args, "rollout_function_path")
        source = make_data_source(args)
        source.load_state_dict({"position": inp.position})
        async with heartbeating():
            with serving_adapter(args, inp.run_id, inp.weight_version):
                groups = await call_hook_async(fn, args, inp.step, source, evaluation=False)
            await self.retry_if_infra(args, [list(g) for g in groups], f"rollout step {inp.step}")
        check_on_policy((s for g in groups for s in g), inp.weight_version, f"rollout step {inp.step}")
        outputs = []
        for g, group in enumerate(groups):
            by_rollout: dict[str, list[Sample]] = {}
            for i, s in enumerate(group):
                s.rollout_id = str(s.rollout_id) if s.rollout_id is not None else f"s{inp.step}-g{g}-{i}"
                s.metadata.setdefault("weight_version", inp.weight_version)
                by_rollout.setdefault(s.rollout_id, []).append(s)
            await store_call(self.store.write_rollouts, inp.run_id, by_rollout)
            ids = list(by_rollout)
            outputs.append(summarize(g, ids, [by_rollout[r] for r in ids], preview=False))  # no group workflow
        return RolloutStepOutput(outputs, getattr(source, "position", inp.position))

    def stored_group(self, run_id: str, ids: list[str]) -> list[list[Sample]] | None:
        """The group's rollouts if every one of them is stored (a retry after the write)."""
        if not all(self.store.rollout_refs(run_id, rid) for rid in ids):
            return None
        return [self.store.read_rollout(run_id, rid) for rid in ids]

    def _output(self, position: int, ids: list[str], results: list[list[Sample]]) -> RolloutOutput:
        verdict = results[0][0].metadata.get("filter", {}) if results and results[0] else {}
        return summarize(position, ids, results, bool(verdict.get("keep", True)), verdict.get("reason"), earlier=True)

    async def retry_if_infra(self, args: Any, results: list[list[Sample]], what: str) -> None:
        """Store nothing of a group that hit an infrastructure failure: wait (bounded) for the
        engine to answer, then fail retryably so Temporal generates the group again."""
        infra = _infra_cause(results)
        if infra is None:
            return
        count, cause = infra
        back = await wait_for_engine(router_url(args))
        raise ApplicationError(
            f"{what}: {count} of {sum(len(r) for r in results)} samples hit an infrastructure failure ({cause}); "
            f"nothing stored, the group is generated again {'now' if back else 'when the engine answers'}",
            type=INFRA_FAILURE)
