"""The protocol-neutral heart of the agent adapters: one chat turn in, sampled tokens out.

A protocol adapter (Anthropic, OpenAI) turns its request into OpenAI-style chat messages and
vLLM sampling parameters and calls `AdapterCore.run_turn`. The core renders the chat template,
sends token ids to vLLM with the session id as routing key, parses the sampled ids for the
answer, and records the trajectory of the session as `Segment`s of token ids.

Segments (the training invariant): a segment's `token_ids` are exactly what vLLM saw and
sampled, in order; `loss_mask` is 1 exactly on sampled ids and `log_probs` holds vLLM's logprob
for each of them. A turn extends a segment when the segment's tokens, decoded, are a prefix of
the newly rendered prompt: the prompt sent to vLLM is then the segment's own ids plus the ids
of the new text only (tool results, user text, template tokens; mask 0). Sampled text is never
re-tokenized, so a model that sampled a non-canonical tokenization keeps it. When the rendered
prompt does not extend any segment (the client edited history, the template dropped
`<think>`, the context was compacted, a side request), a new segment starts with the
rendered prompt and `started_because` says where it diverged.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from vime.agent.adapters.checks import check_messages, check_sampling, check_tools
from vime.agent.adapters.errors import STATUS_BY_KIND, AdapterError
from vime.agent.parsers import (ParsedOutput, ToolCall, get_reasoning_parser, get_tool_parser,
                                parse_output)
from vime.engine.client import EngineClient, EngineRequestError, GenerateOutput
from vime.errors import ServiceError
from vime.log import get_logger

log = get_logger(__name__)

_CONTEXT_ERROR = re.compile(r"maximum (context|model) length|max_model_len|longer than the maximum",
                            re.IGNORECASE)

__all__ = ["AdapterCore", "AdapterError", "ParsedOutput", "Segment", "ToolCall", "TurnBoundary",
           "TurnResult", "STATUS_BY_KIND"]


@dataclass
class TurnBoundary:
    """One sampled turn: `token_ids[start:end]` of its segment were sampled by vLLM."""

    start: int
    end: int
    finish_reason: str
    weight_versions: list[dict] = field(default_factory=list)


@dataclass
class Segment:
    """A token sequence vLLM saw: prompt, then sampled turns and spliced-in text (mask 0)."""

    token_ids: list[int]
    loss_mask: list[int]
    log_probs: list[float]
    prompt_length: int
    turns: list[TurnBoundary] = field(default_factory=list)
    started_because: str = "first turn"


@dataclass
class TurnResult:
    """What one turn sampled, parsed for the protocol answer.

    `finish_reason` is "stop", "length" or "tool_calls" (a turn vLLM aborts, e.g. when it pauses
    for a weight update, is not recorded and raises kind "overloaded" so the client retries it,
    so "abort" never reaches a protocol adapter); `stop_sequence` is the stop
    string that ended the turn, if one did (it is cut from `parsed.content`, not from the ids).
    """

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str
    parsed: ParsedOutput
    prompt_tokens: int
    weight_versions: list[dict] = field(default_factory=list)
    stop_sequence: str | None = None
    text: str = ""


@dataclass
class _Session:
    id: str
    sampling_defaults: dict[str, Any]
    segments: list[Segment] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)  # decoded token_ids of each segment
    last: int = -1  # index of the segment the latest turn extended
    turns: int = 0
    closed: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class _Plan:
    index: int | None  # segment to extend; None starts a new one
    prompt_ids: list[int]
    new_ids: list[int]  # ids appended with mask 0 (the whole prompt for a new segment)
    text: str
    started_because: str | None


class AdapterCore:
    """Sessions of chat turns against one vLLM server (or router), recorded as segments.

    `max_turns` caps sampled turns per session; `max_context_tokens` caps prompt + response
    (the server's max_model_len also applies; it is read from `/v1/models` on first use).
    Requests beyond a cap fail with kind "limit"; `max_tokens` is clamped to the room left.
    `engine` is an `EngineClient` to use (e.g. one shared with the rollout); by default the core
    makes its own for `vllm_url` on each event loop it runs in.
    """

    def __init__(self, tokenizer: Any, vllm_url: str, *, tool_parser: str | None = "hermes",
                 reasoning_parser: str | None = "think", max_turns: int | None = None,
                 max_context_tokens: int | None = None, model_name: str = "vime",
                 allow_unknown_sessions: bool = False, engine: EngineClient | None = None) -> None:
        self.tokenizer = tokenizer
        self.vllm_url = vllm_url.rstrip("/")
        self.tool_parser = get_tool_parser(tool_parser)
        self.reasoning_parser = get_reasoning_parser(reasoning_parser)
        self.max_turns = max_turns
        self.max_context_tokens = max_context_tokens
        self.model_name = model_name
        self.allow_unknown_sessions = allow_unknown_sessions
        self._sessions: dict[str, _Session] = {}
        self._finished: set[str] = set()  # a late request must not reopen a finished session
        self._server_max_len: int | None = None
        self._server_max_len_known = False
        self._cap_lock = asyncio.Lock()
        self._client: EngineClient | None = engine
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._own_client = engine is None

    # ---- sessions ---------------------------------------------------------------------------

    def open_session(self, session_id: str, sampling_defaults: dict | None = None) -> None:
        """Start recording `session_id`; `sampling_defaults` (vLLM names) apply to each turn,
        request values override them, and their `max_tokens` caps every turn's."""
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(f"session id {session_id!r} must be a non-empty string")
        if session_id in self._sessions:
            raise ValueError(f"session {session_id!r} is already open; finish_session it first")
        self._finished.discard(session_id)  # reopening a finished id on purpose is allowed
        try:
            defaults = check_sampling(sampling_defaults)
        except AdapterError as e:
            raise ValueError(f"open_session({session_id!r}): sampling_defaults: {e.message}") from None
        self._sessions[session_id] = _Session(session_id, defaults)

    def has_session(self, session_id: str) -> bool:
        return session_id in self._sessions

    def session_segments(self, session_id: str) -> list[Segment]:
        """The open session's segments so far (live objects: read, do not modify); a caller
        checkpoints them between turns to resume the session elsewhere (`restore_session`)."""
        session = self._sessions.get(session_id)
        if session is None:
            raise AdapterError("not_found", f"session {session_id!r} is not open")
        return session.segments

    def restore_session(self, session_id: str, segments: list[Segment],
                        sampling_defaults: dict | None = None) -> None:
        """Open `session_id` with the segments a crashed session had recorded, so its next turn
        extends them exactly as if the session had never stopped (a turn whose rendering does
        not extend any of them starts a new segment, as usual)."""
        self.open_session(session_id, sampling_defaults)
        session = self._sessions[session_id]
        session.segments = list(segments)
        session.texts = [self.decode(seg.token_ids) for seg in segments]
        session.last = len(segments) - 1
        session.turns = sum(len(seg.turns) for seg in segments)

    async def finish_session(self, session_id: str) -> list[Segment]:
        """Close the session (after its in-flight turn) and return its segments in start order."""
        session = self._sessions.get(session_id)
        if session is None:
            raise AdapterError("not_found", f"session {session_id!r} is not open")
        async with session.lock:
            session.closed = True
            self._sessions.pop(session_id, None)
            self._finished.add(session_id)
        return session.segments

    def _session(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None and session_id in self._finished:
            raise AdapterError("not_found", f"session {session_id!r} was finished")
        if session is None and self.allow_unknown_sessions and isinstance(session_id, str) and session_id:
            self.open_session(session_id)
            session = self._sessions[session_id]
        if session is None:
            raise AdapterError("not_found", f"session {str(session_id)[:100]!r} is not open; "
                                            "call adapter.open_session(session_id) before sending requests")
        return session

    # ---- rendering --------------------------------------------------------------------------

    def render(self, messages: list[dict], tools: list[dict] | None) -> str:
        """The chat template's text for `messages` + `tools`, ready for the assistant's turn."""
        check_messages(messages)
        check_tools(tools)
        try:
            text = self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                      add_generation_prompt=True)
        except Exception as e:  # jinja errors of any kind: the messages are what the template refused
            raise AdapterError("invalid_request", f"the chat template cannot render these messages: "
                                                  f"{type(e).__name__}: {str(e)[:300]}") from None
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise AdapterError("invalid_request", f"the request's text is not valid Unicode: {e.object[e.start:e.end]!r} "
                                                  f"at character {e.start} of the rendered prompt") from None
        return text

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def count_tokens(self, messages: list[dict], tools: list[dict] | None = None) -> int:
        return len(self.encode(self.render(messages, tools)))

    # ---- one turn ---------------------------------------------------------------------------

    async def run_turn(self, session_id: str, messages: list[dict], tools: list[dict] | None,
                       sampling: dict | None) -> TurnResult:
        """Sample the assistant's next turn and record it. Nothing is recorded unless vLLM
        answered: invalid requests, caps and engine errors raise `AdapterError` first."""
        session = self._session(session_id)
        requested = check_sampling(sampling)
        params = {**session.sampling_defaults, **requested}
        caps = [v for v in (session.sampling_defaults.get("max_tokens"), requested.get("max_tokens")) if v]
        text = self.render(messages, tools)
        async with session.lock:
            if session.closed:
                raise AdapterError("not_found", f"session {session_id!r} was finished")
            if self.max_turns is not None and session.turns >= self.max_turns:
                raise AdapterError("limit", f"session {session_id!r} has used its {self.max_turns} turns (max_turns)")
            plan = self._plan(session, text)
            cap = await self._context_cap()
            if cap is not None:
                room = cap - len(plan.prompt_ids)
                if room < 1:
                    raise AdapterError("limit", f"prompt is {len(plan.prompt_ids)} tokens; the context holds {cap}, "
                                                "leaving no room for a response")
                caps.append(room)
            if caps:
                params["max_tokens"] = min(caps)
            out = await self._generate(plan.prompt_ids, params, session_id)
            if out.finish_reason == "abort":  # the client never sees these tokens: not recorded
                raise AdapterError("overloaded", "vLLM aborted the turn (paused for a weight update?); retry it")
            self._record(session, plan, out)
        return self._result(out, len(plan.prompt_ids))

    def _plan(self, session: _Session, text: str) -> _Plan:
        best = None
        for i, seg_text in enumerate(session.texts):
            if text.startswith(seg_text) and (best is None or len(seg_text) > len(session.texts[best])):
                best = i
        if best is not None:
            new_ids = self.encode(text[len(session.texts[best]):])
            return _Plan(best, session.segments[best].token_ids + new_ids, new_ids, text, None)
        ids = self.encode(text)
        reason = self._divergence(session, text) if session.segments else "first turn"
        return _Plan(None, ids, ids, text, reason)

    def _divergence(self, session: _Session, text: str) -> str:
        """Why `text` extends no segment, told against the segment it shares most text with."""
        shared = [len(os.path.commonprefix([text, t])) for t in session.texts]
        i = max(range(len(shared)), key=lambda j: (shared[j], j == session.last))
        seg, seg_text, c = session.segments[i], session.texts[i], shared[i]
        lo, hi = 0, len(seg.token_ids)
        while lo < hi:  # the most tokens whose text lies within the common prefix
            mid = (lo + hi + 1) // 2
            if text[:c].startswith(self.decode(seg.token_ids[:mid])):
                lo = mid
            else:
                hi = mid - 1
        where = f"segment {i} at token {lo} of {len(seg.token_ids)}"
        if c == len(text):
            return f"prompt ends inside {where} (a retried request or a branch from an earlier turn)"
        return (f"prompt diverges from {where}: the prompt has {text[c:c + 40]!r} "
                f"where the segment has {seg_text[c:c + 40]!r}")

    def _record(self, session: _Session, plan: _Plan, out: GenerateOutput) -> None:
        if plan.index is None:
            n = len(plan.new_ids)
            seg = Segment(list(plan.new_ids), [0] * n, [0.0] * n, n, [], plan.started_because or "")
            session.segments.append(seg)
            session.texts.append(plan.text)
            session.last = len(session.segments) - 1
        else:
            seg = session.segments[plan.index]
            seg.token_ids += plan.new_ids
            seg.loss_mask += [0] * len(plan.new_ids)
            seg.log_probs += [0.0] * len(plan.new_ids)
            session.texts[plan.index] = plan.text
            session.last = plan.index
        start = len(seg.token_ids)
        seg.token_ids += out.token_ids
        seg.loss_mask += [1] * len(out.token_ids)
        seg.log_probs += out.log_probs
        seg.turns.append(TurnBoundary(start, len(seg.token_ids), out.finish_reason, list(out.weight_versions)))
        session.texts[session.last] += self.decode(out.token_ids)
        session.turns += 1

    def _result(self, out: GenerateOutput, prompt_tokens: int) -> TurnResult:
        text = self.decode(out.token_ids, skip_special_tokens=True)
        stop = out.stop_reason if isinstance(out.stop_reason, str) else None
        if stop and stop in text:  # vLLM's ids include the stop string; the API's text does not
            text = text[:text.rfind(stop)]
        parsed = parse_output(text, self.tool_parser, self.reasoning_parser)
        finish = out.finish_reason
        if parsed.tool_calls and finish == "stop":
            finish = "tool_calls"
        return TurnResult(list(out.token_ids), list(out.log_probs), finish, parsed, prompt_tokens,
                          list(out.weight_versions), stop, text)

    # ---- the engine -------------------------------------------------------------------------

    def _engine(self) -> EngineClient:
        loop = asyncio.get_running_loop()
        if not self._own_client:
            return self._client
        if self._client is None or self._client_loop is not loop:
            self._client = EngineClient(self.vllm_url, timeout=3600.0)
            self._client_loop = loop
        return self._client

    async def _context_cap(self) -> int | None:
        async with self._cap_lock:
            if not self._server_max_len_known:
                self._server_max_len_known = True
                engine = self._engine()
                if not hasattr(engine, "_http"):  # not an HTTP engine (a scripted one): no server cap
                    return self.max_context_tokens
                try:
                    async with engine._http().get(engine.base_url + "/v1/models",
                                                  timeout=aiohttp.ClientTimeout(total=10)) as resp:
                        body = await resp.json(content_type=None)
                    self._server_max_len = int(body["data"][0]["max_model_len"])
                except Exception as e:  # a router without /v1/models: only max_context_tokens caps
                    log.warning("adapter.max_model_len_unknown", url=engine.base_url, error=repr(e)[:200])
        caps = [c for c in (self.max_context_tokens, self._server_max_len) if c]
        return min(caps) if caps else None

    async def _generate(self, prompt_ids: list[int], params: dict, session_id: str) -> GenerateOutput:
        try:
            return await self._engine().generate(prompt_ids, params, session_id=session_id)
        except EngineRequestError as e:
            if 400 <= e.status < 500:
                kind = "limit" if _CONTEXT_ERROR.search(e.body) else "invalid_request"
                raise AdapterError(kind, f"vLLM rejected the request: {e.body[:300]}") from None
            raise AdapterError("overloaded" if e.status == 503 else "engine",
                               f"vLLM failed: HTTP {e.status}: {e.body[:300]}") from None
        except ServiceError as e:
            raise AdapterError("engine", str(e)[:500]) from None

    async def close(self) -> None:
        if self._client is not None and self._own_client:
            await self._client.close()
            self._client = None
