"""One prompt group, generated and scored: the unit of work of a rollout activity.

`run_group(args, group)` runs the generate function (`--custom-generate-function-path`, else
`vime.rollout.generate.generate`) on every sample of the group concurrently, then the reward
function where the generate function left the reward unset, and returns one list of siblings
per rollout (a single-sample rollout is a list of one; a fan-out is the list the hook returned).

Invariants of the result, relied on by the store and the trainer:
- `session_id` (the routing key that keeps a multi-turn session on one server) defaults to
  `f"{--run-id}-{sample.index}"`;
- every sibling of a rollout has the same `rollout_id`: the hook's, else `f"{sample.index}"`
  (the rollout of sample index i, stable across retries), and the same `group_index`;
- a fan-out the generate function left unrewarded gets one reward: the reward function scores
  the *last* sibling (the end of the trajectory, where the outcome is) and every sibling gets
  that reward; a generate function may instead reward each sibling itself (a multi-agent
  system scoring each role's turn), and those rewards are kept;
- a failed generate never fails the group: a generate that raised, or ran past
  `--custom-generate-timeout`, becomes a FAILED copy of the input sample with `metadata["error"]`
  and the hook that raised in `metadata["error_source"]`. When the error is an infrastructure
  one (`is_infra_error`: engine down, a cut connection, a 5xx, no progress)
  `metadata["infra_failure"]` holds the cause, its reward stays None and it is kept out of
  advantage statistics. Other failures (the model or the agent broke something, an HTTP 4xx the
  hook's request earned, a timeout) are the hook's: `metadata["hook_failure"]` holds one line
  naming the hook, the sample and the file:line, and the reward is `FAILED_REWARD`. A
  `ConfigError` (a misconfiguration, a hook breaking the Sample contract, a reward that is NaN or
  not a number) is not data and propagates;
- a reward function that raised or timed out on a rollout (`SampleRewardError`) fails that
  rollout the same way (FAILED, `hook_failure`), with no reward; with `--group-rm` the call
  covers the group, so the group's rollouts fail together. Groups holding failed samples are
  dropped whole by the rollout activity (see `activities.rollout`), never trained;
- ABORTED rollouts (engine aborted them, e.g. for a weight sync) are not scored: they are for
  `data_source.add_samples`, to be continued, not trained on.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Callable
from typing import Any


from vime.errors import ConfigError, ServiceError
from vime.log import get_logger
from vime.plugins import call_hook_async, load_function
from vime.rollout import generate as default_generate
from vime.rollout.phase_times import timed
from vime.rollout.failures import is_infra_error
from vime.rollout.hook_calls import HookTimeout, call_limited, hook_label, user_frame
from vime.rollout.rewards import SampleRewardError, group_rewards
from vime.rollout.sampling import params_for_sample, sampling_params_from_args
from vime.types import Sample

log = get_logger(__name__)

FAILED_REWARD = 0.0
"""Reward of a rollout that failed for a non-infrastructure reason and has no reward of its own."""

_FINISHED = (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)


def _generate_hook(args: Any) -> tuple[Callable[..., Any], str]:
    path = args.custom_generate_function_path
    if path is None:
        return default_generate.generate, "vime.rollout.generate.generate"
    return load_function(path, "--custom-generate-function-path"), f"--custom-generate-function-path {path!r}"


async def _call_generate(args: Any, hook: Callable[..., Any], *call_args: Any, evaluation: bool) -> Any:
    """The user's generate hook within `--custom-generate-timeout` (a sync one in a thread); the
    built-in generate as is (its engine client has its own no-progress timeout)."""
    path = args.custom_generate_function_path
    if path is None:
        return await call_hook_async(hook, args, *call_args, evaluation=evaluation)
    return await call_limited(hook, hook_label("--custom-generate-function-path", path),
                              float(args.custom_generate_timeout or 0), args, *call_args,
                              run_id=args.run_id, evaluation=evaluation)


def _as_siblings(result: Any, source: str) -> list[Sample]:
    siblings = result if isinstance(result, list) else [result]
    if not siblings or not all(isinstance(s, Sample) for s in siblings):
        what = "an empty list" if isinstance(result, list) and not result else type(result).__name__
        if isinstance(result, list) and result:
            what = "a list holding " + ", ".join(sorted({type(s).__name__ for s in result}))
        raise ConfigError(f"{source} returned {what}; a generate function returns a Sample or a non-empty list[Sample]")
    return siblings


def _mark_failed(original: Sample, exc: Exception, source: str, hook: Callable[..., Any] | None = None) -> Sample:
    sample = original
    cause = f"{type(exc).__name__}: {exc}"
    infra = is_infra_error(exc)
    if infra:
        _fail(sample, cause, source)
        sample.metadata["infra_failure"] = cause
    else:
        on = f" on sample {sample.index}" if sample.index is not None else ""
        line = (f"{exc}{on}" if isinstance(exc, HookTimeout)
                else f"{source} raised {cause}{on}{user_frame(exc, hook)}")
        _fail(sample, cause, source, line)
    log.warning("rollout.generate.failed", index=sample.index, hook=source, error=cause, infra=infra)
    return sample


def _fail(sample: Sample, cause: str, source: str, line: str | None = None) -> None:
    """Mark `sample` FAILED: the error, the hook that raised and (a hook's failure, which the
    step counts) the one line that says where."""
    sample.status = Sample.Status.FAILED
    sample.metadata = dict(sample.metadata or {})
    sample.metadata.update(error=cause, error_source=source)
    if line is not None:
        sample.metadata["hook_failure"] = line


def _assign_ids(siblings: list[Sample], original: Sample, source: str) -> None:
    ids = {s.rollout_id for s in siblings if s.rollout_id is not None}
    if len(ids) > 1:
        raise ConfigError(
            f"{source} returned siblings with rollout ids {sorted(map(str, ids))}; the samples of one "
            "rollout share one rollout_id (leave it unset and vime sets it)"
        )
    rollout_id = ids.pop() if ids else (f"{original.index}" if original.index is not None else uuid.uuid4().hex)
    for s in siblings:
        s.rollout_id = rollout_id
        if s.group_index is None:
            s.group_index = original.group_index
        if not isinstance(s.metadata, dict):
            s.metadata = dict(s.metadata or {})


async def _generate_rollout(args: Any, hook: Callable[..., Any], source: str, sample: Sample,
                            params: dict[str, Any], evaluation: bool) -> list[Sample]:
    if sample.session_id is None:
        run = args.run_id or "run"
        sample.session_id = f"{run}-{sample.index}" if sample.index is not None else uuid.uuid4().hex
    if sample.status in _FINISHED and sample.response_length > 0:
        siblings = [sample]  # finished earlier (a group handed back to the data source)
    else:
        original = copy.deepcopy(sample)
        try:
            result = await _call_generate(args, hook, sample, params, evaluation=evaluation)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed rollout is data, see the module docstring
            siblings = [_mark_failed(original, exc, source, hook)]
        else:
            siblings = _as_siblings(result, source)
        sample = original
    _assign_ids(siblings, sample, source)
    return siblings


def _is_infra(rollout: list[Sample]) -> bool:
    return any((s.metadata or {}).get("infra_failure") for s in rollout)


def _copy_reward(rollout: list[Sample], value: Any) -> None:
    for s in rollout:
        s.reward = copy.deepcopy(value)


async def score_rollouts(args: Any, rollouts: list[list[Sample]], reward: Callable[..., Any] | None = None) -> None:
    """Fill the rewards the generate function left unset (see the module docstring for the rules),
    with `reward(args, sample)` when given (an environment's own), else the run's reward flags."""
    pending: list[list[Sample]] = []
    for rollout in rollouts:
        if _is_infra(rollout):
            cause = next(s.metadata["infra_failure"] for s in rollout if s.metadata.get("infra_failure"))
            for s in rollout:
                s.metadata.setdefault("infra_failure", cause)
            continue
        known = next((s.reward for s in reversed(rollout) if s.reward is not None), None)
        if known is not None:
            for s in rollout:
                if s.reward is None:
                    s.reward = copy.deepcopy(known)
        elif any(s.status == Sample.Status.FAILED for s in rollout):
            _copy_reward(rollout, FAILED_REWARD)
        elif not any(s.status == Sample.Status.ABORTED for s in rollout):
            pending.append(rollout)
    if not pending:
        return
    try:
        env_rm = None if reward is None else (reward, f"environment reward {hook_name(reward)}")
        values = await group_rewards(args, [rollout[-1] for rollout in pending], env_rm)
    except SampleRewardError as exc:  # this rollout's (with --group-rm: these rollouts') reward failed
        line = str(exc)
        log.warning("rollout.reward.failed", error=line, rollouts=len(pending))
        for rollout in pending:
            for s in rollout:
                _fail(s, line, env_rm[1] if env_rm else f"--custom-rm-path {args.custom_rm_path!r}",
                      line)
                s.reward = None
        return
    except ServiceError as exc:
        cause = f"reward: {type(exc).__name__}: {exc}"
        log.warning("rollout.reward.failed", error=cause, rollouts=len(pending))
        for rollout in pending:
            for s in rollout:
                s.metadata["infra_failure"] = cause
        return
    for rollout, value in zip(pending, values, strict=True):
        _copy_reward(rollout, value)


async def gather_or_cancel(coros: list[Any]) -> list[Any]:
    """`asyncio.gather`, but the first exception cancels the siblings instead of orphaning them."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def run_group(args: Any, group: list[Sample], *, evaluation: bool = False,
                    sampling_params: dict[str, Any] | None = None,
                    reward: Callable[..., Any] | None = None) -> list[list[Sample]]:
    """Generate and score one prompt group; one list of siblings per input sample, in input order.

    `reward(args, sample)` (sync or async) is an environment's own reward: it scores the group
    instead of the run's reward flags, which then need not be set (`--group-rm` does not apply).

    `sampling_params` defaults to `sampling_params_from_args(args, evaluation)`; each sample gets
    its own copy with its seed. With `--group-rm` the reward function sees the whole group at
    once (the last sibling of each rollout that still needs a reward); otherwise each rollout is
    scored as soon as it is generated.
    """
    base = sampling_params if sampling_params is not None else sampling_params_from_args(args, evaluation)
    hook, source = _generate_hook(args)
    group_rm = reward is None and bool(args.group_rm)

    async def one(sample: Sample) -> list[Sample]:
        params = params_for_sample(base, args, sample)
        siblings = await _generate_rollout(args, hook, source, sample, params, evaluation)
        if not group_rm:
            with timed("reward"):
                await score_rollouts(args, [siblings], reward)
        return siblings

    rollouts = await gather_or_cancel([one(s) for s in group])
    if group_rm:
        with timed("reward"):
            await score_rollouts(args, rollouts)
    return rollouts


def hook_name(fn: Callable[..., Any]) -> str:
    """`module.qualname` of a function, for error lines."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
