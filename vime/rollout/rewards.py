"""The reward hub: which function scores a sample, and calling it.

In order of precedence, as in slime:
1. `--custom-rm-path`: `async rm(args, sample, **kwargs) -> float` (or dict), or with
   `--group-rm` a batched `rm(args, samples) -> list[float]` called once per group;
2. `--rm-type remote_rm`, or `--rm-url` with no `--rm-type`: POST the sample (its `to_dict()`,
   a superset of slime's prompt/response/label payload) as JSON to the URL, read back a number
   or `{"reward": x}` (any other object is kept whole, for `--reward-key`);
3. a built-in `--rm-type` (or `metadata["rm_type"]` per sample): `math`, `exact_match`, `f1`,
   `random`; the prefix `boxed_` scores the last `\\boxed{}` of the response instead of all of it.

A reward may be a dict (several scores); `reward_value` picks `--reward-key` from it. Errors
name the hook or URL: a reward service that cannot be reached raises `ServiceError` (an infra
failure, retried), as does a user reward function whose own HTTP client lost its service (a
reward model's server that died and is being restarted), a misconfiguration `ConfigError`. A user
reward function that returns NaN, infinity or a non-number raises `RewardError` (a `ConfigError`,
so it is never retried) naming the hook: a broken contract must stop the run, not zero it. One
that raises, or runs past `--custom-rm-timeout`, raises `SampleRewardError` naming the hook, the
sample and the file:line: the rollout group stores that sample FAILED and the run goes on while
the failed share stays under `--max-failed-sample-ratio` (callers that record no failed samples,
such as `vime rescore`, stop on it as on any `RewardError`).
"""

from __future__ import annotations

import asyncio
import json
import math
import numbers
import random
import sys
from collections.abc import Callable
from typing import Any

import aiohttp

from vime.errors import ConfigError, ServiceError
from vime.plugins import load_function
from vime.rollout import math_grader
from vime.rollout.hook_calls import HookTimeout, call_limited, hook_label, user_frame
from vime.rollout.failures import is_infra_error
from vime.types import Sample

REMOTE_RM_ATTEMPTS = 3
REMOTE_RM_TIMEOUT_S = 120.0
REMOTE_RM_BACKOFF_S = 1.0

BUILTIN_RMS: dict[str, Callable[[str, Any], float]] = {
    "math": math_grader.math_score,
    "exact_match": math_grader.exact_match_score,
    "f1": math_grader.f1_score,
    "random": lambda response, label: float(random.randint(0, 1)),
}


def _custom_rm(args: Any) -> tuple[Callable[..., Any], str] | None:
    path = args.custom_rm_path
    if path is None:
        return None
    return load_function(path, "--custom-rm-path"), f"--custom-rm-path {path!r}"


class RewardError(ConfigError):
    """A reward function that raised or returned something that is not a reward."""


class SampleRewardError(RewardError):
    """A reward function that raised (or timed out) on particular samples: those samples fail."""


