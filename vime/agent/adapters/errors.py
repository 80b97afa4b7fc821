"""The one error type of the adapters: a kind each protocol maps to its own error shape."""

from __future__ import annotations

STATUS_BY_KIND = {
    "invalid_request": 400,
    "limit": 400,
    "not_found": 404,
    "too_large": 413,
    "internal": 500,
    "engine": 502,
    "overloaded": 503,
}
"""Default HTTP status of each error kind; a protocol adapter maps kinds to its own error types."""


class AdapterError(Exception):
    """A request the adapter answers with an error: `kind` (see STATUS_BY_KIND), HTTP `status`."""

    def __init__(self, kind: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status or STATUS_BY_KIND.get(kind, 500)
