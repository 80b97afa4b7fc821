"""The Anthropic Messages API over `AdapterCore`, for Claude Code style agents.

Requests are translated to OpenAI-style chat messages for the chat template: a thinking
block becomes `reasoning_content`, `tool_use` blocks become `tool_calls` (the input dumped
back to the JSON the model wrote), `tool_result` blocks become `tool` messages. Answers are
built from the parsed turn; a streamed answer is the same message sent as Messages API events
once the turn is sampled. Fields the adapter does not use (`metadata`, `context_management`,
`output_config`, cache controls, betas) are accepted and ignored, as a real client sends them.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any

from aiohttp import web

from vime.agent.adapters.base import BaseAdapter
from vime.agent.adapters.core import AdapterError, TurnResult
from vime.agent.parsers import parse_output

ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "limit": "invalid_request_error",
    "not_found": "not_found_error",
    "too_large": "request_too_large",
    "engine": "api_error",
    "internal": "api_error",
    "overloaded": "overloaded_error",
}

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

_SKIPPED_BLOCKS = {"redacted_thinking", "server_tool_use", "web_search_tool_result", "container_upload"}
_PLACEHOLDER_BLOCKS = {"image": "[image]", "document": "[document]", "search_result": "[search result]"}


def _bad(message: str) -> AdapterError:
    return AdapterError("invalid_request", message)


def _text_of(where: str, content: Any) -> str:
    """Text of a string or of a list of text-like blocks (tool results, system prompts)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or a list of content blocks, got {type(content).__name__}")
    parts = []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise _bad(f"{where}[{i}].text must be a string")
            parts.append(block["text"])
        elif kind in _PLACEHOLDER_BLOCKS:
            parts.append(_PLACEHOLDER_BLOCKS[kind])
        else:
            raise _bad(f"{where}[{i}] must be a text block, got {str(block)[:80]}")
    return "\n\n".join(parts) if where == "system" else "".join(parts)


def _blocks(where: str, content: Any) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or a list of content blocks, got {type(content).__name__}")
    for i, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _bad(f"{where}.content[{i}] must be an object with a string 'type', got {str(block)[:80]}")
    return content


def _user_messages(where: str, content: Any) -> list[dict]:
    """A user turn: runs of text become user messages, each tool_result a tool message."""
    out: list[dict] = []
    text: list[str] = []
    for i, block in enumerate(_blocks(where, content)):
        kind, at = block["type"], f"{where}.content[{i}]"
        if kind == "tool_result":
            if text:
                out.append({"role": "user", "content": "".join(text)})
                text = []
            if not isinstance(block.get("tool_use_id"), str):
                raise _bad(f"{at}.tool_use_id must be a string")
            result = _text_of(f"{at}.content", block.get("content", ""))
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
        elif kind == "text" or kind in _PLACEHOLDER_BLOCKS:
            text.append(_text_of(at, [block]))
        elif kind not in _SKIPPED_BLOCKS:
            raise _bad(f"{at}.type {kind!r} is not supported in a user message")
    if text or not out:
        out.append({"role": "user", "content": "".join(text)})
    return out


