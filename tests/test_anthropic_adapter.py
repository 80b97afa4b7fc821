"""The Anthropic adapter driven by the official `anthropic` SDK, unmodified (only base_url and
api_key = session id), against the shared vLLM server on the tiny model.

The tiny model's text is random, so tool use is driven from the client side: the conversation
carries `tool_use` / `tool_result` blocks the test writes. Where a test needs the model's own
turn to be a tool call, it registers a test-only parser (named `test-...`) that reads every
turn as one; the tokens are still vLLM's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading

import aiohttp
import anthropic
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vime.agent.adapters import AnthropicAdapter
from vime.agent.adapters.anthropic import to_chat
from vime.agent.parsers import ToolCall, new_call_id, register_reasoning_parser, register_tool_parser
from vime.testing.engine import RecordingEngineClient, check_segments_against_engine

pytestmark = pytest.mark.vllm

TOOLS = [{"name": "read_file", "description": "Read a file from the repository",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]
SYSTEM = [{"type": "text", "text": "You are a coding agent."}, {"type": "text", "text": "Be brief."}]
ERROR_TYPES = {"invalid_request_error", "not_found_error", "request_too_large", "api_error", "overloaded_error"}

register_tool_parser("test-every-turn-calls-read_file",
                     lambda text: ("", [ToolCall(new_call_id(), "read_file", json.dumps({"path": text[:12]}))]))
register_reasoning_parser("test-first-half-is-reasoning", lambda text: (text[:len(text) // 2], text[len(text) // 2:]))


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
async def serve(tokenizer, vllm_server):
    """`await serve(**kwargs) -> (adapter, engine, base_url)`: an adapter on a free port whose
    engine client records what vLLM returned; stopped after the test."""
    stack = contextlib.AsyncExitStack()

    async def start(**kwargs):
        engine = RecordingEngineClient(vllm_server.url)
        stack.push_async_callback(engine.close)
        adapter = AnthropicAdapter(tokenizer, vllm_server.url, engine=engine, **kwargs)
        url = await stack.enter_async_context(adapter.serve())
        return adapter, engine, url

    yield start
    await stack.aclose()


def client(url: str, session_id: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key=session_id, max_retries=0)


async def ask(sdk: anthropic.AsyncAnthropic, stream: bool, **kwargs) -> anthropic.types.Message:
    if not stream:
        return await sdk.messages.create(**kwargs)
    async with sdk.messages.stream(**kwargs) as s:
        return await s.get_final_message()


def as_param(message: anthropic.types.Message) -> dict:
    """The assistant turn as the client sends it back in the next request's history."""
    return {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]}


async def test_sdk_multi_turn_tool_use_streaming_and_not_exports_exactly_what_vllm_sampled(serve, tokenizer):
    adapter, engine, url = await serve()
    adapter.open_session("claude-1", {"seed": 7})
    sdk = client(url, "claude-1")
    messages = [{"role": "user", "content": "What does a.py print?"}]
    for turn in range(4):
        message = await ask(sdk, stream=turn % 2 == 1, model="tiny", max_tokens=10, system=SYSTEM,
                            messages=messages, tools=TOOLS, tool_choice={"type": "auto"},
                            extra_body={"temperature": 1.0, "top_p": 0.95, "top_k": 100})
        call = engine.calls[-1]
        assert call.session_id == "claude-1" and call.sampling_params["max_tokens"] == 10
        assert message.role == "assistant" and message.model == "tiny"
        assert message.usage.input_tokens == len(call.prompt_ids)
        assert message.usage.output_tokens == len(call.output.token_ids)
        assert message.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[call.output.finish_reason]
        text = "".join(b.text for b in message.content if b.type == "text")
        assert text == tokenizer.decode(call.output.token_ids, skip_special_tokens=True)
        # the client runs a tool: its call is a turn of its own, then the result comes back
        messages += [as_param(message),
                     {"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{turn}", "name": "read_file",
                                                        "input": {"path": "a.py"}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{turn}",
                                                   "content": [{"type": "text", "text": f"print({turn})"}]},
                                                  {"type": "text", "text": "go on"}]}]
    segments = await adapter.finish_session("claude-1")
    assert len(segments) == 1, [s.started_because for s in segments]
    assert len(segments[0].turns) == 4
    check_segments_against_engine(segments, engine.calls)
    spliced = tokenizer.decode(segments[0].token_ids[segments[0].turns[0].end:segments[0].turns[1].start])
    assert '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>' in spliced
    assert "<tool_response>\nprint(0)\n</tool_response>" in spliced


