"""Which failures are the infrastructure's: retried by Temporal, never scored as the policy's.

Shared by the rollout group (a failed generate) and the reward hub (a reward function that
could not reach its model or service), so both draw the line in one place.
"""

from __future__ import annotations

import asyncio

import aiohttp

from vime.errors import ServiceError


def is_infra_error(exc: BaseException) -> bool:
    """Whether a failed generate is the infrastructure's fault (retry it) rather than the request's.

    A `ServiceError` (vime's engine client: server down, cut off, stalled, 5xx) is, except an
    HTTP 4xx, which the request itself earned (a wrong model name, a bad parameter). Raw
    connection errors from a hook's own HTTP client (aiohttp's `ClientPayloadError`,
    `ServerDisconnectedError`, a refused connection, a timeout) are too.
    """
    status = getattr(exc, "status", None)
    if isinstance(exc, ServiceError):
        return not (isinstance(status, int) and 400 <= status < 500)
    if isinstance(exc, aiohttp.ClientResponseError):
        return exc.status >= 500
    return isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError))
