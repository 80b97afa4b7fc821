"""OpenAIAdapter against malformed and hostile requests, and its wire shapes against the SDK's.

The adapter here points at a port where no vLLM listens: a request that slipped past the
checks would reach the engine and come back 502, so "every answer is a 4xx in OpenAI's error
shape and the session recorded nothing" really means every request was refused up front.
"""

from __future__ import annotations

import json

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai import AsyncOpenAI, BadRequestError, NotFoundError
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from vime.agent.adapters import OpenAIAdapter, ParsedOutput, ToolCall, TurnResult
from vime.agent.adapters.openai_chat import chat_chunks, chat_completion, parse_chat_request
from vime.agent.adapters.openai_responses import (output_items, parse_responses_request, response_events,
                                                   response_object)

SESSION = "hostile"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": "tiny", "input": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
async def app(tokenizer):
    adapter = OpenAIAdapter(tokenizer, "http://127.0.0.1:9", model_name="tiny", max_request_bytes=256 * 1024)
    adapter.open_session(SESSION)
    async with adapter.serve() as url, aiohttp.ClientSession() as http:
        yield adapter, url, http
    assert await adapter.finish_session(SESSION) == [], "a refused request was recorded"


async def post(app, route: str, data: bytes | str | object, headers: dict | None = None):
    _, url, http = app
    raw = data if isinstance(data, (bytes, str)) else json.dumps(data)
    hdrs = {"Authorization": f"Bearer {SESSION}", "Content-Type": "application/json", **(headers or {})}
    async with http.post(url + route, data=raw, headers=hdrs) as resp:
        return resp.status, await resp.text()


def assert_openai_error(status: int, text: str, expected: int | None = None):
    assert 400 <= status < 500 if expected is None else status == expected, (status, text[:300])
    error = json.loads(text)["error"]
    assert set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)
    assert "Traceback" not in text


