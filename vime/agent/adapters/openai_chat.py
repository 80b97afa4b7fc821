"""OpenAI Chat Completions <-> the adapter core: request bodies in, completions and chunks out.

Pure functions, no I/O: `parse_chat_request` checks a `/v1/chat/completions` body and turns
it into the chat-format history the core renders; `chat_completion` and `chat_chunks` turn
one `TurnResult` into the JSON the official SDKs parse. Streaming happens after the turn is
sampled (the core samples whole turns), so a streamed answer is the same answer cut into
chunks: role, reasoning, content, one tool call per index (name first, then arguments),
the finish chunk, and the usage chunk when `stream_options.include_usage` asks for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from vime.agent.adapters.core import TurnResult
from vime.agent.adapters.openai_fields import (
    SEED_RANGE,
    function_tool,
    get_bool,
    get_int,
    get_list,
    get_number,
    get_stop,
    get_str,
    get_tool_choice,
    invalid,
    merge_leading_system,
    require_object,
    sampling_from,
    text_of,
)

FINISH_REASONS = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "abort": "length"}
"""vLLM's `abort` (the engine dropped the request mid-turn) has no OpenAI name; like `length`
it means the text was cut short, which is what a client must know."""

STREAM_PIECE_CHARS = 64


@dataclass
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    sampling: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    include_usage: bool = False
    tool_choice: str | dict[str, Any] | None = None


def _tool_call(raw: Any, where: str) -> dict[str, Any]:
    call = require_object(raw, where)
    function = require_object(call.get("function"), f"{where}.function")
    call_id = get_str(call, "id", where, required=True)
    name = get_str(function, "name", f"{where}.function", required=True, nonempty=True)
    arguments = function.get("arguments", "")
    if isinstance(arguments, dict):  # some clients send the parsed object; OpenAI sends JSON text
        arguments = json.dumps(arguments, ensure_ascii=False)
    if not isinstance(arguments, str):
        raise invalid(f"{where}.function.arguments must be a JSON string")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def chat_message(raw: Any, where: str) -> dict[str, Any]:
    """One Chat Completions message in the normalized form the core renders: string content,
    `developer` as `system`, assistant `tool_calls` with JSON-text arguments."""
    msg = require_object(raw, where)
    role = msg.get("role")
    if role in ("system", "developer", "user"):
        if msg.get("content") is None:
            raise invalid(f"{where}.content is required for role {role!r}")
        text = text_of(msg["content"], f"{where}.content", ("text", "input_text"))
        return {"role": "system" if role == "developer" else role, "content": text}
    if role == "assistant":
        content = msg.get("content")
        text = "" if content is None else text_of(content, f"{where}.content", ("text", "refusal", "output_text"))
        out: dict[str, Any] = {"role": "assistant", "content": text}
        reasoning = msg.get("reasoning_content", msg.get("reasoning"))
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise invalid(f"{where}.reasoning_content must be a string")
            out["reasoning_content"] = reasoning
        calls = get_list(msg, "tool_calls", where) or []
        if calls:
            out["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls)]
        return out
    if role == "tool":
        call_id = get_str(msg, "tool_call_id", where, required=True)
        if msg.get("content") is None:
            raise invalid(f"{where}.content is required for role 'tool'")
        text = text_of(msg["content"], f"{where}.content", ("text", "input_text"))
        return {"role": "tool", "tool_call_id": call_id, "content": text}
    raise invalid(f"{where}.role must be one of system, developer, user, assistant, tool; got {role!r:.60}")


def chat_tools(raw: list[Any] | None, where: str = "tools") -> list[dict[str, Any]] | None:
    """Function tools in template shape; other tool types (e.g. `custom`) are dropped, as the
    tool parsers only produce function calls."""
    tools = []
    for i, tool in enumerate(raw or []):
        tool = require_object(tool, f"{where}[{i}]")
        if tool.get("type") != "function":
            if not isinstance(tool.get("type"), str):
                raise invalid(f"{where}[{i}].type must be a string")
            continue
        fn = require_object(tool.get("function"), f"{where}[{i}].function")
        tools.append(function_tool(fn.get("name"), fn.get("description"), fn.get("parameters"),
                                   f"{where}[{i}].function"))
    return tools or None


def parse_chat_request(body: Any) -> ChatRequest:
    """Check a `/v1/chat/completions` body; raise a 400 `AdapterError` naming the bad field."""
    body = require_object(body)
    where = "body"
    model = get_str(body, "model", where, required=True)
    raw_messages = get_list(body, "messages", where, required=True)
    if not raw_messages:
        raise invalid("body.messages must hold at least one message")
    messages = merge_leading_system([chat_message(m, f"messages[{i}]") for i, m in enumerate(raw_messages)])
    n = get_int(body, "n", where, lo=1)
    if n not in (None, 1):
        raise invalid(f"body.n must be 1 (one trajectory per session), got {n}")
    max_tokens = get_int(body, "max_completion_tokens", where, lo=1)
    if max_tokens is None:
        max_tokens = get_int(body, "max_tokens", where, lo=1)
    sampling = sampling_from(
        max_tokens,
        get_number(body, "temperature", where, lo=0.0, hi=2.0),
        get_number(body, "top_p", where, lo=0.0, hi=1.0, lo_open=True),
        get_stop(body, where),
        get_int(body, "seed", where, lo=SEED_RANGE[0], hi=SEED_RANGE[1]),
    )
    stream = bool(get_bool(body, "stream", where))
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        include_usage = bool(get_bool(require_object(options, "body.stream_options"), "include_usage",
                                      "body.stream_options"))
    return ChatRequest(model=model, messages=messages, tools=chat_tools(get_list(body, "tools", where)),
                       sampling=sampling, stream=stream, include_usage=include_usage,
                       tool_choice=get_tool_choice(body, where))


def usage(result: TurnResult) -> dict[str, int]:
    completion = len(result.token_ids)
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": completion,
            "total_tokens": result.prompt_tokens + completion}


def _wire_calls(result: TurnResult) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in result.parsed.tool_calls]


def chat_completion(result: TurnResult, model: str, completion_id: str, created: int) -> dict[str, Any]:
    """The non-streaming answer: one choice; `content` is null when the turn is only tool calls."""
    parsed = result.parsed
    calls = _wire_calls(result)
    message: dict[str, Any] = {"role": "assistant",
                               "content": parsed.content if parsed.content or not calls else None,
                               "refusal": None}
    if calls:
        message["tool_calls"] = calls
    if parsed.reasoning:
        message["reasoning_content"] = parsed.reasoning
    return {
        "id": completion_id, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": FINISH_REASONS.get(result.finish_reason, "stop")}],
        "usage": usage(result),
    }


def pieces(text: str, size: int = STREAM_PIECE_CHARS) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def chat_chunks(result: TurnResult, model: str, completion_id: str, created: int,
                include_usage: bool) -> Iterator[dict[str, Any]]:
    """The streamed answer as `chat.completion.chunk` objects, in the order OpenAI sends them."""
    base = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        out = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if include_usage:
            out["usage"] = None
        return out

    parsed = result.parsed
    yield chunk({"role": "assistant", "content": ""})
    for piece in pieces(parsed.reasoning or ""):
        yield chunk({"reasoning_content": piece})
    for piece in pieces(parsed.content):
        yield chunk({"content": piece})
    for i, call in enumerate(parsed.tool_calls):
        yield chunk({"tool_calls": [{"index": i, "id": call.id, "type": "function",
                                     "function": {"name": call.name, "arguments": ""}}]})
        for piece in pieces(call.arguments):
            yield chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
    yield chunk({}, FINISH_REASONS.get(result.finish_reason, "stop"))
    if include_usage:
        yield {**base, "choices": [], "usage": usage(result)}
