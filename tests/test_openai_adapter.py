"""OpenAIAdapter end to end: the unmodified `openai` SDK and the OpenAI Agents SDK against the
adapter in front of the shared vLLM CPU server on the tiny model.

The tiny model's output is random, so tool-use turns are written into the history by the test
(as a client replaying an earlier call would) and the model's own replies are echoed back as
the SDK returned them. What is checked is the protocol (the SDKs parse every answer, streamed
or not) and the training invariant: the exported segments hold exactly the ids vLLM was sent
and sampled, logprobs 1:1, loss mask 1 exactly on sampled ids. Tests named `scripted` replace
the core's turn with a fixed `TurnResult` (a tool call the random model would not write) to
drive the SDKs' tool loops; they need no vLLM.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path
from dataclasses import dataclass, field

import pytest
from openai import AsyncOpenAI

from vime.agent.adapters import OpenAIAdapter, ParsedOutput, ToolCall, TurnResult
from vime.agent.parsers import get_reasoning_parser, get_tool_parser, parse_output
from vime.engine.client import EngineClient

CHAT_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
RESPONSES_TOOLS = [{"type": "function", **CHAT_TOOLS[0]["function"], "strict": False}, {"type": "web_search"}]
WEATHER_CALL = {"id": "call_w1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@dataclass
class Served:
    adapter: OpenAIAdapter
    url: str
    calls: list = field(default_factory=list)  # (prompt ids, GenerateOutput, session id) per vLLM call

    def client(self, session_id: str) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=self.url + "/v1", api_key=session_id, max_retries=0)


@pytest.fixture
async def served(vllm_server, tokenizer, monkeypatch):
    """The adapter on a local port; every generate call vLLM answers is recorded as returned."""
    calls: list = []
    generate = EngineClient.generate

    async def recording(self, token_ids, sampling_params=None, *, session_id=None, request_id=None):
        out = await generate(self, token_ids, sampling_params, session_id=session_id, request_id=request_id)
        calls.append((list(token_ids), out, session_id))
        return out

    monkeypatch.setattr(EngineClient, "generate", recording)
    adapter = OpenAIAdapter(tokenizer, vllm_server.url, model_name="tiny")
    async with adapter.serve() as url:
        yield Served(adapter, url, calls)


@pytest.fixture
async def scripted(tokenizer):
    """The adapter with its core's turn replaced by queued `TurnResult`s (no vLLM)."""
    adapter = OpenAIAdapter(tokenizer, "http://127.0.0.1:9", model_name="tiny")
    queue: list[TurnResult] = []
    seen: list[tuple[list, list | None]] = []

    async def run_turn(session_id, messages, tools, sampling):
        assert adapter.core.has_session(session_id)
        seen.append((messages, tools))
        return queue.pop(0)

    adapter.core.run_turn = run_turn
    async with adapter.serve() as url:
        yield Served(adapter, url), queue, seen


def turn(content="", reasoning=None, calls=(), finish="stop") -> TurnResult:
    tool_calls = [ToolCall(f"call_{i}", name, args) for i, (name, args) in enumerate(calls)]
    parsed = ParsedOutput(content, reasoning, tool_calls)
    return TurnResult([1, 2, 3], [-0.5] * 3, "tool_calls" if tool_calls else finish, parsed, 10, text=content)


def assert_trajectory(segments, calls, session_id):
    """Segments hold the ids vLLM saw and sampled, in order; mask and logprobs match."""
    sampled = [(seg, t) for seg in segments for t in seg.turns]
    assert len(sampled) == len(calls) > 0
    for (seg, t), (prompt, out, routed) in zip(sampled, calls):
        assert routed == session_id
        assert seg.token_ids[:t.start] == prompt
        assert seg.token_ids[t.start:t.end] == out.token_ids
        assert seg.log_probs[t.start:t.end] == out.log_probs
        assert t.finish_reason == out.finish_reason
    for seg in segments:
        assert len(seg.token_ids) == len(seg.loss_mask) == len(seg.log_probs)
        sampled_at = {i for t in seg.turns for i in range(t.start, t.end)}
        assert seg.loss_mask == [int(i in sampled_at) for i in range(len(seg.token_ids))]
        assert all(lp == 0.0 for i, lp in enumerate(seg.log_probs) if i not in sampled_at)