CHAT_BAD = [
    ("not json", b"{'model': 1"), ("an array", []), ("NaN", '{"model": "m", "messages": [], "temperature": NaN}'),
    ("deep nesting", "[" * 100_000), ("no messages", {"model": "tiny"}), ("no model", {"messages": CHAT["messages"]}),
    ("empty messages", {**CHAT, "messages": []}), ("messages a dict", {**CHAT, "messages": {"role": "user"}}),
    ("bad role", {**CHAT, "messages": [{"role": "root", "content": "x"}]}),
    ("content an int", {**CHAT, "messages": [{"role": "user", "content": 5}]}),
    ("image part", {**CHAT, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
    ("tool without id", {**CHAT, "messages": [{"role": "tool", "content": "x"}]}),
    ("call arguments an int", {**CHAT, "messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": 3}}]}]}),
    ("n=2", {**CHAT, "n": 2}), ("temperature a string", {**CHAT, "temperature": "hot"}),
    ("temperature 3", {**CHAT, "temperature": 3}), ("top_p 0", {**CHAT, "top_p": 0}),
    ("max_tokens 0", {**CHAT, "max_tokens": 0}), ("max_tokens true", {**CHAT, "max_completion_tokens": True}),
    ("empty stop", {**CHAT, "stop": [""]}), ("seed huge", {**CHAT, "seed": 2**70}),
    ("tools a string", {**CHAT, "tools": "all"}), ("tool no name", {**CHAT, "tools": [{"type": "function", "function": {}}]}),
    ("tool bad name", {**CHAT, "tools": [{"type": "function", "function": {"name": "a b"}}]}),
    ("stream a string", {**CHAT, "stream": "yes"}), ("stream_options a list", {**CHAT, "stream_options": []}),
    ("tool_choice unknown", {**CHAT, "tool_choice": "always"}),
]
RESPONSES_BAD = [
    ("no input", {"model": "tiny"}), ("input a number", {**RESPONSES, "input": 5}), ("input empty", {**RESPONSES, "input": []}),
    ("only instructions", {**RESPONSES, "input": [], "instructions": "x"}),
    ("bad role", {**RESPONSES, "input": [{"role": "tool", "content": "x"}]}),
    ("image part", {**RESPONSES, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
    ("call without call_id", {**RESPONSES, "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
    ("output missing", {**RESPONSES, "input": [{"type": "function_call_output", "call_id": "c"}]}),
    ("item_reference", {**RESPONSES, "input": [{"type": "item_reference", "id": "msg_1"}]}),
    ("previous_response_id", {**RESPONSES, "previous_response_id": "resp_1"}),
    ("conversation", {**RESPONSES, "conversation": "conv_1"}), ("background", {**RESPONSES, "background": True}),
    ("instructions a list", {**RESPONSES, "instructions": ["x"]}),
    ("max_output_tokens -1", {**RESPONSES, "max_output_tokens": -1}),
    ("tool type missing", {**RESPONSES, "tools": [{"name": "f"}]}),
    ("function tool without name", {**RESPONSES, "tools": [{"type": "function", "parameters": {}}]}),
    ("parallel_tool_calls a string", {**RESPONSES, "parallel_tool_calls": "no"}),
]


@pytest.mark.parametrize("name,body", CHAT_BAD, ids=[c[0] for c in CHAT_BAD])
async def test_malformed_chat_completions_get_a_400_in_openai_shape(app, name, body):
    assert_openai_error(*await post(app, "/v1/chat/completions", body), expected=400)


@pytest.mark.parametrize("name,body", RESPONSES_BAD, ids=[c[0] for c in RESPONSES_BAD])
async def test_malformed_responses_get_a_400_in_openai_shape(app, name, body):
    assert_openai_error(*await post(app, "/v1/responses", body), expected=400)


async def test_unknown_session_huge_body_wrong_route_and_method_get_4xx(app):
    unknown = {"Authorization": "Bearer nobody"}
    assert_openai_error(*await post(app, "/v1/chat/completions", CHAT, unknown), expected=404)
    assert_openai_error(*await post(app, "/v1/responses", RESPONSES, unknown), expected=404)
    huge = {**CHAT, "messages": [{"role": "user", "content": "x" * 300_000}]}
    assert_openai_error(*await post(app, "/v1/chat/completions", huge), expected=413)
    assert_openai_error(*await post(app, "/v1/completions", CHAT), expected=404)
    _, url, http = app
    async with http.get(url + "/v1/chat/completions") as resp:
        assert_openai_error(resp.status, await resp.text(), expected=405)


async def test_the_sdk_raises_its_own_errors_with_the_adapter_message(app):
    _, url, _ = app
    client = AsyncOpenAI(base_url=url + "/v1", api_key=SESSION, max_retries=0)
    with pytest.raises(BadRequestError, match="n must be 1"):
        await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], n=2)
    with pytest.raises(NotFoundError, match="no open session"):
        await AsyncOpenAI(base_url=url + "/v1", api_key="nobody", max_retries=0).responses.create(
            model="tiny", input="x")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)
not_str = st.integers() | st.booleans() | st.lists(json_values, max_size=2) | st.dictionaries(st.text(), json_values, max_size=2)
not_number = st.text() | st.lists(json_values, max_size=2) | st.booleans() | st.dictionaries(st.text(), json_values, max_size=2)
not_bool = st.integers() | st.text() | st.floats(allow_nan=False) | st.lists(json_values, max_size=2)
bad_messages = st.one_of(
    not_str.filter(lambda v: not isinstance(v, list)), st.just([]),
    st.lists(st.integers() | st.text() | st.none(), min_size=1, max_size=3),
    st.builds(lambda r, c: [{"role": r, "content": c}], st.text().filter(lambda r: r not in (
        "system", "developer", "user", "assistant", "tool")), json_values),
    st.builds(lambda r, c: [{"role": r, "content": c}], st.sampled_from(["system", "user", "tool"]),
              st.integers() | st.booleans() | st.floats(allow_nan=False) | st.dictionaries(st.text(), json_values)),
    st.builds(lambda calls: [{"role": "assistant", "tool_calls": calls}],
              not_str.filter(lambda v: not isinstance(v, list)) | st.lists(st.integers() | st.text(), min_size=1)))
CHAT_MUTATIONS = {
    "model": not_str, "messages": bad_messages, "temperature": not_number | st.floats(2.01, 1e9),
    "top_p": not_number | st.floats(1.01, 1e9) | st.floats(-1e9, 0), "n": st.integers(2) | st.integers(max_value=0),
    "max_tokens": st.integers(max_value=0) | st.floats(allow_nan=False) | st.text(),
    "max_completion_tokens": st.integers(max_value=0) | not_number, "stop": st.integers() | st.just([""]) | st.lists(st.integers(), min_size=1),
    "seed": st.text() | st.floats(allow_nan=False) | st.integers(2**63), "tools": st.text() | st.lists(st.integers() | st.text(), min_size=1),
    "stream": not_bool, "stream_options": st.text() | st.integers() | st.lists(json_values),
    "tool_choice": st.integers() | st.text().filter(lambda t: t not in ("none", "auto", "required")),
}
bad_items = st.one_of(
    st.lists(st.integers() | st.text() | st.none(), min_size=1, max_size=3),
    st.builds(lambda t: [{"type": t}], st.integers() | st.booleans() | st.lists(st.integers())),
    st.builds(lambda r: [{"type": "message", "role": r, "content": "x"}], st.text().filter(lambda r: r not in (
        "system", "developer", "user", "assistant"))),
    st.builds(lambda c: [{"role": "user", "content": c}], st.integers() | st.booleans() | st.dictionaries(st.text(), json_values)),
    st.builds(lambda item: [item], st.fixed_dictionaries({"type": st.just("function_call"), "name": not_str})),
    st.builds(lambda item: [item], st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": not_str})),
    st.builds(lambda d: [{"type": "web_search_call", **d}], st.dictionaries(st.text(), json_values, max_size=3)))
RESPONSES_MUTATIONS = {
    "model": not_str, "input": st.integers() | st.booleans() | st.just([]) | bad_items,
    "instructions": not_str, "tools": st.text() | st.lists(st.integers() | st.text(), min_size=1),
    "max_output_tokens": st.integers(max_value=0) | not_number, "temperature": not_number | st.floats(2.01, 1e9),
    "top_p": not_number | st.floats(1.01, 1e9), "stream": not_bool, "store": not_bool, "parallel_tool_calls": not_bool,
    "previous_response_id": st.text(), "tool_choice": st.integers() | st.text().filter(lambda t: t not in ("none", "auto", "required")),
}


def mutated(base: dict, mutations: dict) -> st.SearchStrategy:
    """A valid body with 1-3 fields made invalid, plus unknown fields (which must be ignored)."""
    return st.builds(
        lambda fields, extra: {**base, **extra, **fields},
        st.dictionaries(st.sampled_from(sorted(mutations)), st.none(), min_size=1, max_size=3).flatmap(
            lambda keys: st.fixed_dictionaries({k: mutations[k] for k in keys})),
        st.dictionaries(st.text(max_size=10).filter(lambda k: k not in mutations and k not in base), json_values, max_size=3))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=mutated(CHAT, CHAT_MUTATIONS) | json_values.filter(lambda v: not isinstance(v, dict) or "messages" not in v))
async def test_property_random_chat_bodies_never_5xx_and_record_nothing(app, body):
    assert_openai_error(*await post(app, "/v1/chat/completions", body))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=mutated(RESPONSES, RESPONSES_MUTATIONS) | json_values.filter(lambda v: not isinstance(v, dict) or "input" not in v))
