"""The default `--rollout-function-path`: a whole rollout step on the vLLM servers.

`generate_rollout(args, rollout_id, data_source, evaluation=False)` is slime's rollout function
contract, used when the orchestration runs a rollout step as one activity, and standalone. It
pulls prompt groups from the data source `--over-sampling-batch-size` at a time, runs them
concurrently with `run_group`, applies the dynamic-sampling filter to each finished group, and
stops once `--rollout-batch-size` groups are kept. Groups still running then are cancelled and
handed back to the data source untouched (`add_samples`), so their prompts are not skipped.

Sampling is bounded: after `MAX_GROUPS_FACTOR x --rollout-batch-size` groups, or when the data
source runs dry, the batch is completed with dropped groups (most recent first) and, failing
that, returned short, with a warning either way, rather than looping forever on a filter that
drops everything.

Unlike slime's (synchronous) function this one is `async`: it runs inside the orchestration's
event loop. `generate_rollout_sync` runs it from plain scripts.

The result is one list of samples per kept group, sorted by sample index; a group's fan-out
siblings are flattened into it and keep their shared `rollout_id`.
"""

from __future__ import annotations

import asyncio
import collections
import copy
from typing import Any

from vime.errors import ConfigError
from vime.log import get_logger
from vime.rollout.eval_data import eval_dataset, eval_prompt_group, eval_set_args, eval_sets
from vime.rollout.filters import apply_dynamic_filter
from vime.rollout.generate import close_engine_clients
from vime.rollout.group import gather_or_cancel, run_group
from vime.types import Sample

log = get_logger(__name__)

MAX_GROUPS_FACTOR = 8
"""At most this many times `--rollout-batch-size` groups are sampled for one rollout step.

A safety bound against a filter that drops (nearly) everything, not a tuning knob: a run that
keeps fewer than 1 group in 8 is better served by a warning (`rollout.short`) than by a flag."""



def _flatten(rollouts: list[list[Sample]]) -> list[Sample]:
    return [s for siblings in rollouts for s in siblings]


def _order(group: list[Sample]) -> tuple[int, int]:
    first = group[0]
    return (first.group_index if first.group_index is not None else -1, first.index if first.index is not None else -1)


async def generate_rollout(
    args: Any, rollout_id: int, data_source: Any, evaluation: bool = False
) -> list[list[Sample]]:
    """One rollout step: `--rollout-batch-size` kept groups (or eval groups when `evaluation`)."""
    if evaluation:
        return await eval_rollout(args, rollout_id)
    target = args.rollout_batch_size
    if not target:
        raise ConfigError("--rollout-batch-size is not set; it is the number of prompt groups per rollout step")
    over = args.over_sampling_batch_size or target
    max_groups = MAX_GROUPS_FACTOR * target

    kept: list[list[Sample]] = []
    dropped: list[list[Sample]] = []
    reasons: collections.Counter[str] = collections.Counter()
    pending: dict[asyncio.Future, list[Sample]] = {}
    pulled, exhausted = 0, False
    try:
        while len(kept) < target:
            while not exhausted and len(kept) + len(pending) < target and pulled < max_groups:
                want = min(over, max_groups - pulled)
                groups = data_source.get_samples(want)
                exhausted = len(groups) < want
                pulled += len(groups)
                for group in groups:
                    pending[asyncio.ensure_future(run_group(args, group))] = copy.deepcopy(group)
            if not pending:
                break
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda t: _order(pending[t])):
                pending.pop(task)
                rollouts = task.result()
                keep, reason = apply_dynamic_filter(args, rollouts)
                if not keep:
                    reasons[str(reason)] += 1
                    dropped.append(_flatten(rollouts))
                elif len(kept) < target:
                    kept.append(_flatten(rollouts))
    finally:
        unfinished = list(pending.values())
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        _hand_back(data_source, unfinished)

    if len(kept) < target:
        fill = dropped[::-1][: target - len(kept)]
        log.warning("rollout.short", rollout_id=rollout_id, kept=len(kept), wanted=target, sampled=pulled,
                    data_exhausted=exhausted, filled_with_dropped=len(fill), drop_reasons=dict(reasons))
        kept += fill
    elif reasons:
        log.info("rollout.filtered", rollout_id=rollout_id, dropped=sum(reasons.values()), reasons=dict(reasons))
    return sorted(kept, key=_order)


def _hand_back(data_source: Any, groups: list[list[Sample]]) -> None:
    """Give unstarted prompt groups back to the data source, when it takes them (slime's read-only
    sources raise); otherwise their prompts are skipped, as in slime."""
    if not groups:
        return
    add = getattr(data_source, "add_samples", None)
    try:
        if add is None:
            raise NotImplementedError
        add(sorted(groups, key=_order))
    except (NotImplementedError, RuntimeError) as exc:
        log.info("rollout.unfinished_dropped", groups=len(groups), reason=repr(exc))


# ---- evaluation ----------------------------------------------------------------------------------


async def eval_rollout(args: Any, rollout_id: int) -> list[list[Sample]]:
    """Every prompt of every `--eval-prompt-data` set, `--n-samples-per-eval-prompt` times (one
    group per prompt), with evaluation sampling (each set's own settings with `--eval-config`);
    samples carry `metadata["eval_set"]` and rollout ids `eval-<set>-<index>`, apart from the
    training run's."""
    sets = eval_sets(args)
    if not sets:
        raise ConfigError("evaluation needs --eval-prompt-data (name path pairs)")
    groups = []
    for name, _ in sets:
        for i in range(len(eval_dataset(args, name))):
            group = eval_prompt_group(args, name, i)
            for sample in group:
                sample.rollout_id = f"eval-{name}-{sample.index}"
            groups.append((eval_set_args(args, name), group))
    results = await gather_or_cancel([run_group(set_args, g, evaluation=True) for set_args, g in groups])
    return [_flatten(r) for r in results]


def eval_results(args: Any, groups: list[list[Sample]]) -> dict[str, dict[str, list[Any]]]:
    """slime's eval output: per set, `rewards` (scalar, `--reward-key` applied), `truncated`, `samples`."""
    from vime.rollout.rewards import reward_value

    out: dict[str, dict[str, list[Any]]] = {}
    for sample in sorted((s for g in groups for s in g), key=lambda s: s.index or 0):
        entry = out.setdefault(sample.metadata.get("eval_set", "eval"), {"rewards": [], "truncated": [], "samples": []})
        entry["rewards"].append(reward_value(args, sample))
        entry["truncated"].append(sample.status == Sample.Status.TRUNCATED)
        entry["samples"].append(sample)
    return out


def generate_rollout_sync(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> list[list[Sample]]:
    """`generate_rollout` from synchronous code (a script, slime's calling convention)."""

    async def main() -> list[list[Sample]]:
        try:
            return await generate_rollout(args, rollout_id, data_source, evaluation)
        finally:
            await close_engine_clients()

    return asyncio.run(main())
