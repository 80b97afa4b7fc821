"""What an environment's activities need from vime to produce a group: its prompts, a way to
store its rollouts once, the summary the training workflow reads, and (single-turn) the whole
group activity with the environment's own reward.

    args = await ctx.run_args(inp.run_id)                    # the run's config, by its id
    group = await prompt_group(args, inp)                   # the n fresh samples of the prompt
    ... fill each sample: tokens, response, loss_mask, rollout_log_probs, reward ...
    return await store_group(store, inp, {s.rollout_id: [s] for s in group})

or, for a single-turn environment that only brings its reward:

    def start(ctx): return EnvWorkers(activities=[group_activity("my_group", ctx, reward=my_reward)])

`store_group` is idempotent on the rollout ids (the store keeps the first write), so an activity
retried after a crash stores each rollout once; it runs the store calls in a thread, as every
activity must (a write may wait for a lock while the worker's loop sends heartbeats).

Evaluation comes with it: give these functions the group's input (`GroupInput`, or a fanned-out
sample's `SampleInput`) and an eval group (`inp.evaluation`, see workflows/eval_round.py) gets
the samples of its eval prompt (`--eval-prompt-data` set `inp.eval_set`) with their eval rollout
ids (`eval<step>-<set>-<index>`: apart from training's plain indices, so a retry finds them
stored), the eval sampling settings (`sampling_params`), and is stored as the round's eval
samples, never trained (`store_group`, `store_rollout`: `eval_step`). Every sample is checked
against the group's policy version (`check_policy`): in training none may be older, in an eval
round each must be exactly the round's. An environment that reads its prompts and stores through
the SDK is evaluated without a line of its own. The seed's `prompt_group(args, position)` and
`prompt_sample(args, position, index)` still work: a plain position is a training prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from temporalio import activity

from vime.envs.base import EnvContext
from vime.envs.contract import GroupInput, GroupOutput, SampleInput, summarize
from vime.rollout.data_source import make_data_source
from vime.rollout.eval_data import eval_prompt_group, eval_rollout_id, eval_set_args, eval_sets
from vime.rollout.policy_check import check_on_policy, check_one_version
from vime.sample_summary import sampled_by
from vime.temporal.heartbeat import heartbeating
from vime.temporal.retry import final_config_errors
from vime.temporal.store_calls import store_call
from vime.types import Sample

_sources: dict[int, tuple[Any, Any]] = {}  # id(args) -> (args, its data source): one per run's config


def _where(where: Any) -> tuple[int, bool]:
    """(position, evaluation) of a position or an input."""
    if isinstance(where, int):
        return where, False
    return where.position, bool(getattr(where, "evaluation", False))


async def prompt_group(args: Any, where: int | GroupInput | SampleInput) -> list[Sample]:
    """The fresh samples of a prompt (deterministic), each with its `rollout_id` (the store's key):
    of the data source of `args` (a run's config: `EnvContext.run_args`) for a training group
    (`--n-samples-per-prompt`, ids their plain indices), of eval set `where.eval_set` for an eval
    group (`--n-samples-per-eval-prompt`, ids `eval_rollout_id(step, set, index)`). `where` is
    the group's (or a sample's) input, or a plain position (a training prompt)."""
    position, evaluation = _where(where)
    if evaluation:
        group = await store_call(eval_prompt_group, args, where.eval_set, position)
        for s in group:
            s.rollout_id = eval_rollout_id(where.step, where.eval_set, s.index)
        return group
    kept = _sources.get(id(args))
    if kept is None or kept[0] is not args:  # an id is reused once its args are gone
        kept = _sources[id(args)] = (args, await store_call(make_data_source, args))
    group = kept[1].prompt_group(position)
    for s in group:
        s.rollout_id = str(s.index)
    return group


def prompt_file(args: Any, where: int | GroupInput | SampleInput) -> str | None:
    """The file the prompt comes from (`--prompt-data`, or the eval set's): what relative paths in
    its records (a coding task's repository) are relative to."""
    _, evaluation = _where(where)
    return dict(eval_sets(args)).get(where.eval_set) if evaluation else args.prompt_data


def group_args(args: Any, where: Any) -> Any:
    """The config a group is sampled and scored with: the run's `args`, or in an eval round its
    set's view of them (`--eval-config`'s settings for the set laid over the flags they stand for:
    sampling, reward, generate function). `where`: a position, or any input with `evaluation` and
    `eval_set` (a group's, a sample's, an environment's own)."""
    return eval_set_args(args, where.eval_set) if getattr(where, "evaluation", False) else args


def sampling_params(args: Any, where: int | GroupInput | SampleInput, sample: Sample) -> dict[str, Any]:
    """The sampling parameters of `sample` (seeded by its index): the rollout's, or in an eval
    group the eval ones where given (`--eval-temperature`, `--eval-max-response-len`, the set's
    own with `--eval-config`)."""
    from vime.rollout.sampling import params_for_sample, sampling_params_from_args

    args = group_args(args, where)
    return params_for_sample(sampling_params_from_args(args, _where(where)[1]), args, sample)


def check_policy(samples: Iterable[Sample], inp: GroupInput | SampleInput, what: str) -> None:
    """Raise `StalePolicyError` (retried: sampled again) unless every sample's policy versions fit
    the group: in training none older than `inp.weight_version` (a restarted server not synced
    yet); in an eval round exactly `inp.weight_version`, the version the round evaluates."""
    if getattr(inp, "evaluation", False):
        check_one_version(samples, inp.weight_version, f"eval {what}")
    else:
        check_on_policy(samples, inp.weight_version, what)


def _write_kwargs(inp: GroupInput | SampleInput) -> dict[str, Any]:
    return {"eval_step": inp.step} if getattr(inp, "evaluation", False) else {}


def _mark(inp: GroupInput | SampleInput, rid: str, samples: Sequence[Sample]) -> None:
    for s in samples:
        s.rollout_id = rid
        if getattr(inp, "evaluation", False):  # every sibling of an eval rollout, role or segment alike
            s.metadata["weight_version"], s.metadata["eval_set"] = inp.weight_version, inp.eval_set
        else:
            s.metadata.setdefault("weight_version", inp.weight_version)


async def store_group(store: Any, inp: GroupInput, rollouts: Mapping[str, Sequence[Sample]],
                      preview: bool = False) -> GroupOutput:
    """Store the group's rollouts (rollout id -> its samples, in order) and return its summary
    (with `preview`, the texts `finish_group` puts in the memo); every sample gets its
    `rollout_id` and the policy version it was sampled under, and an eval group's are stored as
    its round's eval samples. A group whose samples do not fit its policy version (`check_policy`)
    raises `StalePolicyError`: the activity is retried, and samples again."""
    check_policy((s for samples in rollouts.values() for s in samples), inp, f"group {inp.position} of step {inp.step}")
    for rid, samples in rollouts.items():
        _mark(inp, rid, samples)
    await store_call(store.write_rollouts, inp.run_id, rollouts, **_write_kwargs(inp))
    ids = list(rollouts)
    return summarize(inp.position, ids, [list(rollouts[r]) for r in ids], preview=preview)


async def store_rollout(store: Any, inp: GroupInput | SampleInput, rollout_id: str,
                        samples: Sequence[Sample], *, check: bool = True) -> list:
    """Store one rollout's samples (a fan-out: its siblings, in order) once, as `store_group`
    does a group's (the policy check, `rollout_id`, policy version, eval round); its refs.
    `check=False` stores a rollout recorded as an infrastructure failure as it is."""
    if check:
        check_policy(samples, inp, f"rollout {rollout_id} of step {inp.step}")
    _mark(inp, rollout_id, samples)
    return (await store_call(store.write_rollouts, inp.run_id, {rollout_id: samples}, **_write_kwargs(inp)))[rollout_id]


async def stored_group(store: Any, inp: GroupInput, ids: Sequence[str]) -> GroupOutput | None:
    """The group's summary if all of `ids` are stored already (a retried activity), else None."""
    def read():
        if not all(store.rollout_refs(inp.run_id, rid) for rid in ids):
            return None
        return [store.read_rollout(inp.run_id, rid) for rid in ids]

    results = await store_call(read)
    return None if results is None else summarize(inp.position, list(ids), results, preview=False)


def group_activity(name: str, ctx: EnvContext, reward: Callable[..., Any] | None = None) -> Callable:
    """A single-turn group activity registered as `name`: the prompt's samples generated by the
    run's generate function (`--custom-generate-function-path`, else vime's), scored by
    `reward(args, sample)` (the environment's own: no reward flag needed; None: the run's reward
    flags), tagged `metadata["env"] = name` and stored once. Idempotent (a retry after the write
    returns the stored group); a group with an infrastructure failure is not stored and the
    activity retries; a `ConfigError` fails it for good."""
    from vime.rollout.group import run_group

    store = ctx.store

    @activity.defn(name=name)
    @final_config_errors
    async def generate(inp: GroupInput) -> GroupOutput:
        async with heartbeating():  # the store calls too: a write may wait for SQLite's lock
            args = await ctx.run_args(inp.run_id)
            group = await prompt_group(args, inp)
            ids = [s.rollout_id for s in group]
            if (done := await stored_group(store, inp, ids)) is not None:
                return done
            rollouts = await run_group(group_args(args, inp), group, evaluation=inp.evaluation, reward=reward)
            samples = [s for rollout in rollouts for s in rollout]
            infra = next((s.metadata["infra_failure"] for s in samples if s.metadata.get("infra_failure")), None)
            if infra is not None:  # stored whole or not at all: the retry generates the group again
                raise RuntimeError(f"group {inp.position}: infrastructure failure: {infra}")
            for s in samples:
                s.metadata.setdefault("env", name)
            return await store_group(store, inp, dict(zip(ids, rollouts)), preview=True)

    return generate


async def prompt_sample(args: Any, where: int | GroupInput | SampleInput, index: int | None = None) -> Sample:
    """The fresh `index`-th sample (default: `where.index`, a `SampleInput`'s) of the prompt group
    `prompt_group(args, where)` gives, its `tokens` the prompt's ids (what a multi-turn rollout
    starts from)."""
    from vime.errors import ConfigError
    from vime.rollout.generate import prompt_token_ids

    index = where.index if index is None else index
    group = await prompt_group(args, where)
    if not 0 <= index < len(group):
        raise ConfigError(f"sample {index} of prompt group {_where(where)[0]}: the group has {len(group)}")
    sample = group[index]
    sample.tokens = prompt_token_ids(args, sample)
    return sample


def sampled_here() -> dict[str, str]:
    """Which activity attempt (`sampled_by`, "<activity id>#<attempt>") and which worker (its
    Temporal identity) are sampling now, for a turn's metadata: how `vime show` and the Web UI
    tell a turn a retry sampled after a crash. {} outside an activity."""
    try:
        info = activity.info()
    except RuntimeError:
        return {}
    try:
        worker = activity.client().identity
    except RuntimeError:  # a local activity, or an activity run by hand in a test
        worker = ""
    return {"sampled_by": sampled_by(info.activity_id, info.attempt), **({"worker": worker} if worker else {})}


class TurnLog:
    """A multi-turn rollout's turns in the store (`SampleStore.append_turn`: once each, in order):
    `read()` what earlier attempts finished, `append()` one more. Both run in a store thread, so
    a retried rollout replays its stored turns and continues at the first one not stored.

    Given the rollout's input (`inp`, a `GroupInput` or `SampleInput`), a turn whose `meta` holds
    the `weight_versions` vLLM reported is checked before it is stored (`check_policy`): a turn
    from the wrong weights raises `StalePolicyError`, so the retry samples that turn again. Each
    turn's `meta` records the activity attempt and worker that sampled it (`sampled_here`)."""

    def __init__(self, store: Any, run_id: str, rollout_id: str, inp: GroupInput | SampleInput | None = None) -> None:
        self.store, self.run_id, self.rollout_id, self.inp = store, run_id, rollout_id, inp

    async def read(self) -> list:
        return await store_call(self.store.read_turns, self.run_id, self.rollout_id)

    async def append(self, turn: int, token_ids: list[int], loss_mask: list[int], log_probs: list[float],
                     meta: dict) -> None:
        if self.inp is not None and meta.get("weight_versions"):
            check_policy([Sample(weight_versions=list(meta["weight_versions"]))], self.inp,
                         f"turn {turn} of rollout {self.rollout_id}")
        await store_call(self.store.append_turn, self.run_id, self.rollout_id, turn, token_ids, loss_mask,
                         log_probs, {**sampled_here(), **meta})
