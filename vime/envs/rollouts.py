"""What an environment's activities need from vime to produce a group: its prompts, a way to
store its rollouts once, and the summary the training workflow reads.

    group = await prompt_group(args, inp.position)          # the n fresh samples of the prompt
    ... fill each sample: tokens, response, loss_mask, rollout_log_probs, reward ...
    return await store_group(store, inp, {str(s.index): [s] for s in group})

`store_group` is idempotent on the rollout ids (the store keeps the first write), so an activity
retried after a crash stores each rollout once; it runs the store calls in a thread, as every
activity must (a write may wait for a lock while the worker's loop sends heartbeats).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from activities.rollout import summarize
from activities.store_calls import store_call
from vime.rollout.data_source import make_data_source
from vime.rollout.policy_check import check_on_policy
from vime.types import Sample
from workflows.rollout import RolloutInput, RolloutOutput

_sources: dict[int, Any] = {}


async def prompt_group(args: Any, position: int) -> list[Sample]:
    """The `--n-samples-per-prompt` fresh samples of the prompt at `position` (deterministic)."""
    source = _sources.get(id(args))
    if source is None:
        source = _sources[id(args)] = await store_call(make_data_source, args)
    return source.prompt_group(position)


async def store_group(store: Any, inp: RolloutInput, rollouts: Mapping[str, Sequence[Sample]]) -> RolloutOutput:
    """Store the group's rollouts (rollout id -> its samples, in order) and return its summary;
    every sample gets its `rollout_id` and the policy version it was sampled under. A group
    sampled (partly) from weights older than `inp.weight_version` (a restarted server not synced
    yet) raises `StalePolicyError`: the activity is retried, and samples again."""
    check_on_policy((s for samples in rollouts.values() for s in samples), inp.weight_version,
                    f"group {inp.position} of step {inp.step}")
    for rid, samples in rollouts.items():
        for s in samples:
            s.rollout_id = rid
            s.metadata.setdefault("weight_version", inp.weight_version)
    await store_call(store.write_rollouts, inp.run_id, rollouts)
    ids = list(rollouts)
    return summarize(inp.position, ids, [list(rollouts[r]) for r in ids], preview=False)


async def stored_group(store: Any, inp: RolloutInput, ids: Sequence[str]) -> RolloutOutput | None:
    """The group's summary if all of `ids` are stored already (a retried activity), else None."""
    def read():
        if not all(store.rollout_refs(inp.run_id, rid) for rid in ids):
            return None
        return [store.read_rollout(inp.run_id, rid) for rid in ids]

    results = await store_call(read)
    return None if results is None else summarize(inp.position, list(ids), results, preview=False)
