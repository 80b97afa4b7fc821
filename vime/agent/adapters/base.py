"""What every protocol adapter shares: the aiohttp app, sessions, request limits, errors.

A subclass adds its routes (`routes()`) and its error shape (`error_response`); everything a
request can do wrong ends there. The middleware maps `AdapterError`, aiohttp's HTTP errors
(unknown route, wrong method, body over `max_request_bytes`) and, last, any other exception
to that shape, so no request ever gets a 500 with a traceback: an agent client must see the
API's own error and decide to retry or stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from vime.agent.adapters.core import AdapterCore, AdapterError, Segment
from vime.log import get_logger

log = get_logger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024
"""Claude Code's first request is ~50 kB and long sessions reach a few MB; 32 MB leaves room
without letting one request hold the process's memory."""

SESSION_HEADERS = ("X-Session-ID", "X-Vime-Session")
SESSION_METADATA_KEYS = ("user_id", "session_id")

_KIND_BY_STATUS = {404: "not_found", 413: "too_large"}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class BaseAdapter:
    """An `AdapterCore` behind an aiohttp `Application` (`.app`, built once).

    Point an agent client at the app (see `serve`), `open_session` before its first request
    and `finish_session` after its last to get the session's trajectory segments.
    """

    def __init__(self, tokenizer: Any, vllm_url: str, *, tool_parser: str | None = "hermes",
                 reasoning_parser: str | None = "think", max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 **core_kwargs: Any) -> None:
        self.core = AdapterCore(tokenizer, vllm_url, tool_parser=tool_parser,
                                reasoning_parser=reasoning_parser, **core_kwargs)
        self.max_request_bytes = max_request_bytes
        self.app = web.Application(client_max_size=max_request_bytes, middlewares=[self._errors])
        self.app.router.add_get("/health", self._health)
        self.app.router.add_get("/", self._health)  # clients probe the base URL (Claude Code: HEAD /)
        self.app.add_routes(self.routes())
        self.app.on_cleanup.append(self._cleanup)
        self.url: str | None = None
        self._runner: web.AppRunner | None = None
        self._start_lock = asyncio.Lock()

    # ---- for subclasses ---------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        """The protocol's routes, added to `.app` once."""
        return []

    def error_response(self, status: int, kind: str, message: str) -> web.StreamResponse:
        """The protocol's error body for an `AdapterError` kind (see core.STATUS_BY_KIND)."""
        raise NotImplementedError(f"{type(self).__name__} must implement error_response")

    # ---- sessions ---------------------------------------------------------------------------

    def open_session(self, session_id: str, sampling_defaults: dict | None = None) -> None:
        self.core.open_session(session_id, sampling_defaults)

    async def finish_session(self, session_id: str) -> list[Segment]:
        return await self.core.finish_session(session_id)

    def session_candidates(self, request: web.Request, body: Any) -> list[str]:
        """Where a client may name its session, in order: the API key (`x-api-key`), the bearer
        token, the `X-Session-ID` / `X-Vime-Session` headers, `metadata.user_id` /
        `metadata.session_id` of the body."""
        found = [request.headers.get("x-api-key", "")]
        auth = request.headers.get("Authorization", "")
        if auth[:7].lower() == "bearer ":
            found.append(auth[7:].strip())
        found += [request.headers.get(h, "") for h in SESSION_HEADERS]
        meta = body.get("metadata") if isinstance(body, dict) else None
        if isinstance(meta, dict):
            found += [v for k in SESSION_METADATA_KEYS if isinstance(v := meta.get(k), str)]
        return [s for s in found if s]

    def session_id_from(self, request: web.Request, body: Any) -> str | None:
        """The first candidate that names an open session (with `allow_unknown_sessions`, the
        first candidate at all); None when there is none."""
        candidates = self.session_candidates(request, body)
        for candidate in candidates:
            if self.core.has_session(candidate):
                return candidate
        if self.core.allow_unknown_sessions and candidates:
            return candidates[0]
        return None

    def require_session(self, request: web.Request, body: Any) -> str:
        session_id = self.session_id_from(request, body)
        if session_id is None:
            tried = [c[:40] for c in self.session_candidates(request, body)]
            raise AdapterError("not_found", f"no open session is named by this request (tried {tried}): send the "
                               "session id as the API key (x-api-key or Authorization: Bearer), an X-Session-ID "
                               "header or metadata.session_id, after adapter.open_session(session_id)")
        return session_id

    # ---- requests ---------------------------------------------------------------------------

    async def read_json(self, request: web.Request) -> dict[str, Any]:
        """The body as a JSON object, or `invalid_request` saying why not (413 when too large)."""
        raw = await request.read()
        try:
            body = json.loads(raw, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as e:
            raise AdapterError("invalid_request", f"request body is not valid JSON: {str(e)[:200]}") from None
        if not isinstance(body, dict):
            raise AdapterError("invalid_request", f"request body must be a JSON object, got {type(body).__name__}")
        return body

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        try:
            return await handler(request)
        except AdapterError as e:
            return self.error_response(e.status, e.kind, e.message)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            if e.status == 413:
                message = f"request body is larger than {self.max_request_bytes} bytes"
            else:
                message = f"{request.method} {request.path}: {e.reason}"
            kind = _KIND_BY_STATUS.get(e.status, "invalid_request" if e.status < 500 else "internal")
            return self.error_response(e.status, kind, message)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as e:
            log.exception("adapter.internal_error", path=request.path)
            return self.error_response(500, "internal", f"internal adapter error ({type(e).__name__}); "
                                                        "see the adapter's log")

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _cleanup(self, app: web.Application) -> None:
        await self.core.close()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve `.app` on `host:port` (0 = a free port) until `stop()`; return the base URL
        (e.g. for `ANTHROPIC_BASE_URL`). Calling it again returns the running server's URL, so
        every rollout of a process can share one adapter."""
        async with self._start_lock:
            if self.url is None:
                # a stopping worker must not wait a minute for a turn nobody will read
                runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=5.0)
                await runner.setup()
                await web.TCPSite(runner, host, port).start()
                self._runner, self.url = runner, f"http://{host}:{runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        async with self._start_lock:
            if self._runner is not None:
                await self._runner.cleanup()
            self._runner, self.url = None, None

    @contextlib.asynccontextmanager
    async def serve(self, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
        """`start()` for the duration of a block (tests, one-off runs); yields the base URL."""
        url = await self.start(host, port)
        try:
            yield url
        finally:
            await self.stop()
