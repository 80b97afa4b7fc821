"""A scripted stand-in for vLLM's `EngineClient`: a policy function writes every reply.

For tests of agent loops and for generating synthetic SFT traces, where what the model says
must be chosen, not sampled: `policy(prompt_text) -> reply_text` decides each turn, and the
engine answers with the reply's token ids (plus the end-of-turn token) as if vLLM had
sampled them. It is named "scripted" on purpose and never stands in for a real model in a
training run: its logprobs are 0.0, not a policy's.

    engine = ScriptedEngine(tokenizer, policy)
    adapter = AnthropicAdapter(tokenizer, "http://scripted", engine=engine, max_context_tokens=8192)

For a reply to keep the adapter's session in one segment, its text must be what the chat
template renders for the parsed answer: `tool_call_text` writes tool calls exactly that way.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any

from vime.engine.client import GenerateOutput
from vime.testing.engine import EngineCall

Policy = Callable[[str], str | Awaitable[str]]

END_OF_TURN = "<|im_end|>"


def tool_call_text(name: str, arguments: dict[str, Any], content: str = "") -> str:
    """The reply text of an assistant turn that calls `name(**arguments)` after `content`,
    written exactly as the tiny model's (Qwen-style hermes) template renders that turn.

    The adapter parses the call, the client sends it back as a `tool_use` block, and the
    adapter renders it with `json.dumps(arguments, ensure_ascii=False)` (key order kept):
    the same bytes as here, so the recorded turn is a prefix of the next rendering."""
    call = ('<tool_call>\n{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '
            + json.dumps(arguments, ensure_ascii=False) + '}\n</tool_call>')
    return f"{content}\n{call}" if content else call


class ScriptedEngine:
    """`generate` as `EngineClient` has it, answering with `policy(decoded prompt)`.

    Each reply is encoded without special tokens and ends with `<|im_end|>` (finish "stop"),
    or is cut at `max_tokens` (finish "length", no end token). Every answered call is kept in
    `.calls` (as `RecordingEngineClient` does), so `check_segments_against_engine` applies.
    The policy may be a plain or an async function.
    """

    def __init__(self, tokenizer: Any, policy: Policy, *, base_url: str = "http://scripted") -> None:
        self.tokenizer = tokenizer
        self.policy = policy
        self.base_url = base_url  # AdapterCore names it when it asks for /v1/models
        self.end_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
        if not isinstance(self.end_id, int) or self.end_id == tokenizer.unk_token_id:
            raise ValueError(f"tokenizer has no {END_OF_TURN!r} token; ScriptedEngine ends turns with it")
        self.calls: list[EngineCall] = []

    async def generate(self, token_ids: list[int], sampling_params: dict[str, Any] | None = None, *,
                       session_id: str | None = None, request_id: str | None = None) -> GenerateOutput:
        if not token_ids:
            raise ValueError("ScriptedEngine.generate: token_ids is empty; render the prompt first")
        params = dict(sampling_params or {})
        prompt = self.tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        reply = self.policy(prompt)
        if inspect.isawaitable(reply):
            reply = await reply
        if not isinstance(reply, str):
            raise TypeError(f"ScriptedEngine policy returned {type(reply).__name__}, not the reply text")
        ids = list(self.tokenizer.encode(reply, add_special_tokens=False)) + [self.end_id]
        finish = "stop"
        max_tokens = params.get("max_tokens")
        if isinstance(max_tokens, int) and len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        out = GenerateOutput(token_ids=ids, log_probs=[0.0] * len(ids), finish_reason=finish)
        self.calls.append(EngineCall(list(token_ids), params, session_id, out))
        return out

    async def close(self) -> None:
        """Nothing to release; here so callers treat it as an `EngineClient`."""