async def test_property_random_responses_bodies_never_5xx_and_record_nothing(app, body):
    assert_openai_error(*await post(app, "/v1/responses", body))


def sample_turn(finish: str) -> TurnResult:
    parsed = ParsedOutput("Checking.", "Think first.", [ToolCall("call_0", "get_weather", '{"city": "Paris"}')])
    return TurnResult([5, 6, 7], [-0.1, -0.2, -0.3], finish, parsed, 11)


@pytest.mark.parametrize("finish", ["tool_calls", "length"])
def test_wire_objects_validate_against_the_sdk_models(finish):
    """Every object the adapter sends parses as the SDK's own pydantic types, strictly."""
    result = sample_turn(finish)
    chat = parse_chat_request({**CHAT, "stream": True})
    ChatCompletion.model_validate(chat_completion(result, chat.model, "chatcmpl-1", 0), strict=True)
    for chunk in chat_chunks(result, chat.model, "chatcmpl-1", 0, include_usage=True):
        ChatCompletionChunk.model_validate(chunk, strict=True)
    req = parse_responses_request({**RESPONSES, "tools": [{"type": "function", "name": "get_weather"}]})
    response = Response.model_validate(response_object(req, "resp_1", 0, result, output_items(result)))
    assert response.status == ("incomplete" if finish == "length" else "completed")
    events = TypeAdapter(ResponseStreamEvent)
    for event in response_events(req, result, "resp_1", 0):
        events.validate_python(event)
