"""OpenAI Responses API <-> the adapter core: input items in, response objects and events out.

Pure functions, no I/O. `parse_responses_request` turns `instructions` + `input` items into
the chat-format history the core renders: the items one model turn produced (`reasoning`,
an assistant `message`, `function_call`s) fold into one assistant message, as the chat
template renders a turn; `function_call_output` becomes a `tool` message. The adapter keeps no
stored responses, so `previous_response_id`, `conversation` and `item_reference` are refused
(clients such as Codex send `store: false` and the whole input every turn).

`response_events` streams one sampled turn with the events and `sequence_number`s the
official SDK's stream state checks. A turn cut by `max_output_tokens` is reported as
`status: "incomplete"` with `incomplete_details`, inside a `response.completed` event, as
vLLM's own server does: Codex and the Agents SDK abort the session on a
`response.incomplete` event, and an RL rollout should go on with the truncated turn.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from vime.agent.adapters.core import TurnResult
from vime.agent.adapters.openai_chat import pieces
from vime.agent.adapters.openai_fields import (
    function_tool,
    get_bool,
    get_int,
    get_list,
    get_number,
    get_str,
    get_tool_choice,
    invalid,
    merge_leading_system,
    new_id,
    require_object,
    sampling_from,
    text_of,
)

INPUT_TEXT = ("input_text", "text", "output_text")
OUTPUT_TEXT = ("output_text", "text", "refusal", "input_text")
UNSUPPORTED_STATE = ("previous_response_id", "conversation")


@dataclass
class ResponsesRequest:
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    sampling: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    tool_choice: str | dict[str, Any] | None = None
    echo: dict[str, Any] = field(default_factory=dict)
    """Request fields a response object repeats back (instructions, tools, temperature...)."""


class _History:
    """Builds chat messages from items; one open assistant message collects a turn's items."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.turn: dict[str, Any] | None = None

    def assistant(self) -> dict[str, Any]:
        if self.turn is None:
            self.turn = {"role": "assistant", "content": ""}
        return self.turn

    def close(self) -> None:
        if self.turn is not None:
            self.messages.append(self.turn)
            self.turn = None

    def add(self, message: dict[str, Any]) -> None:
        self.close()
        self.messages.append(message)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """The raw reasoning of a `reasoning` item (`content` parts of type `reasoning_text`);
    summaries and encrypted content are not what the model wrote, so they are not rendered."""
    texts = []
    for i, part in enumerate(get_list(item, "content", where) or []):
        part = require_object(part, f"{where}.content[{i}]")
        if part.get("type") == "reasoning_text":
            texts.append(get_str(part, "text", f"{where}.content[{i}]", required=True))
    return "".join(texts)


def _add_item(history: _History, raw: Any, where: str) -> None:
    item = require_object(raw, where)
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if item.get("content") is None:
            raise invalid(f"{where}.content is required")
        if role == "assistant":
            text = text_of(item["content"], f"{where}.content", OUTPUT_TEXT)
            turn = history.assistant()
            if turn.get("tool_calls"):  # text after calls cannot render in order: a new turn
                history.close()
                turn = history.assistant()
            turn["content"] += text
        elif role in ("user", "system", "developer"):
            text = text_of(item["content"], f"{where}.content", INPUT_TEXT)
            history.add({"role": "user" if role == "user" else "system", "content": text})
        else:
            raise invalid(f"{where}.role must be user, assistant, system or developer; got {role!r:.60}")
    elif kind == "function_call":
        arguments = item.get("arguments", "")
        if isinstance(arguments, dict):
            arguments = json.dumps(arguments, ensure_ascii=False)
        if not isinstance(arguments, str):
            raise invalid(f"{where}.arguments must be a JSON string")
        call = {"id": get_str(item, "call_id", where, required=True), "type": "function",
                "function": {"name": get_str(item, "name", where, required=True, nonempty=True),
                             "arguments": arguments}}
        history.assistant().setdefault("tool_calls", []).append(call)
    elif kind == "function_call_output":
        call_id = get_str(item, "call_id", where, required=True)
        if item.get("output") is None:
            raise invalid(f"{where}.output is required")
        text = text_of(item["output"], f"{where}.output", INPUT_TEXT)
        history.add({"role": "tool", "tool_call_id": call_id, "content": text})
    elif kind == "reasoning":
        text = _reasoning_text(item, where)
        if text:
            turn = history.assistant()
            if turn["content"] or turn.get("tool_calls") or turn.get("reasoning_content"):
                history.close()
                turn = history.assistant()
            turn["reasoning_content"] = text
    elif kind == "item_reference":
        raise invalid(f"{where}: item_reference is not supported (nothing is stored); send the items")
    elif not isinstance(kind, str):
        raise invalid(f"{where}.type must be a string")
    # other item types (web_search_call, local_shell_call...) carry nothing a template renders


def responses_messages(instructions: str | None, input_: Any) -> list[dict[str, Any]]:
    history = _History()
    if instructions:
        history.add({"role": "system", "content": instructions})
    if isinstance(input_, str):
        history.add({"role": "user", "content": input_})
    elif isinstance(input_, list):
        for i, item in enumerate(input_):
            _add_item(history, item, f"input[{i}]")
    else:
        raise invalid("body.input must be a string or an array of items")
    history.close()
    if not any(m["role"] != "system" for m in history.messages):
        raise invalid("body.input holds no message to answer")
    return merge_leading_system(history.messages)


