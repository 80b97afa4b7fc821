"""The eval round's activities (see workflows/eval_round.py): what a round evaluates, one eval
group generated and stored once, slime's `--eval-function-path` hook for a whole round, the
round's figures recorded once, and (`vime eval`) a checkpoint's weights loaded into the servers.

Every eval sample is stored with its round's step (`write_rollouts(..., eval_step=step)`) under
a rollout id made of the round, the set and the sample's index (`eval_rollout_id`): a retried
activity finds it stored and answers from the store, so no eval prompt is sampled or graded
twice, and the trainer never sees it (the store refuses an eval sample in a manifest). A sample
is kept only if the servers sampled it with exactly the round's policy version; otherwise (a
server restarted and not synced yet) the group is sampled again, as a training group would be.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from temporalio import activity

from activities.hook_notices import watch_hooks
from vime.envs.contract import summarize
from vime.envs.rollouts import store_group
from vime.errors import ConfigError
from vime.plugins import call_hook_async, load_hook
from vime.rollout.data_source import make_data_source
from vime.rollout.eval_data import eval_dataset, eval_prompt_group, eval_rollout_id, eval_set_args, eval_sets
from vime.rollout.eval_metrics import ScoredSample, round_metrics
from vime.rollout.generate import serving_adapter
from vime.rollout.group import run_group
from vime.rollout.policy_check import check_one_version
from vime.rollout.rewards import reward_value
from vime.sample_summary import failure_class
from vime.engine.weight_sync.checkpoint_load import engine_urls, load_checkpoint_weights
from vime.temporal.eval_contract import LOAD_CHECKPOINT, LoadCheckpointInput
from vime.temporal.heartbeat import heartbeating, heartbeats_throughout
from vime.temporal.retry import final_config_errors
from vime.temporal.store_calls import store_call
from vime.types import Sample
from workflows.eval_round import EVAL_BY_FUNCTION, EVAL_PLAN, RECORD_EVAL, EvalPlan, EvalRoundInput, EvalSet
from workflows.rollout import RolloutInput, RolloutOutput


def _mark(samples_by_rollout: dict[str, list[Sample]], version: int) -> None:
    for rid, samples in samples_by_rollout.items():
        for s in samples:
            s.rollout_id = rid
            s.metadata["weight_version"] = version


class EvalActivities:
    """Eval rounds for any run: each call reads the run's config by run id, as the rollout
    activities do (`RolloutActivities.runs`, `.store`)."""

    def __init__(self, rollouts: Any) -> None:
        self.rollouts = rollouts
        self.runs, self.store = rollouts.runs, rollouts.store

    def all(self) -> list:
        return [self.eval_plan, self.evaluate_by_function, self.record_eval, self.load_checkpoint]

    @activity.defn(name=EVAL_PLAN)
    @final_config_errors
    @heartbeats_throughout
    async def eval_plan(self, inp: EvalRoundInput) -> EvalPlan:
        """The round's sets and their sizes, or the round's figures if it is recorded already."""
        def plan() -> EvalPlan:
            recorded = self.store.read_eval_round(inp.run_id, inp.step)
            if recorded is not None:
                return EvalPlan(recorded=recorded.metrics)
            args = self.runs.args(inp.run_id)
            return EvalPlan([EvalSet(name, len(eval_dataset(args, name)),
                                     eval_set_args(args, name).n_samples_per_eval_prompt)
                             for name, _ in eval_sets(args)])
        return await store_call(plan)

    async def evaluate_group(self, inp: RolloutInput) -> RolloutOutput:
        """One eval prompt's group (`generate_group` with `inp.evaluation`): sampled with the eval
        settings (the set's own, with `--eval-config`: its sampling, generate and reward), scored,
        stored once as eval samples of the round; never filtered."""
        args, _ = await self.rollouts.run_context(inp.run_id)
        group = eval_prompt_group(args, inp.eval_set, inp.position)
        set_args = eval_set_args(args, inp.eval_set)
        ids = [eval_rollout_id(inp.step, inp.eval_set, s.index) for s in group]
        stored = await store_call(self.rollouts.stored_group, inp.run_id, ids)
        if stored is not None:
            return summarize(inp.position, ids, stored, earlier=True)
        if activity.in_activity():
            watch_hooks(activity.client())
        async with heartbeating():
            with serving_adapter(args, inp.run_id, inp.weight_version):  # a LoRA run: the round's adapter
                results = await run_group(set_args, group, evaluation=True)
            await self.rollouts.retry_if_infra(args, results, f"eval group {inp.eval_set}/{inp.position}")
        # the SDK's store: exactly the round's version (else sampled again), stored as the round's eval samples
        return await store_group(self.store, inp, dict(zip(ids, results)), preview=True)

    @activity.defn(name=EVAL_BY_FUNCTION)
    @final_config_errors
    @heartbeats_throughout
    async def evaluate_by_function(self, inp: EvalRoundInput) -> int:
        """A round by slime's hook, `--eval-function-path` (else `--rollout-function-path`):
        `fn(args, rollout_id=step, data_source, evaluation=True)`, returning slime's
        `{set: {"rewards", "truncated", "samples"}}` (or an object whose `.data` is that) or eval
        groups (`list[list[Sample]]`, each sample's set in `metadata["eval_set"]`). Its samples
        are stored once; a retry after the write stores nothing and calls nothing. Returns how
        many samples the round holds."""
        stored = await store_call(self.store.count_samples, inp.run_id, eval_step=inp.step)
        if stored:
            return stored
        args, _ = await self.rollouts.run_context(inp.run_id)
        fn = load_hook(args, "eval_function_path") or load_hook(args, "rollout_function_path")
        if activity.in_activity():
            watch_hooks(activity.client())
        async with heartbeating():
            output = await call_hook_async(fn, args, inp.step, make_data_source(args), evaluation=True)
        rollouts: dict[str, list[Sample]] = {}
        for name, samples in _by_set(output).items():
            for i, s in enumerate(samples):
                s.metadata["eval_set"] = name
                if s.group_index is None:
                    s.group_index = i // max(1, _samples_per_prompt(args, name))
                rollouts[eval_rollout_id(inp.step, name, s.index if s.index is not None else i)] = [s]
        if not rollouts:
            raise ConfigError(f"--eval-function-path returned no eval sample for the round at step {inp.step}")
        check_one_version((s for r in rollouts.values() for s in r), inp.weight_version,
                          f"the eval round at step {inp.step}")
        _mark(rollouts, inp.weight_version)
        await store_call(self.store.write_rollouts, inp.run_id, rollouts, eval_step=inp.step)
        return len(rollouts)

    @activity.defn(name=LOAD_CHECKPOINT)
    @final_config_errors
    async def load_checkpoint(self, inp: LoadCheckpointInput) -> dict:
        """`vime eval`: the checkpoint's weights pushed into the run's rollout servers as policy
        `inp.weight_version`, before its round samples (again after a relaunch: fresh servers)."""
        args = self.runs.args(inp.run_id)
        urls = engine_urls(args if args.vllm_server_urls or args.vllm_router_ip else self.runs.worker_args)
        async with heartbeating():
            return await load_checkpoint_weights(urls, inp.path, inp.weight_version)

    @activity.defn(name=RECORD_EVAL)
    @final_config_errors
    @heartbeats_throughout
    async def record_eval(self, inp: EvalRoundInput) -> dict:
        """The round's figures from its stored samples, recorded once (a retry, or the round of a
        restarted run, gets the recorded figures back)."""
        def record() -> dict:
            recorded = self.store.read_eval_round(inp.run_id, inp.step)
            if recorded is not None:
                return recorded.metrics
            args = self.runs.args(inp.run_id)
            by_set: dict[str, list[ScoredSample]] = {name: [] for name, _ in eval_sets(args)}
            for s in _last_of_each_rollout(self.store.iter_samples(inp.run_id, evaluation=True, eval_step=inp.step)):
                failed = s.status == Sample.Status.FAILED
                by_set.setdefault(s.metadata.get("eval_set", "eval"), []).append(ScoredSample(
                    s.group_index if s.group_index is not None else -1,
                    None if failed else reward_value(args, s), s.status.value, s.response_length,
                    failure_class(s.status.value, s.metadata or {})))
            metrics = {**round_metrics(by_set), "eval_seconds": inp.seconds,
                       "eval_weight_version": inp.weight_version}
            return self.store.write_eval_round(inp.run_id, inp.step, inp.weight_version, metrics).metrics
        return await store_call(record)


def _samples_per_prompt(args: Any, name: str) -> int:
    """Set `name`'s samples per prompt (a set the hook made up: the flag's)."""
    known = name in dict(eval_sets(args))
    return (eval_set_args(args, name) if known else args).n_samples_per_eval_prompt


def _last_of_each_rollout(stored: Iterable[tuple[Any, Sample]]) -> list[Sample]:
    """One sample per eval rollout, its last sibling (the store yields them in write order): a
    fan-out (an agent's segments, a team's roles) is one attempt at its prompt, scored once, as
    the group summary counts it."""
    last: dict[str, Sample] = {}
    for ref, s in stored:
        last[ref.rollout_id] = s
    return list(last.values())


def _by_set(output: Any) -> dict[str, list[Sample]]:
    """The samples of an eval hook's output, by set."""
    data = output.data if hasattr(output, "data") and not isinstance(output, dict) else output
    if isinstance(data, dict):
        out = {}
        for name, entry in data.items():
            samples = entry.get("samples") if isinstance(entry, dict) else entry
            if not isinstance(samples, list) or not all(isinstance(s, Sample) for s in _flatten(samples)):
                raise ConfigError(f"--eval-function-path: set {name!r} holds no list of Samples (slime's "
                                  "{set: {'rewards', 'truncated', 'samples'}}): vime stores and scores the samples")
            out[str(name)] = _flatten(samples)
        return out
    if isinstance(data, list):
        out: dict[str, list[Sample]] = {}
        for s in _flatten(data):
            if not isinstance(s, Sample):
                raise ConfigError(f"--eval-function-path returned a list holding {type(s).__name__}, not Samples")
            out.setdefault(str(s.metadata.get("eval_set", "eval")), []).append(s)
        return out
    raise ConfigError(f"--eval-function-path returned {type(output).__name__}; expected slime's "
                      "{set: {'rewards', 'truncated', 'samples'}} or a list of Sample groups")


def _flatten(items: list) -> list:
    return [s for item in items for s in (item if isinstance(item, list) else [item])]
