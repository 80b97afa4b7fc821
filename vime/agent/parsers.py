"""Turn the text a model sampled into reasoning, content and tool calls, by parser name.

Parsers work on text decoded from the sampled ids and only shape the API answer: the
training target stays the sampled ids. A parser never raises on model output: a tool call
whose JSON is malformed stays in the content as text (the model made a mistake, which is
data, not an adapter error). The output is shaped so that the chat template renders it back
to the text the model wrote, which keeps the next turn's prompt an extension of this one.

Add a parser with `register_tool_parser(name, fn)` / `register_reasoning_parser(name, fn)`:
a tool parser maps text to `(content, tool_calls)`, a reasoning parser to
`(reasoning | None, content)`.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from vime.errors import ConfigError


@dataclass
class ToolCall:
    """One function call the model wrote; `arguments` is JSON text (it may be invalid JSON)."""

    id: str
    name: str
    arguments: str


@dataclass
class ParsedOutput:
    content: str
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


ToolParser = Callable[[str], tuple[str, list[ToolCall]]]
ReasoningParser = Callable[[str], tuple[str | None, str]]

_TOOL_PARSERS: dict[str, ToolParser] = {}
_REASONING_PARSERS: dict[str, ReasoningParser] = {}


def register_tool_parser(name: str, parser: ToolParser) -> None:
    _TOOL_PARSERS[name] = parser


def register_reasoning_parser(name: str, parser: ReasoningParser) -> None:
    _REASONING_PARSERS[name] = parser


def get_tool_parser(name: str | None) -> ToolParser | None:
    """The tool parser called `name`; None means the model's text is all content."""
    if name is None:
        return None
    if name not in _TOOL_PARSERS:
        raise ConfigError(f"tool_parser {name!r} is not known; use one of {sorted(_TOOL_PARSERS)} or None")
    return _TOOL_PARSERS[name]


def get_reasoning_parser(name: str | None) -> ReasoningParser | None:
    """The reasoning parser called `name`; None means the model does not reason in tags."""
    if name is None:
        return None
    if name not in _REASONING_PARSERS:
        raise ConfigError(
            f"reasoning_parser {name!r} is not known; use one of {sorted(_REASONING_PARSERS)} or None"
        )
    return _REASONING_PARSERS[name]


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _hermes_call(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        arguments = args
    else:
        arguments = json.dumps(args, ensure_ascii=False)
    return ToolCall(id=new_call_id(), name=obj["name"], arguments=arguments)


def parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
    """Qwen / Hermes tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

    Content is the text before the first well-formed call, with the newline the template puts
    between content and a call removed. Text between or after calls is dropped, as the template
    cannot render it back. A block that does not hold a JSON object with a name stays text.
    """
    calls: list[ToolCall] = []
    first_start = None
    for match in _HERMES_BLOCK.finditer(text):
        call = _hermes_call(match.group(1))
        if call is None:
            if calls:
                break  # malformed after good calls: drop the rest, as vLLM's hermes parser does
            continue
        if first_start is None:
            first_start = match.start()
        calls.append(call)
    if not calls:
        return text, []
    content = text[:first_start]
    if content.endswith("\n"):
        content = content[:-1]
    return content, calls


def parse_think(text: str) -> tuple[str | None, str]:
    """`<think>...</think>` reasoning (Qwen3, DeepSeek-R1 style).

    The opening tag may be absent (templates that put it in the generation prompt); an
    unclosed `<think>` (the turn hit max_tokens while reasoning) makes everything reasoning.
    Reasoning loses its surrounding newlines and content its leading ones, as Qwen's templates
    render them.
    """
    if "</think>" not in text:
        stripped = text.lstrip()
        if stripped.startswith("<think>"):
            return stripped[len("<think>"):].strip("\n"), ""
        return None, text
    reasoning, _, content = text.partition("</think>")
    head = reasoning.lstrip()
    if head.startswith("<think>"):
        reasoning = head[len("<think>"):]
    return reasoning.strip("\n"), content.lstrip("\n")


register_tool_parser("hermes", parse_hermes)
register_tool_parser("qwen", parse_hermes)
register_reasoning_parser("think", parse_think)
register_reasoning_parser("qwen3", parse_think)
register_reasoning_parser("deepseek_r1", parse_think)


def parse_output(text: str, tool_parser: ToolParser | None,
                 reasoning_parser: ReasoningParser | None) -> ParsedOutput:
    """Reasoning first (a `<tool_call>` inside `<think>` is thinking, not a call), then tools."""
    reasoning, rest = reasoning_parser(text) if reasoning_parser else (None, text)
    content, calls = tool_parser(rest) if tool_parser else (rest, [])
    return ParsedOutput(content=content, reasoning=reasoning or None, tool_calls=calls)
