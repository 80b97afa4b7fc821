"""Token-in / token-out client for vLLM's `/inference/v1/generate`.

Prompt token ids go in; the sampled token ids, the logprob of each sampled token, the finish
reason and the weight-version spans come out, exactly as vLLM returned them. Nothing here
detokenizes or re-tokenizes: the training target is the token ids the engine sampled.
Sampling parameters use vLLM's own names (`max_tokens`, `temperature`, `top_p`, `stop`...).

Generate requests are streamed (`"stream": true`, server-sent events with token-id deltas) so
that a stopped or hung server is noticed while a long generation that progresses is never cut:
a request fails with `ServiceError` once neither it nor any other stream of the same client
has received a byte for `progress_timeout` seconds. The clock is shared by the client's
streams on purpose: a request queued behind others (or preempted for KV space) sends nothing
until it runs, which is not a failure while the server keeps answering the others. Every way
a connection can break (refused, reset, cut mid-body, a stall) is a `ServiceError`, which the
rollout records as an infrastructure failure; an HTTP error status is an `EngineRequestError`
carrying `status`, so callers can tell their own 4xx from the server's 5xx.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

from vime.errors import ServiceError

GENERATE_ROUTE = "/inference/v1/generate"
DEFAULT_PROGRESS_TIMEOUT = 60.0
SSE_DONE = b"[DONE]"
STREAM_INTERVAL = 16
"""Tokens per streamed chunk (vLLM's `stream_interval` sampling parameter; the first and the
last chunk are sent at once): one chunk per token cost the 2-core test machine ~10-20% of its
generation throughput in JSON events, and 16 tokens are still seconds apart at worst."""
STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None)
"""Streams have no total bound (a long generation must finish); `progress_timeout` bounds stalls."""

T = TypeVar("T")


class EngineRequestError(ServiceError):
    """vLLM (or the router) answered with an error status: `status` 4xx means the request or the
    config is wrong (retrying will not help), 5xx that the server failed (an infra failure)."""

    def __init__(self, status: int, body: str, url: str) -> None:
        super().__init__(f"POST {url} answered HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body
        self.url = url


@dataclass
class GenerateOutput:
    """One sampled continuation; `log_probs[i]` is the logprob of `token_ids[i]`."""

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str
    weight_versions: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: int | str | None = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @property
    def aborted(self) -> bool:
        return self.finish_reason == "abort"


def session_headers(session_id: str | None) -> dict[str, str]:
    """Headers that pin a multi-turn session to one worker (prefix-cache reuse).

    smg hashes `X-SMG-Routing-Key`; vllm-router hashes `X-Session-ID`; both are sent.
    """
    if not session_id:
        return {}
    return {"X-SMG-Routing-Key": session_id, "X-Session-ID": session_id}


def parse_generate_response(body: dict[str, Any]) -> list[GenerateOutput]:
    """Turn a `/inference/v1/generate` JSON body into one `GenerateOutput` per choice."""
    outputs = []
    for choice in body.get("choices") or []:
        token_ids = list(choice.get("token_ids") or [])
        content = ((choice.get("logprobs") or {}).get("content")) or []
        log_probs = [float(entry["logprob"]) for entry in content]
        if len(log_probs) != len(token_ids):
            raise ServiceError(
                f"vLLM returned {len(token_ids)} token ids but {len(log_probs)} logprobs; "
                "send sampling_params.logprobs=0 (EngineClient does) and check the server version"
            )
        outputs.append(
            GenerateOutput(
                token_ids=token_ids,
                log_probs=log_probs,
                finish_reason=choice.get("finish_reason") or "stop",
                weight_versions=list(choice.get("weight_versions") or []),
                stop_reason=choice.get("stop_reason"),
            )
        )
    if not outputs:
        raise ServiceError(f"vLLM generate response has no choices: {str(body)[:300]}")
    return outputs


def pop_sse_events(buffer: bytearray) -> list[bytes]:
    """Remove the complete server-sent events from the front of `buffer` and return their data
    (vLLM sends one `data: ...` line per event); a partial event stays for the next read."""
    events = []
    while True:
        end = buffer.find(b"\n\n")
        if end < 0:
            return events
        raw, buffer[: end + 2] = bytes(buffer[:end]), b""
        data = [line[5:].strip() for line in raw.replace(b"\r", b"").split(b"\n") if line.startswith(b"data:")]
        if data:
            events.append(b"\n".join(data))


def merge_stream_chunk(choices: dict[int, dict[str, Any]], chunk: dict[str, Any]) -> None:
    """Fold one streamed chunk into `choices` (by choice index), building the body a
    non-streamed request returns: token ids and logprob entries appended in order, finish
    reason, stop reason and weight-version spans from the chunk that carries them (the last)."""
    for delta in chunk.get("choices") or []:
        choice = choices.setdefault(int(delta.get("index") or 0), {
            "token_ids": [], "logprobs": {"content": []}, "finish_reason": None, "stop_reason": None,
            "weight_versions": None})
        choice["token_ids"] += delta.get("token_ids") or []
        choice["logprobs"]["content"] += (delta.get("logprobs") or {}).get("content") or []
        for key in ("finish_reason", "stop_reason", "weight_versions"):
            if delta.get(key) is not None:
                choice[key] = delta[key]


def stream_body(choices: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The merged choices as a `/inference/v1/generate` body, in choice order."""
    return {"choices": [choices[i] for i in sorted(choices)]}


