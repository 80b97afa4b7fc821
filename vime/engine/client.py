"""Token-in / token-out client for vLLM's `/inference/v1/generate`.

Prompt token ids go in; the sampled token ids, the logprob of each sampled token, the finish
reason and the weight-version spans come out, exactly as vLLM returned them. Nothing here
detokenizes or re-tokenizes: the training target is the token ids the engine sampled.
Sampling parameters use vLLM's own names (`max_tokens`, `temperature`, `top_p`, `stop`...).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from vime.errors import ServiceError

GENERATE_ROUTE = "/inference/v1/generate"


class EngineRequestError(ServiceError):
    """vLLM (or the router) answered a generate request with an error status."""

    def __init__(self, status: int, body: str, url: str) -> None:
        super().__init__(f"POST {url} answered HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


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


class EngineClient:
    """An HTTP client bound to one base URL (a vLLM server or a router in front of several).

    Use as `async with EngineClient(url) as client:`; one aiohttp connection pool serves
    every concurrent request of the rollout.
    """

    def __init__(self, base_url: str, *, model: str | None = None, timeout: float = 3600.0,
                 max_connections: int = 1024) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

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
    ) -> GenerateOutput:
        """Sample one continuation of `token_ids`; see `generate_n` for several."""
        params = dict(sampling_params or {})
        params["n"] = 1
        return (await self.generate_n(token_ids, params, session_id=session_id, request_id=request_id))[0]

    async def generate_n(
        self,
        token_ids: list[int],
        sampling_params: dict[str, Any] | None = None,
        *,
        session_id: str | None = None,
        request_id: str | None = None,
    ) -> list[GenerateOutput]:
        if not token_ids:
            raise ValueError("EngineClient.generate: token_ids is empty; render the prompt first")
        params = dict(sampling_params or {})
        params.setdefault("logprobs", 0)  # 0 = the sampled token's logprob only
        payload: dict[str, Any] = {"token_ids": [int(t) for t in token_ids], "sampling_params": params}
        if self.model:
            payload["model"] = self.model
        if request_id:
            payload["request_id"] = request_id
        body = await self.post_json(GENERATE_ROUTE, payload, headers=session_headers(session_id))
        return parse_generate_response(body)

    async def post_json(self, route: str, payload: dict[str, Any] | None = None, *,
                        headers: dict[str, str] | None = None, attempts: int = 3) -> dict[str, Any]:
        """POST and decode JSON. A dropped connection is retried (`attempts` in all): a pooled
        keep-alive connection the server closed fails on first write, before vLLM saw anything."""
        url = self.base_url + route
        for attempt in range(attempts):
            try:
                async with self._http().post(url, json=payload or {}, headers=headers) as resp:
                    if resp.status >= 400:
                        raise EngineRequestError(resp.status, await resp.text(), url)
                    return await resp.json(content_type=None)
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as e:
                if attempt + 1 < attempts:
                    await asyncio.sleep(0.2 * (attempt + 1))
                    continue
                raise ServiceError(f"cannot reach vLLM at {url}: {e!r}; is the server running?") from e
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as e:
                raise ServiceError(f"cannot reach vLLM at {url}: {e!r}; is the server running?") from e
        raise AssertionError("unreachable")
