"""`OpenAIAdapter`: the OpenAI Chat Completions and Responses APIs over `AdapterCore`.

OpenAI SDK clients, the OpenAI Agents SDK and Codex (`wire_api = "responses"`) point their
base URL at `.app` and use the session id as their API key. Each request is one sampled turn:
the body is checked and translated (`openai_chat`, `openai_responses`), the core samples and
records it, and the answer goes back as JSON or as server-sent events. Errors use OpenAI's
shape, `{"error": {"message", "type", "param", "code"}}`.

Routes: `POST /v1/chat/completions`, `POST /v1/responses`, `GET /v1/models`,
`GET /v1/models/{model}`, `GET /health`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from vime.agent.adapters.base import BaseAdapter
from vime.agent.adapters.core import TurnResult
from vime.agent.adapters.openai_chat import ChatRequest, chat_chunks, chat_completion, parse_chat_request
from vime.agent.adapters.openai_fields import new_id
from vime.agent.adapters.openai_responses import (ResponsesRequest, output_items,
                                                   parse_responses_request, response_events,
                                                   response_object)
from vime.agent.parsers import parse_output

ERROR_TYPES = {
    "invalid_request": ("invalid_request_error", None),
    "not_found": ("invalid_request_error", "not_found"),
    "too_large": ("invalid_request_error", "request_too_large"),
    "overloaded": ("server_error", "server_overloaded"),
    "engine": ("server_error", "engine_error"),
    "internal": ("server_error", "internal_error"),
}
"""Adapter error kind -> OpenAI (`type`, `code`); `limit` is resolved in `error_body`."""

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def error_body(kind: str, message: str) -> dict[str, Any]:
    """OpenAI's error object. A context overflow carries `context_length_exceeded`, the code
    agent clients (Codex) look for before compacting their history."""
    if kind == "limit":
        error_type, code = "invalid_request_error", (
            "max_turns_exceeded" if "max_turns" in message else "context_length_exceeded")
    else:
        error_type, code = ERROR_TYPES.get(kind, ("invalid_request_error", None))
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def without_tool_calls(result: TurnResult, reasoning_parser: Any) -> TurnResult:
    """The turn parsed with no tool parser: what `tool_choice: "none"` asks for. The model
    still saw the tools (the prompt must stay the same across turns), so a call it wrote
    anyway comes back as text, as vLLM's server answers."""
    parsed = parse_output(result.text, None, reasoning_parser)
    finish = "stop" if result.finish_reason == "tool_calls" else result.finish_reason
    return dataclasses.replace(result, parsed=parsed, finish_reason=finish)


class OpenAIAdapter(BaseAdapter):
    """OpenAI-protocol front of the adapter core; see the module docstring.

    `OpenAIAdapter(tokenizer, vllm_url, tool_parser="hermes", reasoning_parser="think",
    **core_kwargs)` (`max_turns`, `max_context_tokens`, `model_name`, `allow_unknown_sessions`,
    `max_request_bytes`); then `open_session`, `.app`, `finish_session -> list[Segment]`.
    """

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/chat/completions", self._chat_completions),
            web.post("/v1/responses", self._responses),
            web.get("/v1/models", self._models),
            web.get("/v1/models/{model}", self._model),
        ]

    def error_response(self, status: int, kind: str, message: str) -> web.StreamResponse:
        return web.json_response(error_body(kind, message), status=status)

    def _model_card(self, model_id: str) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": 0, "owned_by": "vime"}

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card(self.core.model_name)]})

    async def _model(self, request: web.Request) -> web.Response:
        """Any model name answers: the adapter serves one policy whatever the client calls it."""
        return web.json_response(self._model_card(request.match_info["model"]))

    async def _turn(self, session_id: str, req: ChatRequest | ResponsesRequest) -> TurnResult:
        result = await self.core.run_turn(session_id, req.messages, req.tools, req.sampling)
        if req.tool_choice == "none" and result.parsed.tool_calls:
            result = without_tool_calls(result, self.core.reasoning_parser)
        return result

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self.read_json(request)
        session_id = self.require_session(request, body)
        req = parse_chat_request(body)
        result = await self._turn(session_id, req)
        completion_id, created = new_id("chatcmpl-"), int(time.time())
        if not req.stream:
            return web.json_response(chat_completion(result, req.model, completion_id, created))
        chunks = chat_chunks(result, req.model, completion_id, created, req.include_usage)
        return await self._sse(request, ((None, c) for c in chunks), done=True)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await self.read_json(request)
        session_id = self.require_session(request, body)
        req = parse_responses_request(body)
        result = await self._turn(session_id, req)
        response_id, created = new_id("resp_"), int(time.time())
        if not req.stream:
            return web.json_response(response_object(req, response_id, created, result, output_items(result)))
        events = response_events(req, result, response_id, created)
        return await self._sse(request, ((e["type"], e) for e in events), done=False)

    async def _sse(self, request: web.Request, events: Iterable[tuple[str | None, dict[str, Any]]],
                   *, done: bool) -> web.StreamResponse:
        """Write server-sent events: Chat Completions sends `data:` lines ending in `[DONE]`,
        Responses names each event (`event: response.created`) and sends no `[DONE]`."""
        resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await resp.prepare(request)
        for name, data in events:
            head = f"event: {name}\n" if name else ""
            await resp.write(f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n".encode())
        if done:
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

