"""Checks of what a turn may carry: chat messages, tools, vLLM sampling parameters.

They run before anything is sent or recorded, and raise `AdapterError("invalid_request")`
naming the bad value, so a malformed request never reaches the chat template or vLLM.
"""

from __future__ import annotations

import math
from typing import Any

from vime.agent.adapters.errors import AdapterError


def _num(key: str, value: Any, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or (isinstance(value, float) and not math.isfinite(value)) or not lo <= value <= hi:
        raise AdapterError("invalid_request", f"{key} {value!r} must be a number in [{lo}, {hi}]")
    return value


def _int(key: str, value: Any, lo: int, hi: int = 2**63 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise AdapterError("invalid_request", f"{key} {value!r} must be an integer >= {lo}")
    return value


def _stop(key: str, value: Any) -> list[str]:
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(s, str) and s for s in values) or len(values) > 64:
        raise AdapterError("invalid_request", f"{key} {value!r} must be a non-empty string or a list of them")
    return list(values)


def _token_ids(key: str, value: Any) -> list[int]:
    if not isinstance(value, list):
        raise AdapterError("invalid_request", f"{key} {value!r} must be a list of token ids")
    return [_int(key, v, 0) for v in value]


_SAMPLING = {
    "max_tokens": lambda k, v: _int(k, v, 1, 2**1000),  # any positive count: clamped to the room left
    "temperature": lambda k, v: _num(k, v, 0.0, 100.0),
    "top_p": lambda k, v: _num(k, v, 1e-9, 1.0),
    "top_k": lambda k, v: _int(k, v, -1),
    "min_p": lambda k, v: _num(k, v, 0.0, 1.0),
    "seed": lambda k, v: _int(k, v, -(2**63)),
    "stop": _stop,
    "stop_token_ids": _token_ids,
    "presence_penalty": lambda k, v: _num(k, v, -2.0, 2.0),
    "frequency_penalty": lambda k, v: _num(k, v, -2.0, 2.0),
    "repetition_penalty": lambda k, v: _num(k, v, 1e-9, 100.0),
    "ignore_eos": lambda k, v: v if isinstance(v, bool) else _int(k, v, 2),
}
"""vLLM sampling parameters a turn may set, with their checks; other keys are ignored (slime's
sampling_params carry engine-side keys such as `n` and `skip_special_tokens` that a turn must
not forward)."""


def check_sampling(sampling: dict[str, Any] | None) -> dict[str, Any]:
    """The known keys of `sampling`, checked; None values mean unset."""
    if sampling is None:
        return {}
    if not isinstance(sampling, dict):
        raise AdapterError("invalid_request", f"sampling parameters must be an object, got {sampling!r}")
    return {k: check(k, sampling[k]) for k, check in _SAMPLING.items() if sampling.get(k) is not None}


_ROLES = ("system", "user", "assistant", "tool")


def _check_content(where: str, content: Any) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise AdapterError("invalid_request", f"{where}.content must be a string or a list of text parts, "
                                              f"got {type(content).__name__}")
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise AdapterError("invalid_request", f"{where}.content[{i}] must be {{'type': 'text', 'text': str}}, "
                                                  f"got {str(part)[:100]}")


def check_messages(messages: Any) -> None:
    """Raise `invalid_request` naming the first message the chat template cannot take."""
    if not isinstance(messages, list) or not messages:
        raise AdapterError("invalid_request", "messages must be a non-empty list")
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            role = m.get("role") if isinstance(m, dict) else m
            raise AdapterError("invalid_request", f"{where}.role {str(role)[:50]!r} is not one of {list(_ROLES)}")
        _check_content(where, m.get("content"))
        if m.get("reasoning_content") is not None and not isinstance(m["reasoning_content"], str):
            raise AdapterError("invalid_request", f"{where}.reasoning_content must be a string")
        calls = m.get("tool_calls")
        if calls is None:
            continue
        if m["role"] != "assistant" or not isinstance(calls, list):
            raise AdapterError("invalid_request", f"{where}.tool_calls must be a list on an assistant message")
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                    or not isinstance(fn.get("arguments", ""), (str, dict)):
                raise AdapterError("invalid_request", f"{where}.tool_calls[{j}] must be "
                                   "{'function': {'name': str, 'arguments': str}}")


def check_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise AdapterError("invalid_request", f"tools must be a list, got {type(tools).__name__}")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"] \
                or not isinstance(fn.get("parameters", {}), dict):
            raise AdapterError("invalid_request", f"tools[{i}] must be {{'type': 'function', 'function': "
                                                  "{'name': str, 'parameters': object}}")