@pytest.mark.parametrize("stream", [False, True])
async def test_model_tool_calls_and_thinking_come_back_as_blocks(serve, stream):
    adapter, engine, url = await serve(tool_parser="test-every-turn-calls-read_file",
                                       reasoning_parser="test-first-half-is-reasoning")
    adapter.open_session("claude-2", {"seed": 3})
    sdk = client(url, "claude-2")
    messages = [{"role": "user", "content": "Look at the repo."}]
    for turn in range(2):
        message = await ask(sdk, stream=stream, model="tiny", max_tokens=8, messages=messages, tools=TOOLS,
                            thinking={"type": "enabled", "budget_tokens": 1024})
        assert [b.type for b in message.content] == ["thinking", "tool_use"]
        assert message.stop_reason == "tool_use" or engine.calls[-1].output.finish_reason == "length"
        thinking, use = message.content
        assert thinking.thinking and use.name == "read_file" and set(use.input) == {"path"}
        assert use.id.startswith("toolu_")
        messages += [as_param(message), {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id, "content": "no such file", "is_error": True}]}]
    segments = await adapter.finish_session("claude-2")
    check_segments_against_engine(segments, engine.calls)
    # the test parser's calls do not render back to the sampled text: each turn is a new segment
    assert len(segments) == 2 and segments[1].started_because.startswith("prompt diverges from segment 0")


async def test_tool_choice_none_answers_the_models_calls_as_text(serve, tokenizer):
    adapter, engine, url = await serve(tool_parser="test-every-turn-calls-read_file", reasoning_parser=None)
    adapter.open_session("claude-none", {"seed": 2})
    message = await client(url, "claude-none").messages.create(
        model="tiny", max_tokens=6, messages=[{"role": "user", "content": "hi"}], tools=TOOLS, tool_choice={"type": "none"})
    assert [b.type for b in message.content] == ["text"] and message.stop_reason in ("end_turn", "max_tokens")
    assert message.content[0].text == tokenizer.decode(engine.calls[-1].output.token_ids, skip_special_tokens=True)
    await adapter.finish_session("claude-none")


async def test_stop_sequences_end_the_turn_and_are_cut_from_the_text(serve, tokenizer):
    adapter, engine, url = await serve(tool_parser=None, reasoning_parser=None)
    adapter.open_session("claude-3", {"seed": 1})
    message = await client(url, "claude-3").messages.create(
        model="tiny", max_tokens=64, messages=[{"role": "user", "content": "hi"}], stop_sequences=["e", "a", " "])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence in ("e", "a", " ")
    sampled = tokenizer.decode(engine.calls[-1].output.token_ids, skip_special_tokens=True)
    assert message.content[0].text == sampled[:sampled.rfind(message.stop_sequence)]
    check_segments_against_engine(await adapter.finish_session("claude-3"), engine.calls)


