"""Field checks shared by the OpenAI Chat Completions and Responses translations.

Agent clients send large bodies full of fields an adapter does not use; hostile or buggy
ones send wrong types. The rule here: a field the adapter uses is checked strictly (type,
range, finiteness) and a bad one becomes a 400 naming the field, before anything reaches
the engine or the session's trajectory; a field it does not use is ignored whatever it holds.
`None` always means "not given", as in the OpenAI API.
"""

from __future__ import annotations

import math
import re
import secrets
from typing import Any

from vime.agent.adapters.core import AdapterError

TOOL_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")
MAX_STOP_SEQUENCES = 16
SEED_RANGE = (-(2**63), 2**63 - 1)


def invalid(message: str) -> AdapterError:
    return AdapterError("invalid_request", message)


def new_id(prefix: str) -> str:
    """An id in OpenAI's style (`chatcmpl-...`, `resp_...`, `msg_...`); unique per process."""
    return prefix + secrets.token_hex(12)


def require_object(body: Any, what: str = "request body") -> dict[str, Any]:
    if not isinstance(body, dict):
        raise invalid(f"{what} must be a JSON object, got {type(body).__name__}")
    return body


def get_str(obj: dict[str, Any], key: str, where: str, *, required: bool = False,
            nonempty: bool = False) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise invalid(f"{where}.{key} is required (a string)")
        return None
    if not isinstance(value, str):
        raise invalid(f"{where}.{key} must be a string, got {type(value).__name__}")
    if nonempty and not value:
        raise invalid(f"{where}.{key} must not be empty")
    return value


def get_bool(obj: dict[str, Any], key: str, where: str) -> bool | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise invalid(f"{where}.{key} must be true or false, got {value!r:.80}")
    return value


def get_int(obj: dict[str, Any], key: str, where: str, *, lo: int, hi: int | None = None) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"{where}.{key} must be an integer, got {value!r:.80}")
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise invalid(f"{where}.{key} must be {bound}, got {value}")
    return value


def get_number(obj: dict[str, Any], key: str, where: str, *, lo: float, hi: float,
               lo_open: bool = False) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise invalid(f"{where}.{key} must be a finite number, got {value!r:.80}")
    if value > hi or value < lo or (lo_open and value == lo):
        raise invalid(f"{where}.{key} must be in {'(' if lo_open else '['}{lo}, {hi}], got {value}")
    return float(value)


def get_list(obj: dict[str, Any], key: str, where: str, *, required: bool = False) -> list[Any] | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise invalid(f"{where}.{key} is required (an array)")
        return None
    if not isinstance(value, list):
        raise invalid(f"{where}.{key} must be an array, got {type(value).__name__}")
    return value


def get_stop(obj: dict[str, Any], where: str) -> list[str] | None:
    """`stop`: a string or a list of non-empty strings; vLLM stops on any of them."""
    value = obj.get("stop")
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise invalid(f"{where}.stop must be a non-empty string or an array of them")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise invalid(f"{where}.stop has {len(stops)} sequences; at most {MAX_STOP_SEQUENCES}")
    return stops or None


def get_tool_choice(obj: dict[str, Any], where: str) -> str | dict[str, Any] | None:
    """`tool_choice` is checked for shape only: without guided decoding the adapter cannot force
    or forbid a call, so the model's own output decides (vLLM's server does the same for `auto`)."""
    value = obj.get("tool_choice")
    if value is None or isinstance(value, dict) and isinstance(value.get("type"), str):
        return value
    if value in ("none", "auto", "required"):
        return value
    raise invalid(f"{where}.tool_choice must be 'none', 'auto', 'required' or an object with a type")


def function_tool(name: Any, description: Any, parameters: Any, where: str) -> dict[str, Any]:
    """One tool in the shape chat templates render (`{"type": "function", "function": {...}}`)."""
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise invalid(f"{where}.name must match {TOOL_NAME.pattern}, got {name!r:.80}")
    if description is not None and not isinstance(description, str):
        raise invalid(f"{where}.description must be a string")
    if parameters is not None and not isinstance(parameters, dict):
        raise invalid(f"{where}.parameters must be a JSON Schema object")
    function: dict[str, Any] = {"name": name}
    if description:
        function["description"] = description
    function["parameters"] = parameters if parameters is not None else {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def text_of(content: Any, where: str, text_types: tuple[str, ...]) -> str:
    """Message content as one string: a string, or a list of text parts joined.

    Parts whose `type` is in `text_types` carry `text`; any other part (images, audio, files)
    is refused, as the policy is text-only: silently dropping it would train on a prompt the
    client did not send.
    """
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(f"{where} must be a string or an array of content parts")
    texts = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            raise invalid(f"{where}[{i}] must be an object")
        kind = part.get("type")
        if kind not in text_types:
            raise invalid(f"{where}[{i}].type {kind!r:.60} is not supported; send text parts "
                          f"({', '.join(text_types)})")
        text = part.get("text", part.get("refusal"))
        if not isinstance(text, str):
            raise invalid(f"{where}[{i}].text must be a string")
        texts.append(text)
    return "".join(texts)


def merge_leading_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fold the leading system/developer messages into one system message.

    Chat templates read the system prompt from `messages[0]` only; OpenAI clients (Codex,
    the Agents SDK) send instructions plus developer messages, so the rest would otherwise
    render as stray turns, or be refused by stricter templates.
    """
    head = 0
    while head < len(messages) and messages[head]["role"] == "system":
        head += 1
    if head <= 1:
        return messages
    merged = "\n\n".join(m["content"] for m in messages[:head] if m["content"])
    return [{"role": "system", "content": merged}, *messages[head:]]


def sampling_from(max_tokens: int | None, temperature: float | None, top_p: float | None,
                  stop: list[str] | None = None, seed: int | None = None) -> dict[str, Any]:
    """The client's sampling fields in vLLM's names; absent ones are left to the session."""
    sampling = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p,
                "stop": stop, "seed": seed}
    return {k: v for k, v in sampling.items() if v is not None}
