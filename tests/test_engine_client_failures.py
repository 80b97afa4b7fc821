"""How `EngineClient` fails: stalls, cut connections and error statuses are `ServiceError`s.

These need a server that misbehaves on cue (stops mid-stream, cuts a body after some bytes),
which a real vLLM cannot be made to do exactly; the fake below speaks vLLM's streamed
`/inference/v1/generate` protocol (server-sent events of token-id deltas, then `[DONE]`).
The same failures on a real vLLM server are in tests/test_engine_failures.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio
from aiohttp import web

from vime.engine.client import (
    GENERATE_ROUTE,
    EngineClient,
    EngineRequestError,
    merge_stream_chunk,
    parse_generate_response,
    pop_sse_events,
    stream_body,
)
from vime.errors import ServiceError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SLACK = 3.0  # seconds a loaded 2-core machine may add to a bound


def token_chunk(token_id: int, index: int = 0, finish: str | None = None, versions=None) -> dict:
    return {"choices": [{"index": index, "token_ids": [token_id],
                         "logprobs": {"content": [{"token_id": token_id, "logprob": -token_id / 10}]},
                         "finish_reason": finish, "stop_reason": None, "weight_versions": versions}]}


async def open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    return resp


async def send(resp: web.StreamResponse, event: dict | str) -> None:
    data = event if isinstance(event, str) else json.dumps(event)
    await resp.write(f"data: {data}\n\n".encode())


def drip(tokens: int, gap: float) -> Handler:
    """A healthy stream: one token every `gap` seconds, then the finish and `[DONE]`."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await open_stream(request)
        for t in range(1, tokens + 1):
            await asyncio.sleep(gap)
            last = t == tokens
            await send(resp, token_chunk(t, finish="length" if last else None,
                                         versions=[{"version": "v0", "start": 0, "end": tokens}] if last else None))
        await send(resp, "[DONE]")
        return resp

    return handler


async def silent_after_one_token(request: web.Request) -> web.StreamResponse:
    resp = await open_stream(request)
    await send(resp, token_chunk(1))
    await asyncio.sleep(3600)
    return resp


async def silent_before_answering(request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(3600)
    return web.Response()


async def cut_mid_body(request: web.Request) -> web.StreamResponse:
    resp = await open_stream(request)
    await send(resp, token_chunk(1))
    request.transport.close()  # the connection drops inside a chunked body
    return resp


async def ends_without_done(request: web.Request) -> web.StreamResponse:
    resp = await open_stream(request)
    await send(resp, token_chunk(1))
    await resp.write_eof()
    return resp


async def error_event_mid_stream(request: web.Request) -> web.StreamResponse:
    resp = await open_stream(request)
    await send(resp, token_chunk(1))
    await send(resp, {"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError",
                                "param": None, "code": 500}})
    await send(resp, "[DONE]")
    return resp


def status(code: int) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": f"status {code}", "code": code}}, status=code)

    return handler


@pytest_asyncio.fixture
async def fake_vllm() -> AsyncIterator[Callable[..., Awaitable[str]]]:
    """Start fake servers: `url = await fake_vllm(handler)` serves `handler` on the generate route
    (and on /json for `post_json`); requests seen are counted in `fake_vllm.hits`."""
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        async def counted(request: web.Request) -> web.StreamResponse:
            start.hits += 1
            return await handler(request)

        app = web.Application()
        app.router.add_post(GENERATE_ROUTE, counted)
        app.router.add_post("/json", counted)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    start.hits = 0
    yield start
    for runner in runners:
        await runner.cleanup()


async def timed(awaitable: Awaitable) -> tuple[BaseException | object, float]:
    t0 = time.monotonic()
    try:
        result: BaseException | object = await awaitable
    except BaseException as e:  # noqa: BLE001 - the test inspects what came out
        result = e
    return result, time.monotonic() - t0


async def test_a_stream_that_keeps_progressing_is_never_cut_however_long_it_takes(fake_vllm):
    url = await fake_vllm(drip(tokens=12, gap=0.1))
    async with EngineClient(url, progress_timeout=0.5) as client:
        out, elapsed = await timed(client.generate([1, 2, 3], {"max_tokens": 12}))
    assert elapsed > 2 * 0.5  # longer than the bound, in total
    assert out.token_ids == list(range(1, 13))
    assert out.log_probs == [-t / 10 for t in range(1, 13)]
    assert out.finish_reason == "length"
    assert out.weight_versions == [{"version": "v0", "start": 0, "end": 12}]


async def test_a_stream_that_goes_silent_fails_with_a_service_error_within_the_progress_timeout(fake_vllm):
    url = await fake_vllm(silent_after_one_token)
    async with EngineClient(url, progress_timeout=0.5) as client:
        error, elapsed = await timed(client.generate([1, 2, 3], {"max_tokens": 8}))
    assert isinstance(error, ServiceError) and "sent nothing for 0.5 s" in str(error)
    assert 0.5 <= elapsed < 0.5 + SLACK


async def test_a_server_that_never_answers_fails_within_the_progress_timeout(fake_vllm):
    url = await fake_vllm(silent_before_answering)
    async with EngineClient(url, progress_timeout=0.5) as client:
        error, elapsed = await timed(client.generate([1, 2, 3], {"max_tokens": 8}))
    assert isinstance(error, ServiceError) and "progress_timeout" in str(error)
    assert elapsed < 0.5 + SLACK