def expected_answer(tokenizer, out) -> ParsedOutput:
    text = tokenizer.decode(out.token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    if isinstance(out.stop_reason, str) and out.stop_reason in text:
        text = text[:text.rfind(out.stop_reason)]
    return parse_output(text, get_tool_parser("hermes"), get_reasoning_parser("think"))


@dataclass
class Reply:
    content: str
    reasoning: str | None
    tool_calls: list[dict]
    finish_reason: str
    usage: object


async def chat(client: AsyncOpenAI, stream: bool, **kwargs) -> Reply:
    """One chat completion, streamed chunks accumulated as a client does."""
    if not stream:
        r = await client.chat.completions.create(model="tiny", **kwargs)
        m = r.choices[0].message
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in m.tool_calls or []]
        return Reply(m.content or "", (m.model_extra or {}).get("reasoning_content"), calls,
                     r.choices[0].finish_reason, r.usage)
    content, reasoning, calls, finish, usage = "", "", {}, None, None
    async for chunk in await client.chat.completions.create(
            model="tiny", stream=True, stream_options={"include_usage": True}, **kwargs):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            for tc in choice.delta.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.id or slot["id"]
                if tc.function:
                    slot["name"] += tc.function.name or ""
                    slot["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    return Reply(content, reasoning or None, [calls[i] for i in sorted(calls)], finish, usage)


def assert_reply(reply: Reply, call, tokenizer):
    prompt, out, _ = call
    want = expected_answer(tokenizer, out)
    assert reply.content == want.content and reply.reasoning == want.reasoning
    assert [(c["name"], c["arguments"]) for c in reply.tool_calls] == [(c.name, c.arguments) for c in want.tool_calls]
    assert all(c["id"].startswith("call_") for c in reply.tool_calls)
    finish = {"length": "length", "stop": "tool_calls" if want.tool_calls else "stop"}[out.finish_reason]
    assert reply.finish_reason == finish
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(prompt), len(out.token_ids))


@pytest.mark.vllm
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_sdk_chat_completions_multi_turn_tool_use_exports_the_sampled_tokens(served, tokenizer, stream):
    sid = f"chat-{stream}"
    served.adapter.open_session(sid, sampling_defaults={"max_tokens": 24, "temperature": 1.0})
    client = served.client(sid)
    messages: list[dict] = [{"role": "developer", "content": "You answer weather questions."},
                            {"role": "user", "content": "What's the weather in Paris?"}]
    replies = [await chat(client, stream, messages=messages, tools=CHAT_TOOLS, seed=1)]
    messages.append({"role": "assistant", "content": replies[0].content,
                     **({"tool_calls": [{"id": c["id"], "type": "function", "function": {
                         "name": c["name"], "arguments": c["arguments"]}} for c in replies[0].tool_calls]}
                        if replies[0].tool_calls else {})})
    messages += [{"role": "tool", "tool_call_id": c["id"], "content": "unknown"} for c in replies[0].tool_calls]
    messages += [{"role": "user", "content": "Use the tool."},
                 {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]},
                 {"role": "tool", "tool_call_id": "call_w1", "content": "sunny, 21 C"}]
    replies.append(await chat(client, stream, messages=messages, tools=CHAT_TOOLS, max_completion_tokens=12,
                              stop=["\n\n"], tool_choice="auto"))
    messages += [{"role": "assistant", "content": replies[1].content},
                 {"role": "user", "content": [{"type": "text", "text": "Thanks. "}, {"type": "text", "text": "Bye."}]}]
    messages[1] = {"role": "user", "content": "What's the weather in Rome?"}  # the client edits history
    replies.append(await chat(client, stream, messages=messages, tools=CHAT_TOOLS, max_tokens=8,
                              temperature=0.7, top_p=0.9, n=1))
    segments = await served.adapter.finish_session(sid)
    assert_trajectory(segments, served.calls, sid)
    assert [len(s.turns) for s in segments] == [2, 1] and "diverges" in segments[1].started_because
    for reply, call in zip(replies, served.calls):
        assert_reply(reply, call, tokenizer)
    assert len(served.calls[1][1].token_ids) <= 12 and len(served.calls[2][1].token_ids) <= 8


