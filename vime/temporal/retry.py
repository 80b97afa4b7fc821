"""What Temporal retries: configuration errors are final, everything else retries.

Temporal matches `non_retryable_error_types` on the exact type name, so a `SampleError` (a
subclass of `ConfigError`) raised in an activity used to be retried ten times with
re-generation. `final_config_errors` turns every `VimeError` that is not a `ServiceError` (an
infrastructure failure, worth retrying) into one non-retryable `ApplicationError` of type
`ConfigError` whose message is the user's one line. `rollout_retry_policy` is the other half,
on the workflow side: infra failures retry until the engine is back, `ConfigError` never.

Light on purpose (temporalio's common and exceptions modules, vime.errors): workflows import it.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import ParamSpec, TypeVar

from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from vime.errors import ServiceError, VimeError
from vime.temporal.error_types import CONFIG_ERROR, final_error, root_message

__all__ = ["CONFIG_ERROR", "RETRY_MAX_INTERVAL", "as_final", "final_config_errors", "root_message",
           "rollout_retry_policy"]

RETRY_MAX_INTERVAL = timedelta(seconds=10)

P = ParamSpec("P")
T = TypeVar("T")


def rollout_retry_policy() -> RetryPolicy:
    """Infra failures retry (every `RETRY_MAX_INTERVAL` at most, without limit) until the engine
    is back; configuration errors never retry."""
    return RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                       maximum_interval=RETRY_MAX_INTERVAL, maximum_attempts=0,
                       non_retryable_error_types=[CONFIG_ERROR])


def as_final(exc: VimeError) -> ApplicationError:
    return final_error(str(exc))


def final_config_errors(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Decorate an async activity so that a configuration error fails it without retries."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except VimeError as e:
            if isinstance(e, ServiceError):
                raise
            raise as_final(e) from None  # the message is the whole story: no chained cause

    return wrapper