async def test_a_queued_request_waits_as_long_as_the_server_streams_to_others(fake_vllm):
    """A request behind others gets no byte until it runs; that is not a stall while the
    server keeps sending to the rest of the client's streams."""

    async def queue(request: web.Request) -> web.StreamResponse:
        if (await request.json())["request_id"] == "queued":
            await asyncio.sleep(1.5)  # three progress timeouts without a byte of its own
            return await drip(tokens=1, gap=0)(request)
        return await drip(tokens=20, gap=0.1)(request)

    url = await fake_vllm(queue)
    async with EngineClient(url, progress_timeout=0.5) as client:
        outs = await asyncio.gather(client.generate([1], {}, request_id="running"),
                                    client.generate([1], {}, request_id="queued"))
    assert [len(o.token_ids) for o in outs] == [20, 1]


async def test_a_connection_cut_mid_body_is_a_service_error_not_an_aiohttp_exception(fake_vllm):
    url = await fake_vllm(cut_mid_body)
    async with EngineClient(url) as client:
        with pytest.raises(ServiceError, match="broke mid-answer") as e:
            await client.generate([1, 2, 3], {"max_tokens": 8})
    assert not isinstance(e.value, EngineRequestError)
    assert fake_vllm.hits == 1  # the server had answered: the request may have run, so no retry


async def test_a_stream_that_ends_before_done_is_a_service_error(fake_vllm):
    url = await fake_vllm(ends_without_done)
    async with EngineClient(url) as client:
        with pytest.raises(ServiceError, match="closed the stream before it was complete"):
            await client.generate([1, 2, 3], {"max_tokens": 8})


async def test_a_server_that_drops_the_connection_before_answering_is_retried_then_a_service_error(fake_vllm):
    async def hang_up(request: web.Request) -> web.Response:
        request.transport.close()
        return web.Response()

    url = await fake_vllm(hang_up)
    async with EngineClient(url) as client:
        with pytest.raises(ServiceError, match=f"cannot reach vLLM at {url}{GENERATE_ROUTE}"):
            await client.generate([1, 2, 3], {"max_tokens": 8})
    assert fake_vllm.hits == 3


@pytest.mark.parametrize("code", [400, 404, 500, 503])
async def test_an_error_status_is_an_engine_request_error_that_keeps_the_status(fake_vllm, code):
    url = await fake_vllm(status(code))
    async with EngineClient(url) as client:
        with pytest.raises(EngineRequestError, match=f"HTTP {code}") as e:
            await client.generate([1, 2, 3], {"max_tokens": 8})
    assert e.value.status == code and isinstance(e.value, ServiceError)
    assert f"status {code}" in e.value.body


async def test_an_error_sent_mid_stream_is_an_engine_request_error_with_its_status(fake_vllm):
    url = await fake_vllm(error_event_mid_stream)
    async with EngineClient(url) as client:
        with pytest.raises(EngineRequestError, match="EngineCore encountered an issue") as e:
            await client.generate([1, 2, 3], {"max_tokens": 8})
    assert e.value.status == 500


async def test_a_server_that_answers_in_one_json_body_is_read_as_it_is(fake_vllm):
    body = {"choices": [{"index": 0, "token_ids": [5, 6], "finish_reason": "stop", "stop_reason": 2,
                         "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -1.5}]},
                         "weight_versions": [{"version": "v3", "start": 0, "end": 2}]}]}

    async def plain(request: web.Request) -> web.Response:
        return web.json_response(body)

    url = await fake_vllm(plain)
    async with EngineClient(url) as client:
        out = await client.generate([1], {"max_tokens": 2})
    assert out == parse_generate_response(body)[0]


async def test_post_json_turns_a_cut_body_into_a_service_error(fake_vllm):
    url = await fake_vllm(cut_mid_body)
    async with EngineClient(url) as client:
        with pytest.raises(ServiceError, match="broke mid-answer"):
            await client.post_json("/json", {})


def test_a_progress_timeout_must_be_a_positive_number_of_seconds():
    with pytest.raises(ValueError, match="progress_timeout=0"):
        EngineClient("http://127.0.0.1:1", progress_timeout=0)


def test_streamed_chunks_add_up_to_the_body_a_single_answer_would_have_been():
    """Two interleaved choices; the finish, stop reason and weight versions come last."""
    events = bytearray()
    for chunk in (token_chunk(7, index=1), token_chunk(3, index=0), token_chunk(8, index=1, finish="stop"),
                  token_chunk(4, index=0, finish="length", versions=[{"version": "a", "start": 0, "end": 2}])):
        events += f"data: {json.dumps(chunk)}\n\n".encode()
    events += b"data: [DONE]\n\ndata: {\"partial"
    choices: dict = {}
    decoded = pop_sse_events(events)
    assert decoded[-1] == b"[DONE]" and bytes(events) == b'data: {"partial'  # the partial event waits
    for event in decoded[:-1]:
        merge_stream_chunk(choices, json.loads(event))
    first, second = parse_generate_response(stream_body(choices))
    assert (first.token_ids, first.log_probs, first.finish_reason) == ([3, 4], [-0.3, -0.4], "length")
    assert first.weight_versions == [{"version": "a", "start": 0, "end": 2}]
    assert (second.token_ids, second.log_probs, second.finish_reason) == ([7, 8], [-0.7, -0.8], "stop")