async def test_count_tokens_models_and_health(serve):
    adapter, engine, url = await serve()
    sdk = client(url, "anyone")
    request = {"model": "tiny", "system": SYSTEM, "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS}
    counted = await sdk.messages.count_tokens(**request)
    assert counted.input_tokens == adapter.core.count_tokens(*to_chat(request))
    adapter.open_session("claude-4")
    message = await client(url, "claude-4").messages.create(max_tokens=1, **request)
    assert message.usage.input_tokens == counted.input_tokens
    models = await sdk.models.list()
    assert [m.id for m in models.data] == ["vime"]
    async with aiohttp.ClientSession() as http:
        async with http.get(url + "/health") as resp:
            assert resp.status == 200 and (await resp.json())["status"] == "ok"


async def test_a_claude_code_request_streams_the_messages_api_events_in_order(serve):
    """What Claude Code sends: ?beta=true, betas, fields a strict parser would reject, a huge
    max_tokens, adaptive thinking, metadata; the adapter answers the exact event sequence."""
    adapter, engine, url = await serve(max_context_tokens=600)
    adapter.open_session("cc-session")
    body = {"model": "claude-sonnet-4-5", "max_tokens": 128000, "stream": True, "system": SYSTEM,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "fix it",
                                                       "cache_control": {"type": "ephemeral"}}]}],
            "tools": TOOLS, "thinking": {"type": "adaptive"}, "metadata": {"user_id": "user_abc_session_1"},
            "context_management": {"edits": []}, "output_config": {"effort": "high"}, "temperature": 1}
    headers = {"x-api-key": "cc-session", "anthropic-version": "2023-06-01", "anthropic-beta": "a,b",
               "X-Claude-Code-Session-Id": "9d5c", "x-app": "cli"}
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/messages?beta=true", json=body, headers=headers) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
            raw = await resp.text()
    events = []
    for chunk in raw.strip().split("\n\n"):
        name, data = chunk.split("\n")
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    assert all(name == data["type"] for name, data in events)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    blocks = names[2:-2]
    assert blocks and len(blocks) % 3 == 0 and blocks[::3] == ["content_block_start"] * (len(blocks) // 3)
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens" or engine.calls[-1].output.finish_reason == "stop"
    room = 600 - len(engine.calls[-1].prompt_ids)
    assert engine.calls[-1].sampling_params["max_tokens"] == room  # 128000 clamped, not rejected
    assert events[-2][1]["usage"]["output_tokens"] == len(engine.calls[-1].output.token_ids)


BIG = 33 * 1024 * 1024
HOSTILE = [
    ("not JSON", b"{not json", {}),
    ("empty body", b"", {}),
    ("a JSON array", b"[1, 2]", {}),
    ("NaN", b'{"model": "m", "max_tokens": NaN, "messages": []}', {}),
    ("invalid UTF-8", b'{"model": "\xff\xfe"}', {}),
    ("deep nesting", b"[" * 100_000 + b"]" * 100_000, {}),
    ("huge int", b'{"max_tokens": 1' + b"0" * 5000 + b"}", {}),
    ("no messages", {"model": "m", "max_tokens": 5}, {}),
    ("no max_tokens", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, {}),
    ("no model", {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}, {}),
    ("messages is a dict", {"model": "m", "max_tokens": 5, "messages": {"role": "user"}}, {}),
    ("empty messages", {"model": "m", "max_tokens": 5, "messages": []}, {}),
    ("tool role", {"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, {}),
    ("system content a number", {"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": 1}]}, {}),
    ("content is a number", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": 5}]}, {}),
    ("missing content", {"model": "m", "max_tokens": 5, "messages": [{"role": "user"}]}, {}),
    ("unknown block", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]}, {}),
    ("block without type", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"text": "x"}]}]}, {}),
    ("text not a string", {"model": "m", "max_tokens": 5,
                           "messages": [{"role": "user", "content": [{"type": "text", "text": ["x"]}]}]}, {}),
    ("tool_result without id", {"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]}, {}),
    ("tool_use input a list", {"model": "m", "max_tokens": 5, "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": [1]}]}]}, {}),
    ("system is a number", {"model": "m", "max_tokens": 5, "system": 3, "messages": [{"role": "user", "content": "x"}]}, {}),
    ("tools not a list", {"model": "m", "max_tokens": 5, "tools": {}, "messages": [{"role": "user", "content": "x"}]}, {}),
    ("tool without schema", {"model": "m", "max_tokens": 5, "tools": [{"name": "f"}],
                             "messages": [{"role": "user", "content": "x"}]}, {}),
    ("max_tokens 0", {"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, {}),
    ("max_tokens a string", {"model": "m", "max_tokens": "5", "messages": [{"role": "user", "content": "x"}]}, {}),
    ("max_tokens true", {"model": "m", "max_tokens": True, "messages": [{"role": "user", "content": "x"}]}, {}),
    ("temperature a string", {"model": "m", "max_tokens": 5, "temperature": "hot",
                              "messages": [{"role": "user", "content": "x"}]}, {}),
    ("temperature huge", {"model": "m", "max_tokens": 5, "temperature": 10 ** 400,
                          "messages": [{"role": "user", "content": "x"}]}, {}),
    ("stop_sequences a number", {"model": "m", "max_tokens": 5, "stop_sequences": 1,
                                 "messages": [{"role": "user", "content": "x"}]}, {}),
    ("stream a string", {"model": "m", "max_tokens": 5, "stream": "yes", "messages": [{"role": "user", "content": "x"}]}, {}),
    ("bad tool_choice", {"model": "m", "max_tokens": 5, "tool_choice": {"type": "sometimes"},
                         "messages": [{"role": "user", "content": "x"}]}, {}),
    ("thinking a string", {"model": "m", "max_tokens": 5, "thinking": "on", "messages": [{"role": "user", "content": "x"}]}, {}),
    ("lone surrogate", b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "\\ud800"}]}', {}),
    ("unknown session", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
     {"x-api-key": "nobody"}),
    ("no session at all", {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
     {"x-api-key": ""}),
    ("huge body", b'{"model": "' + b"a" * BIG + b'"}', {}),
]


async def test_malformed_and_hostile_requests_get_4xx_in_anthropic_shape_and_record_nothing(serve):
    adapter, engine, url = await serve()
    adapter.open_session("victim", {"max_tokens": 1})
    async with aiohttp.ClientSession() as http:
        for name, body, extra in HOSTILE:
            headers = {"x-api-key": "victim", "content-type": "application/json", **extra}
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            async with http.post(url + "/v1/messages", data=data, headers=headers) as resp:
                text = await resp.text()
                assert 400 <= resp.status < 500, (name, resp.status, text[:300])
                error = json.loads(text)
                assert error["type"] == "error" and error["error"]["type"] in ERROR_TYPES, (name, error)
                assert "Traceback" not in text and error["error"]["message"], name
        for method, path in [("GET", "/v1/messages"), ("POST", "/v1/nothing"), ("DELETE", "/v1/models")]:
            async with http.request(method, url + path) as resp:
                assert resp.status in (404, 405) and (await resp.json())["type"] == "error"
    assert engine.calls == []
    assert await adapter.finish_session("victim") == []
    with pytest.raises(anthropic.NotFoundError):
        await client(url, "victim").messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "x"}])