def _assistant_message(where: str, content: Any) -> dict:
    text, reasoning, calls = [], [], []
    for i, block in enumerate(_blocks(where, content)):
        kind, at = block["type"], f"{where}.content[{i}]"
        if kind == "text":
            text.append(_text_of(at, [block]))
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise _bad(f"{at}.thinking must be a string")
            reasoning.append(block["thinking"])
        elif kind == "tool_use":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                raise _bad(f"{at} must have a string 'name' and an object 'input'")
            calls.append({"id": str(block.get("id", "")), "type": "function", "function": {
                "name": block["name"], "arguments": json.dumps(block.get("input", {}), ensure_ascii=False)}})
        elif kind not in _SKIPPED_BLOCKS:
            raise _bad(f"{at}.type {kind!r} is not supported in an assistant message")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def to_chat(body: dict) -> tuple[list[dict], list[dict] | None]:
    """Messages API `system` + `messages` + `tools` as chat-template messages and tools."""
    messages: list[dict] = []
    if body.get("system") is not None:
        system = _text_of("system", body["system"])
        if system:
            messages.append({"role": "system", "content": system})
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad("messages: a non-empty list of messages is required")
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise _bad(f"{where}.role must be 'user', 'assistant' or 'system', got {str(m)[:80]}")
        if "content" not in m:
            raise _bad(f"{where}.content is required")
        if m["role"] == "system":  # Claude Code sends mid-conversation system messages
            messages.append({"role": "system", "content": _text_of(f"{where}.content", m["content"])})
        elif m["role"] == "user":
            messages += _user_messages(where, m["content"])
        else:
            messages.append(_assistant_message(where, m["content"]))
    return messages, to_tools(body.get("tools"))