@pytest.mark.vllm
async def test_an_echoed_reply_extends_the_segment_with_only_the_new_text(served, tokenizer):
    sid = "chat-echo"
    served.adapter.open_session(sid, sampling_defaults={"max_tokens": 8, "temperature": 1.0})
    client = served.client(sid)
    messages = [{"role": "user", "content": "Hello."}]
    first = await chat(client, False, messages=messages, seed=3)
    round_trips = tokenizer.decode(served.calls[0][1].token_ids, skip_special_tokens=False) == first.content
    assert round_trips, "seed 3 sampled a special or markup token; pick a seed whose reply is plain text"
    messages += [{"role": "assistant", "content": first.content}, {"role": "user", "content": "More."}]
    await chat(client, False, messages=messages, seed=4)
    segments = await served.adapter.finish_session(sid)
    assert_trajectory(segments, served.calls, sid)
    assert len(segments) == 1 and len(segments[0].turns) == 2
    t0, t1 = segments[0].turns
    between = tokenizer.decode(segments[0].token_ids[t0.end:t1.start])
    assert between == "<|im_end|>\n<|im_start|>user\nMore.<|im_end|>\n<|im_start|>assistant\n"


async def respond(client: AsyncOpenAI, stream: bool, **kwargs):
    """One Responses call; streamed through the SDK's strict stream state (`responses.stream`)."""
    if not stream:
        return await client.responses.create(model="tiny", **kwargs)
    async with client.responses.stream(model="tiny", **kwargs) as events:
        seen = [event async for event in events]
        final = await events.get_final_response()
    assert [e.sequence_number for e in seen] == list(range(len(seen)))
    assert [e.type for e in seen[:2]] == ["response.created", "response.in_progress"]
    assert seen[-1].type == "response.completed"
    return final