def responses_tools(raw: list[Any] | None) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]]]:
    """Function tools in template shape, and the same tools in Responses' flat shape to echo.
    Other tool types (web_search, custom, local_shell: Codex sends several) are skipped."""
    tools, echo = [], []
    for i, tool in enumerate(raw or []):
        tool = require_object(tool, f"tools[{i}]")
        if not isinstance(tool.get("type"), str):
            raise invalid(f"tools[{i}].type must be a string")
        if tool["type"] != "function":
            continue
        chat = function_tool(tool.get("name"), tool.get("description"), tool.get("parameters"), f"tools[{i}]")
        tools.append(chat)
        echo.append({"type": "function", **chat["function"], "strict": tool.get("strict") is True})
    return tools or None, echo


def parse_responses_request(body: Any) -> ResponsesRequest:
    """Check a `/v1/responses` body; raise a 400 `AdapterError` naming the bad field."""
    body = require_object(body)
    where = "body"
    for key in UNSUPPORTED_STATE:
        if body.get(key) is not None:
            raise invalid(f"body.{key} is not supported: the adapter stores no responses; "
                          "send the whole conversation in input (store: false)")
    if get_bool(body, "background", where):
        raise invalid("body.background is not supported")
    model = get_str(body, "model", where, required=True)
    instructions = get_str(body, "instructions", where)
    if body.get("input") is None:
        raise invalid("body.input is required (a string or an array of items)")
    messages = responses_messages(instructions, body["input"])
    tools, echo_tools = responses_tools(get_list(body, "tools", where))
    max_tokens = get_int(body, "max_output_tokens", where, lo=1)
    temperature = get_number(body, "temperature", where, lo=0.0, hi=2.0)
    top_p = get_number(body, "top_p", where, lo=0.0, hi=1.0, lo_open=True)
    parallel = get_bool(body, "parallel_tool_calls", where)
    tool_choice = get_tool_choice(body, where)
    echo = {
        "instructions": instructions, "max_output_tokens": max_tokens, "temperature": temperature,
        "top_p": top_p, "tools": echo_tools, "tool_choice": tool_choice or "auto",
        "parallel_tool_calls": True if parallel is None else parallel,
        "reasoning": body.get("reasoning") if isinstance(body.get("reasoning"), dict) else None,
        "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
        "store": get_bool(body, "store", where) or False,
        "text": body.get("text") if isinstance(body.get("text"), dict) else {"format": {"type": "text"}},
    }
    return ResponsesRequest(model=model, messages=messages, tools=tools,
                            sampling=sampling_from(max_tokens, temperature, top_p),
                            stream=bool(get_bool(body, "stream", where)), tool_choice=tool_choice,
                            echo=echo)


def truncated(result: TurnResult) -> bool:
    return result.finish_reason in ("length", "abort")


def output_items(result: TurnResult) -> list[dict[str, Any]]:
    """A turn as output items: reasoning (raw text in `content`), the message, the calls."""
    parsed, items = result.parsed, []
    cut = truncated(result)
    if parsed.reasoning:
        items.append({"id": new_id("rs_"), "type": "reasoning", "summary": [], "status": "completed",
                      "content": [{"type": "reasoning_text", "text": parsed.reasoning}]})
    if parsed.content or not parsed.tool_calls:
        items.append({"id": new_id("msg_"), "type": "message", "role": "assistant",
                      "status": "incomplete" if cut else "completed",
                      "content": [{"type": "output_text", "text": parsed.content,
                                   "annotations": [], "logprobs": []}]})
    for call in parsed.tool_calls:
        items.append({"id": new_id("fc_"), "type": "function_call", "call_id": call.id,
                      "name": call.name, "arguments": call.arguments, "status": "completed"})
    return items


def response_usage(result: TurnResult) -> dict[str, Any]:
    output = len(result.token_ids)
    return {"input_tokens": result.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": result.prompt_tokens + output}


def response_object(req: ResponsesRequest, response_id: str, created_at: int,
                    result: TurnResult | None, output: list[dict[str, Any]]) -> dict[str, Any]:
    """The `response` object; `result=None` gives the in-progress shell that streams open with."""
    if result is None:
        status, incomplete = "in_progress", None
    elif truncated(result):
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    else:
        status, incomplete = "completed", None
    return {"id": response_id, "object": "response", "created_at": created_at, "status": status,
            "error": None, "incomplete_details": incomplete, "model": req.model, "output": output,
            "previous_response_id": None, "truncation": "disabled", "user": None,
            "usage": response_usage(result) if result is not None else None, **req.echo}


def response_events(req: ResponsesRequest, result: TurnResult, response_id: str,
                    created_at: int) -> Iterator[dict[str, Any]]:
    """The streamed answer: created, in_progress, per item added / parts / deltas / done,
    then completed with the full response; `sequence_number` counts from 0."""
    seq = itertools.count()

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "sequence_number": next(seq), **fields}

    shell = response_object(req, response_id, created_at, None, [])
    yield event("response.created", response=shell)
    yield event("response.in_progress", response=shell)
    items = output_items(result)
    for index, item in enumerate(items):
        at = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            yield event("response.output_item.added", output_index=index,
                        item={**item, "arguments": "", "status": "in_progress"})
            for piece in pieces(item["arguments"]):
                yield event("response.function_call_arguments.delta", **at, delta=piece)
            yield event("response.function_call_arguments.done", **at, name=item["name"],
                        arguments=item["arguments"])
        else:
            part = item["content"][0]
            yield event("response.output_item.added", output_index=index,
                        item={**item, "content": [], "status": "in_progress"})
            yield event("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
            text_event = "response.output_text" if part["type"] == "output_text" else "response.reasoning_text"
            extra = {"logprobs": []} if part["type"] == "output_text" else {}
            for piece in pieces(part["text"]):
                yield event(f"{text_event}.delta", **at, content_index=0, delta=piece, **extra)
            yield event(f"{text_event}.done", **at, content_index=0, text=part["text"], **extra)
            yield event("response.content_part.done", **at, content_index=0, part=part)
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=response_object(req, response_id, created_at, result, items))