def to_tools(tools: Any) -> list[dict] | None:
    """Custom tools in the OpenAI function format the template renders; server tools (typed,
    without an input_schema) are left out, as the model cannot call them through text."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _bad(f"tools must be a list, got {type(tools).__name__}")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _bad(f"tools[{i}] must be an object")
        if tool.get("type") not in (None, "custom") and "input_schema" not in tool:
            continue
        if not isinstance(tool.get("name"), str) or not tool["name"] or not isinstance(tool.get("input_schema"), dict):
            raise _bad(f"tools[{i}] must have a non-empty string 'name' and an object 'input_schema'")
        fn = {"name": tool["name"], "parameters": tool["input_schema"]}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out or None


def to_sampling(body: dict) -> dict:
    if "max_tokens" not in body:
        raise _bad("max_tokens is required")
    sampling = {k: body.get(k) for k in ("max_tokens", "temperature", "top_p", "top_k")}
    if body.get("stop_sequences") is not None:
        sampling["stop"] = body["stop_sequences"]
    return sampling


def _tool_choice(body: dict) -> dict:
    """`tool_choice` checked. The model is not constrained: "any" and "tool" are hints the
    template cannot enforce; "none" answers the model's calls as text, and
    `disable_parallel_tool_use` keeps only the first call."""
    choice = body.get("tool_choice")
    if choice is None:
        return {"type": "auto"}
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise _bad(f"tool_choice.type must be one of auto, any, tool, none; got {str(choice)[:80]}")
    if choice["type"] == "tool" and not isinstance(choice.get("name"), str):
        raise _bad("tool_choice.name must be a string when tool_choice.type is 'tool'")
    return choice


def _apply_tool_choice(result: TurnResult, choice: dict, reasoning_parser) -> TurnResult:
    calls = result.parsed.tool_calls
    if choice["type"] == "none" and calls:
        return dataclasses.replace(result, parsed=parse_output(result.text, None, reasoning_parser),
                                   finish_reason="stop")
    if choice.get("disable_parallel_tool_use") is True and len(calls) > 1:
        return dataclasses.replace(result, parsed=dataclasses.replace(result.parsed, tool_calls=calls[:1]))
    return result


def _content_blocks(result: TurnResult) -> list[dict]:
    parsed = result.parsed
    blocks: list[dict] = []
    if parsed.reasoning:
        blocks.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
    text = parsed.content
    calls = []
    for call in parsed.tool_calls:
        try:
            args = json.loads(call.arguments)
        except ValueError:
            args = None
        if isinstance(args, dict):
            calls.append({"type": "tool_use", "id": "toolu_" + uuid.uuid4().hex[:24], "name": call.name, "input": args})
        else:  # Messages API inputs are objects: the call stays text
            text += f"\n<tool_call>\n{json.dumps({'name': call.name, 'arguments': call.arguments})}\n</tool_call>"
    if text or not (blocks or calls):
        blocks.append({"type": "text", "text": text})
    return blocks + calls


class AnthropicAdapter(BaseAdapter):
    """`POST /v1/messages` (JSON or SSE), `/v1/messages/count_tokens`, `GET /v1/models`."""

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/messages", self.messages),
            web.post("/v1/messages/count_tokens", self.count_tokens),
            web.get("/v1/models", self.models),
            web.get("/v1/models/{model_id}", self.model),
        ]

    def error_response(self, status: int, kind: str, message: str) -> web.Response:
        body = {"type": "error", "error": {"type": ERROR_TYPES.get(kind, "api_error"), "message": message}}
        return web.json_response(body, status=status)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await self.read_json(request)
        session_id = self.require_session(request, body)
        if not isinstance(body.get("model"), str):
            raise _bad("model must be a string")
        messages, tools = to_chat(body)
        sampling = to_sampling(body)
        tool_choice = _tool_choice(body)
        if body.get("thinking") is not None and not isinstance(body["thinking"], dict):
            raise _bad("thinking must be an object such as {'type': 'enabled', 'budget_tokens': 1024}")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise _bad(f"stream must be a boolean, got {stream!r}")
        result = await self.core.run_turn(session_id, messages, tools, sampling)
        result = _apply_tool_choice(result, tool_choice, self.core.reasoning_parser)
        message = {
            "id": "msg_" + uuid.uuid4().hex[:24],
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": _content_blocks(result),
            "stop_reason": "stop_sequence" if result.stop_sequence else STOP_REASONS.get(result.finish_reason, "end_turn"),
            "stop_sequence": result.stop_sequence,
            "usage": {"input_tokens": result.prompt_tokens, "output_tokens": len(result.token_ids),
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
        }
        if not stream:
            return web.json_response(message)
        return await self._stream(request, message)

    async def _stream(self, request: web.Request, message: dict) -> web.StreamResponse:
        """The message as the Messages API streams it: start, one block at a time, delta, stop."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)

        async def send(event: str, data: dict) -> None:
            await response.write(f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode())

        start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
                 "usage": {**message["usage"], "output_tokens": 0}}
        await send("message_start", {"type": "message_start", "message": start})
        await send("ping", {"type": "ping"})
        for index, block in enumerate(message["content"]):
            if block["type"] == "thinking":
                empty, delta = {**block, "thinking": "", "signature": ""}, {"type": "thinking_delta", "thinking": block["thinking"]}
            elif block["type"] == "tool_use":
                empty = {**block, "input": {}}
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
            else:
                empty, delta = {**block, "text": ""}, {"type": "text_delta", "text": block["text"]}
            await send("content_block_start", {"type": "content_block_start", "index": index, "content_block": empty})
            await send("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            if block["type"] == "thinking":
                await send("content_block_delta", {"type": "content_block_delta", "index": index,
                                                   "delta": {"type": "signature_delta", "signature": ""}})
            await send("content_block_stop", {"type": "content_block_stop", "index": index})
        await send("message_delta", {"type": "message_delta",
                                     "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
                                     "usage": {"output_tokens": message["usage"]["output_tokens"]}})
        await send("message_stop", {"type": "message_stop"})
        await response.write_eof()
        return response

    async def count_tokens(self, request: web.Request) -> web.Response:
        """Tokens of the rendered prompt; names no session and records nothing."""
        body = await self.read_json(request)
        messages, tools = to_chat(body)
        return web.json_response({"input_tokens": self.core.count_tokens(messages, tools)})

    def _model_info(self, model_id: str) -> dict:
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(0))
        return {"type": "model", "id": model_id, "display_name": model_id, "created_at": created}

    async def models(self, request: web.Request) -> web.Response:
        name = self.core.model_name
        return web.json_response({"data": [self._model_info(name)], "has_more": False, "first_id": name,
                                  "last_id": name})

    async def model(self, request: web.Request) -> web.Response:
        return web.json_response(self._model_info(request.match_info["model_id"]))