@pytest.mark.vllm
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_sdk_responses_multi_turn_tool_use_exports_the_sampled_tokens(served, tokenizer, stream):
    sid = f"responses-{stream}"
    served.adapter.open_session(sid, sampling_defaults={"max_tokens": 24, "temperature": 1.0})
    client = served.client(sid)
    common = {"instructions": "You answer weather questions.", "tools": RESPONSES_TOOLS, "store": False,
              "include": ["reasoning.encrypted_content"], "parallel_tool_calls": False, "tool_choice": "auto",
              "reasoning": {"effort": "low"}, "prompt_cache_key": sid,
              "extra_body": {"client_metadata": {"turn": "1"}}}
    responses = [await respond(client, stream, input="What's the weather in Paris?", **common)]
    items: list[dict] = [{"role": "user", "content": "What's the weather in Paris?"}]
    items += [o.model_dump(exclude_none=True) for o in responses[0].output]
    items += [{"type": "function_call_output", "call_id": o.call_id, "output": "unknown"}
              for o in responses[0].output if o.type == "function_call"]
    items += [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Use the tool."}]},
              {"type": "function_call", "call_id": "call_w1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
              {"type": "function_call_output", "call_id": "call_w1", "output": "sunny, 21 C"}]
    responses.append(await respond(client, stream, input=items, max_output_tokens=12, **common))
    items += [o.model_dump(exclude_none=True) for o in responses[1].output]
    items += [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Thanks."}]
    responses.append(await respond(client, stream, input=items, max_output_tokens=8, temperature=0.7, **common))
    segments = await served.adapter.finish_session(sid)
    assert_trajectory(segments, served.calls, sid)
    for r, (prompt, out, _) in zip(responses, served.calls):
        want = expected_answer(tokenizer, out)
        assert r.id.startswith("resp_") and r.output_text == want.content
        calls = [(o.name, o.arguments) for o in r.output if o.type == "function_call"]
        assert calls == [(c.name, c.arguments) for c in want.tool_calls]
        assert r.status == ("incomplete" if out.finish_reason == "length" else "completed")
        assert (r.usage.input_tokens, r.usage.output_tokens) == (len(prompt), len(out.token_ids))
        assert [t.name for t in r.tools] == ["get_weather"]


@pytest.mark.vllm
@pytest.mark.parametrize("api", ["chat_completions", "responses"])
async def test_openai_agents_sdk_runs_an_agent_with_a_function_tool(served, api):
    from agents import (Agent, MaxTurnsExceeded, ModelSettings, OpenAIChatCompletionsModel,
                        OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled)

    set_tracing_disabled(True)

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return f"sunny in {city}"

    sid = f"agents-{api}"
    served.adapter.open_session(sid, sampling_defaults={"max_tokens": 16})
    model_cls = OpenAIChatCompletionsModel if api == "chat_completions" else OpenAIResponsesModel
    agent = Agent(name="weather", instructions="Answer with the weather tool.", tools=[get_weather],
                  model=model_cls(model="tiny", openai_client=served.client(sid)),
                  model_settings=ModelSettings(temperature=1.0, max_tokens=16))
    try:
        if api == "responses":  # the streamed path: every SSE event goes through the SDK's handler
            run = Runner.run_streamed(agent, "What's the weather in Paris?", max_turns=3)
            async for _ in run.stream_events():
                pass
        else:
            await Runner.run(agent, "What's the weather in Paris?", max_turns=3)
    except MaxTurnsExceeded:
        pass  # the random model kept calling tools: the protocol held, the session just ran out
    segments = await served.adapter.finish_session(sid)
    assert_trajectory(segments, served.calls, sid)


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
async def test_scripted_agents_sdk_tool_loop_calls_the_tool_and_sends_its_output_back(scripted, api):
    from agents import (Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool,
                        set_tracing_disabled)

    set_tracing_disabled(True)
    served, queue, seen = scripted
    ran: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        ran.append(city)
        return f"sunny in {city}"

    queue += [turn("Let me look.", reasoning="User wants weather.", calls=[("get_weather", '{"city": "Paris"}')]),
              turn("It is sunny in Paris.")]
    served.adapter.open_session("s")
    model_cls = OpenAIChatCompletionsModel if api == "chat_completions" else OpenAIResponsesModel
    agent = Agent(name="weather", instructions="Use the tool.", tools=[get_weather],
                  model=model_cls(model="tiny", openai_client=served.client("s")))
    run = Runner.run_streamed(agent, "Weather in Paris?", max_turns=4)
    async for _ in run.stream_events():
        pass
    assert run.final_output == "It is sunny in Paris." and ran == ["Paris"]
    second, tools = seen[1]
    assert [t["function"]["name"] for t in tools] == ["get_weather"]
    assistant = next(m for m in second if m["role"] == "assistant")
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["get_weather"]
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    tool_msg = next(m for m in second if m["role"] == "tool")
    assert tool_msg["tool_call_id"] == assistant["tool_calls"][0]["id"] and "sunny in Paris" in tool_msg["content"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_scripted_tool_calls_and_reasoning_reach_sdk_clients_intact(scripted, stream):
    served, queue, _ = scripted
    served.adapter.open_session("s")
    client = served.client("s")
    calls = [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')]
    queue += [turn("Checking both.", reasoning="Two cities.", calls=calls)] * 2
    reply = await chat(client, stream, messages=[{"role": "user", "content": "Paris and Rome?"}], tools=CHAT_TOOLS)
    assert (reply.content, reply.reasoning, reply.finish_reason) == ("Checking both.", "Two cities.", "tool_calls")
    assert [(c["id"], c["name"], c["arguments"]) for c in reply.tool_calls] == [
        ("call_0", *calls[0]), ("call_1", *calls[1])]
    r = await respond(client, stream, input="Paris and Rome?", tools=RESPONSES_TOOLS)
    assert [o.type for o in r.output] == ["reasoning", "message", "function_call", "function_call"]
    assert r.output[0].content[0].text == "Two cities." and r.output_text == "Checking both."
    assert [(o.call_id, o.name, o.arguments) for o in r.output[2:]] == [("call_0", *calls[0]), ("call_1", *calls[1])]


async def test_scripted_tool_choice_none_answers_a_written_call_as_text(scripted):
    served, queue, _ = scripted
    served.adapter.open_session("s")
    raw = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
    result = turn("", calls=[("get_weather", "{}")])
    result.text = raw
    queue.append(result)
    r = await served.client("s").chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], tools=CHAT_TOOLS, tool_choice="none")
    assert r.choices[0].message.content == raw and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"


async def test_models_and_health_routes(scripted):
    served, _, _ = scripted
    models = await served.client("anything").models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert (await served.client("x").models.retrieve("gpt-5")).id == "gpt-5"
    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(served.url + "/health") as resp:
        assert resp.status == 200 and (await resp.json())["status"] == "ok"


def codex_binary() -> str | None:
    """Codex CLI: $VIME_CODEX_BIN, the repo's node_modules (scripts/setup.sh installs it), or PATH."""
    local = Path(__file__).resolve().parent.parent / "node_modules" / ".bin" / "codex"
    return os.environ.get("VIME_CODEX_BIN") or (str(local) if local.exists() else shutil.which("codex"))


@pytest.mark.skipif(codex_binary() is None, reason="Codex CLI not installed (npm install @openai/codex)")
async def test_scripted_codex_cli_runs_a_tool_and_finishes_over_the_responses_api(scripted, tmp_path):
    """Codex's first request is ~8.5k tiny-model tokens, past the shared server's 4096-token
    context, so the real CLI is driven with scripted turns: a shell call, then an answer."""
    served, queue, seen = scripted
    call = ToolCall("call_x", "exec_command", json.dumps({"cmd": "echo hello-from-tool"}))
    queue += [TurnResult([1], [-0.1], "tool_calls", ParsedOutput("", "Use the shell.", [call]), 9),
              turn("Done.")]
    served.adapter.open_session("codex-session")
    (tmp_path / "home").mkdir()
    provider = f'model_providers.local={{name="local",base_url="{served.url}/v1",env_key="OPENAI_API_KEY",' \
               'wire_api="responses"}'
    proc = await asyncio.create_subprocess_exec(
        codex_binary(), "exec", "--skip-git-repo-check", "--sandbox", "danger-full-access", "-c", provider,
        "-c", "model_provider=local", "-m", "tiny", "Say hello with the shell.", cwd=tmp_path,
        env={**os.environ, "OPENAI_API_KEY": "codex-session", "CODEX_HOME": str(tmp_path / "home")},
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0 and "Done." in out.decode(), err.decode()[-2000:]
    assert "exec_command" in [t["function"]["name"] for t in seen[0][1]]
    second = seen[1][0]
    assistant = next(m for m in second if m["role"] == "assistant")
    assert assistant["reasoning_content"] == "Use the shell." and assistant["tool_calls"][0]["id"] == "call_x"
    assert "hello-from-tool" in next(m for m in second if m["role"] == "tool")["content"]