class EngineClient:
    """An HTTP client bound to one base URL (a vLLM server or a router in front of several).

    Use as `async with EngineClient(url) as client:`; one aiohttp connection pool serves
    every concurrent request of the rollout. `generate*` streams and fails a request after
    `progress_timeout` seconds in which no stream of this client received anything; other
    routes (`post_json`: pause, resume, weight sync) are bounded by `timeout` in total.
    """

    def __init__(self, base_url: str, *, model: str | None = None, timeout: float = 3600.0,
                 progress_timeout: float = DEFAULT_PROGRESS_TIMEOUT, max_connections: int = 1024) -> None:
        if not progress_timeout > 0:
            raise ValueError(f"EngineClient: progress_timeout={progress_timeout!r}; give a positive number of "
                             "seconds (how long a stalled server may stay silent before a request fails)")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.progress_timeout = float(progress_timeout)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._last_progress = time.monotonic()

    @property
    def last_progress(self) -> float:
        """`time.monotonic()` when any stream of this client last received bytes (or began)."""
        return self._last_progress

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=self._max_connections),
            )
        return self._session

    async def generate(
        self,
        token_ids: list[int],
        sampling_params: dict[str, Any] | None = None,
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        model: str | None = None,
    ) -> GenerateOutput:
        """Sample one continuation of `token_ids`; see `generate_n` for several."""
        params = dict(sampling_params or {})
        params["n"] = 1
        return (await self.generate_n(token_ids, params, session_id=session_id, request_id=request_id,
                                      model=model))[0]

    async def generate_n(
        self,
        token_ids: list[int],
        sampling_params: dict[str, Any] | None = None,
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        model: str | None = None,
    ) -> list[GenerateOutput]:
        """`model`: the served name to sample from (a LoRA adapter's), else the client's `model`."""
        if not token_ids:
            raise ValueError("EngineClient.generate: token_ids is empty; render the prompt first")
        params = dict(sampling_params or {})
        params.setdefault("logprobs", 0)  # 0 = the sampled token's logprob only
        params.setdefault("stream_interval", STREAM_INTERVAL)
        payload: dict[str, Any] = {"token_ids": [int(t) for t in token_ids], "sampling_params": params,
                                   "stream": True}
        if model or self.model:
            payload["model"] = model or self.model
        if request_id:
            payload["request_id"] = request_id
        body = await self.stream_json(GENERATE_ROUTE, payload, headers=session_headers(session_id))
        return parse_generate_response(body)

    async def stream_json(self, route: str, payload: dict[str, Any], *, headers: dict[str, str] | None = None,
                          attempts: int = 3) -> dict[str, Any]:
        """POST a streamed request and return the body its chunks add up to (a plain JSON answer,
        from a server or router that does not stream, is returned as it is).

        A connection dropped before any answer is retried (`attempts` in all), as in `post_json`;
        once the server has answered, a cut is a `ServiceError`: the request may have run.
        """
        url = self.base_url + route
        for attempt in range(attempts):
            answered = False
            try:
                resp = await self._until_stalled(
                    self._http().post(url, json=payload, headers=headers, timeout=STREAM_TIMEOUT), url)
                answered = True
                try:
                    body = await self._read_answer(resp, url)
                except BaseException:
                    resp.close()  # drop the connection: vLLM aborts a request whose client went away
                    raise
                resp.release()
                return body
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as e:
                if not answered and attempt + 1 < attempts:
                    await asyncio.sleep(0.2 * (attempt + 1))
                    continue
                raise self._connection_error(url, e, answered) from e
            except (aiohttp.ClientError, OSError) as e:  # payload cut mid-body, reset, timeout
                raise self._connection_error(url, e, answered) from e
        raise AssertionError("unreachable")

    async def _read_answer(self, resp: aiohttp.ClientResponse, url: str) -> dict[str, Any]:
        if resp.status >= 400:
            raise EngineRequestError(resp.status, (await self._until_stalled(resp.read(), url)).decode(
                errors="replace"), url)
        if not resp.content_type.startswith("text/event-stream"):
            return _decode_json(await self._until_stalled(resp.read(), url), url)
        return await self._read_events(resp, url)

    async def _read_events(self, resp: aiohttp.ClientResponse, url: str) -> dict[str, Any]:
        """Merge the events up to `[DONE]`, then read to the end of the body (which keeps the
        connection reusable)."""
        buffer, choices, done = bytearray(), {}, False
        while data := await self._until_stalled(resp.content.readany(), url):
            buffer += data
            for event in pop_sse_events(buffer):
                done = done or event == SSE_DONE
                if done:
                    continue
                chunk = _decode_json(event, url)
                if chunk.get("error"):
                    raise EngineRequestError(_error_status(chunk["error"]), event.decode(errors="replace"), url)
                merge_stream_chunk(choices, chunk)
        if done:
            return stream_body(choices)
        raise ServiceError(f"vLLM at {url} closed the stream before it was complete ({len(choices)} choices "
                           "partly received); the server may have died: check its log")

    async def _until_stalled(self, step: Awaitable[T], url: str) -> T:
        """Await `step` (connect, headers or the next bytes) unless this client's streams have all
        been silent for `progress_timeout` seconds, which raises `ServiceError`.

        A step that started recently gets the full bound, whatever the shared clock says.
        """
        started = time.monotonic()
        task = asyncio.ensure_future(step)
        try:
            while True:
                remaining = max(started, self._last_progress) + self.progress_timeout - time.monotonic()
                if remaining <= 0:
                    raise ServiceError(
                        f"vLLM at {url} sent nothing for {self.progress_timeout:g} s (progress_timeout), to this "
                        "request or any other of this client; the server is stopped, hung or unreachable"
                    )
                done, _ = await asyncio.wait({task}, timeout=remaining)
                if done:
                    result = task.result()
                    self._last_progress = time.monotonic()
                    return result
        finally:
            if not task.done():
                task.cancel()

    @staticmethod
    def _connection_error(url: str, e: BaseException, answered: bool) -> ServiceError:
        if answered:
            return ServiceError(f"connection to vLLM at {url} broke mid-answer: {e!r}; the server may have died "
                                "or restarted: check its log")
        return ServiceError(f"cannot reach vLLM at {url}: {e!r}; is the server running?")

    async def post_json(self, route: str, payload: dict[str, Any] | None = None, *,
                        headers: dict[str, str] | None = None, attempts: int = 3) -> dict[str, Any]:
        """POST and decode JSON (control routes, `/v1/completions`), bounded by `timeout` in total.
        A dropped connection is retried (`attempts` in all): a pooled keep-alive connection the
        server closed fails on first write, before vLLM saw anything."""
        url = self.base_url + route
        for attempt in range(attempts):
            answered = False
            try:
                async with self._http().post(url, json=payload or {}, headers=headers) as resp:
                    answered = True
                    if resp.status >= 400:
                        raise EngineRequestError(resp.status, await resp.text(), url)
                    return _decode_json(await resp.read(), url)
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as e:
                if not answered and attempt + 1 < attempts:
                    await asyncio.sleep(0.2 * (attempt + 1))
                    continue
                raise self._connection_error(url, e, answered) from e
            except (aiohttp.ClientError, OSError) as e:
                raise self._connection_error(url, e, answered) from e
        raise AssertionError("unreachable")


def _decode_json(data: bytes, url: str) -> dict[str, Any]:
    try:
        return json.loads(data)
    except ValueError as e:
        raise ServiceError(f"vLLM at {url} sent a body that is not JSON ({e}): {data[:200]!r}") from e


def _error_status(error: Any) -> int:
    """The HTTP status of an error event sent mid-stream (`{"error": {"code": 500, ...}}`)."""
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, int) and code >= 400 else 500