# ---- property: thousands of random bodies ---------------------------------------------------

junk = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=6)


def maybe(good, junk_in_ten: int = 5):
    """`good` or, `junk_in_ten` times in ten, any JSON value in its place."""
    return st.integers(0, 9).flatmap(lambda i: junk if i < junk_in_ten else good)


block = st.fixed_dictionaries(
    {"type": maybe(st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image", "redacted_thinking"]), 2)},
    optional={"text": maybe(st.text(max_size=20), 2), "id": maybe(st.just("toolu_1")),
              "name": maybe(st.just("read_file"), 2), "input": maybe(st.dictionaries(st.text(max_size=5), st.integers(), max_size=2), 2),
              "tool_use_id": maybe(st.just("toolu_1"), 2), "content": maybe(st.text(max_size=20), 2),
              "thinking": maybe(st.text(max_size=20), 2)})
message = st.fixed_dictionaries({"role": maybe(st.sampled_from(["user", "assistant"]), 1),
                                 "content": maybe(st.text(max_size=20) | st.lists(block, max_size=3), 2)})
bodies = st.fixed_dictionaries(
    {"model": maybe(st.just("tiny"), 1), "max_tokens": maybe(st.just(1), 1),
     "messages": maybe(st.lists(message, min_size=1, max_size=3), 1)},
    optional={"system": maybe(st.text(max_size=20)), "tools": maybe(st.just(TOOLS)), "stream": maybe(st.booleans()),
              "temperature": maybe(st.floats(0, 1)), "top_k": maybe(st.integers(-1, 50)),
              "stop_sequences": maybe(st.lists(st.text(min_size=1, max_size=3))),
              "tool_choice": maybe(st.sampled_from([{"type": "auto"}, {"type": "none"}, {"type": "tool", "name": "read_file"}])),
              "thinking": maybe(st.just({"type": "enabled", "budget_tokens": 100})), "metadata": junk,
              "context_management": junk})
payloads = st.one_of(bodies.map(lambda b: json.dumps(b).encode()), st.binary(max_size=40),
                     junk.map(lambda j: json.dumps(j).encode()))


@pytest.fixture(scope="module")
def threaded_adapter(tokenizer, vllm_server):
    """An adapter serving from its own thread and event loop, so hypothesis can drive it with a
    plain synchronous HTTP client."""
    loop = asyncio.new_event_loop()
    engine = RecordingEngineClient(vllm_server.url)
    adapter = AnthropicAdapter(tokenizer, vllm_server.url, engine=engine)
    adapter.open_session("fuzz", {"max_tokens": 1})
    ready, stop = threading.Event(), None
    holder = {}

    async def main():
        nonlocal stop
        stop = asyncio.Event()
        async with adapter.serve() as url:
            holder["url"] = url
            ready.set()
            await stop.wait()
        await engine.close()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(30)
    yield adapter, engine, holder["url"], loop
    loop.call_soon_threadsafe(stop.set)
    thread.join(30)


def test_random_bodies_never_get_a_5xx_and_only_successes_are_recorded(threaded_adapter):
    adapter, engine, url, loop = threaded_adapter
    seen = {"ok": 0, "error": 0}
    with httpx.Client(base_url=url, headers={"x-api-key": "fuzz"}, timeout=60) as http:

        @settings(max_examples=1000, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
        @given(payloads)
        def check(payload: bytes):
            before = len(engine.calls)
            resp = http.post("/v1/messages", content=payload, headers={"content-type": "application/json"})
            assert resp.status_code < 500, (payload[:300], resp.text[:300])
            if resp.status_code == 200:
                seen["ok"] += 1
                assert len(engine.calls) == before + 1
            else:
                seen["error"] += 1
                assert 400 <= resp.status_code < 500
                error = resp.json()
                assert error["type"] == "error" and error["error"]["type"] in ERROR_TYPES
                assert len(engine.calls) == before, (payload[:300], resp.text[:300])

        check()
    segments = asyncio.run_coroutine_threadsafe(adapter.finish_session("fuzz"), loop).result(60)
    check_segments_against_engine(segments, engine.calls)
    assert seen["ok"] >= 50 and seen["error"] >= 300, seen
