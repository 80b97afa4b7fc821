"""How vime's errors cross into Temporal: configuration errors are final, everything else retries.

Temporal matches `non_retryable_error_types` on the exact type name, so a `SampleError` (a
subclass of `ConfigError`) raised in an activity used to be retried ten times with
re-generation. `final_config_errors` turns every `VimeError` that is not a `ServiceError` (an
infrastructure failure, worth retrying) into one non-retryable `ApplicationError` of type
`ConfigError` whose message is the user's one line.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from temporalio.exceptions import ApplicationError

from vime.errors import ServiceError, VimeError
from vime.temporal.error_types import final_error

P = ParamSpec("P")
T = TypeVar("T")


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