def check_reward(value: Any, source: str) -> float | dict[str, Any]:
    """A reward as vime stores it: a finite float (ints and bools converted, numpy's too) or a dict
    of scores (numpy scalars in it made Python numbers, so the dict stores as JSON)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    value = _plain(value)
    if isinstance(value, numbers.Real):
        if not math.isfinite(float(value)):
            raise RewardError(f"{source} returned {value!r}; a reward must be a finite number")
        return float(value)
    raise RewardError(
        f"{source} returned {type(value).__name__} {str(value)[:80]!r}; a reward is a number "
        "(or a dict of scores, with --reward-key naming the one to train on)"
    )


def _plain(value: Any) -> Any:
    """A numpy scalar (`np.float32(0.5)`, `np.bool_(True)`, a 0-d array) as the Python value it
    holds: a reward computed with numpy is a number like any other (`np.bool_` is not a
    `numbers.Real`, unlike Python's bool). Anything else as is. numpy is not imported for this:
    a numpy value means it already is."""
    np = sys.modules.get("numpy")
    if np is not None and (isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0)):
        return value.item()
    return value


def reward_value(args: Any, reward: Any) -> float | None:
    """The scalar to train on: the reward, or `reward[--reward-key]` when it is a dict."""
    if isinstance(reward, Sample):
        reward = reward.reward
    if isinstance(reward, dict):
        key = args.reward_key
        if key is None or key not in reward:
            raise ConfigError(f"a reward is a dict with keys {sorted(reward)}; set --reward-key to the scalar to use")
        reward = reward[key]
    return None if reward is None else float(reward)


async def _call_user_rm(fn: Callable[..., Any], source: str, *args: Any, env: bool = False) -> Any:
    rm_args = args[0]
    target = args[1] if len(args) > 1 else None
    which = (f" on sample {target.index}" if isinstance(target, Sample) and target.index is not None
             else f" on a batch of {len(target)} samples" if isinstance(target, list) else "")
    label = source if env else hook_label("--custom-rm-path", rm_args.custom_rm_path or source)
    try:
        return await call_limited(fn, label, float(rm_args.custom_rm_timeout or 0), *args,
                                  run_id=rm_args.run_id)
    except (ConfigError, ServiceError):
        raise
    except HookTimeout as exc:
        raise SampleRewardError(f"{exc}{which}") from None
    except Exception as exc:  # noqa: BLE001 - a bug in the user's function: that sample fails, named
        where = user_frame(exc, fn)
        if is_infra_error(exc):  # its reward model's server died or hung up: retried, as a generate is
            raise ServiceError(f"{source} could not reach its service: {type(exc).__name__}: {exc}{which}{where}") \
                from exc
        raise SampleRewardError(f"{source} raised {type(exc).__name__}: {exc}{which}{where}") from exc


async def env_reward(fn: Callable[..., Any], source: str, args: Any, sample: Sample) -> float | dict[str, Any]:
    """Score one sample with an environment's own reward function, `fn(args, sample)` (sync or
    async): the run's reward flags are not consulted. Its failures are a user reward's (a raise
    or `--custom-rm-timeout` fails the sample, a non-number stops the run), named by `source`."""
    return check_reward(await _call_user_rm(fn, source, args, sample, env=True), source)


async def reward(args: Any, sample: Sample) -> float | dict[str, Any]:
    """Score one sample with the configured reward function (see the module docstring)."""
    custom = _custom_rm(args)
    if custom is not None:
        fn, source = custom
        if args.group_rm:  # a batched function: a group of one
            values = await _call_user_rm(fn, source, args, [sample])
            return _check_batch(values, 1, source)[0]
        return check_reward(await _call_user_rm(fn, source, args, sample), source)
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    rm_type = str(metadata.get("rm_type") or args.rm_type or "").strip()
    if rm_type == "remote_rm" or (not rm_type and args.rm_url):
        return await remote_reward(args, sample)
    if not rm_type:
        raise ConfigError(
            "no reward function: set --custom-rm-path, --rm-url or --rm-type "
            f"(built-in types: {', '.join(sorted(BUILTIN_RMS))}, remote_rm; prefix boxed_ to grade the boxed answer)"
        )
    response = sample.response or ""
    name = rm_type
    if name.startswith("boxed_"):
        response = math_grader.last_boxed(response) or ""
        name = name[len("boxed_"):]
    fn = BUILTIN_RMS.get(name)
    if fn is None:
        raise ConfigError(
            f"--rm-type {rm_type!r} is not a built-in reward; use one of {', '.join(sorted(BUILTIN_RMS))}, "
            "remote_rm (with --rm-url), a boxed_ prefix, or --custom-rm-path"
        )
    return float(fn(response, sample.label))


def _check_batch(values: Any, n: int, source: str) -> list[float | dict[str, Any]]:
    """A batched reward function's answer: a list (or tuple, or 1-d numpy array) of `n` rewards."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(values, np.ndarray) and values.ndim == 1:
        values = list(values)  # numpy scalars, each checked (and converted) as one reward
    if not isinstance(values, (list, tuple)) or len(values) != n:
        got = f"{len(values)} values" if isinstance(values, (list, tuple)) else type(values).__name__
        raise ConfigError(f"{source} (with --group-rm) must return a list of {n} rewards, one per sample; got {got}")
    return [check_reward(v, source) for v in values]


async def group_rewards(args: Any, samples: list[Sample], env_rm: tuple[Callable[..., Any], str] | None = None,
                        ) -> list[float | dict[str, Any]]:
    """Rewards for `samples`, in order: the environment's own function `env_rm` (fn, its name)
    per sample when given, else one batched call with `--group-rm` and a custom function, else
    `reward` per sample, concurrently."""
    if not samples:
        return []
    if env_rm is not None:
        return list(await asyncio.gather(*(env_reward(*env_rm, args, s) for s in samples)))
    custom = _custom_rm(args)
    if custom is not None and args.group_rm:
        fn, source = custom
        return _check_batch(await _call_user_rm(fn, source, args, list(samples)), len(samples), source)
    return list(await asyncio.gather(*(reward(args, s) for s in samples)))


def _payload(sample: Sample) -> bytes:
    return json.dumps(sample.to_dict(), default=str).encode()


async def remote_reward(args: Any, sample: Sample) -> float | dict[str, Any]:
    """POST the sample to `--rm-url`; retried on connection errors and 5xx, not on 4xx."""
    url = args.rm_url
    if not url:
        raise ConfigError("--rm-type remote_rm needs --rm-url (the reward service to POST samples to)")
    source = f"reward service --rm-url {url}"
    last: str = ""
    timeout = aiohttp.ClientTimeout(total=REMOTE_RM_TIMEOUT_S)
    for attempt in range(REMOTE_RM_ATTEMPTS):
        if attempt:
            await asyncio.sleep(min(REMOTE_RM_BACKOFF_S * 2 ** (attempt - 1), 10.0) * (0.5 + random.random()))
        try:
            async with aiohttp.ClientSession(timeout=timeout) as http:
                async with http.post(url, data=_payload(sample), headers={"Content-Type": "application/json"}) as resp:
                    text = await resp.text()
                    if 400 <= resp.status < 500:
                        raise ConfigError(f"{source} answered HTTP {resp.status}: {text[:300]}")
                    if resp.status >= 500:
                        last = f"HTTP {resp.status}: {text[:300]}"
                        continue
        except (TimeoutError, aiohttp.ClientError) as exc:
            last = repr(exc)
            continue
        try:
            body = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source} answered non-JSON {text[:120]!r}; send a number or {{\"reward\": x}}") from exc
        if isinstance(body, dict) and "reward" in body:
            body = body["reward"]
        return check_reward(body, source)
    raise ServiceError(f"{source} failed {REMOTE_RM_ATTEMPTS} times; last error: {last}")
