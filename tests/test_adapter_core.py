"""The adapter core against the real vLLM server: segments hold exactly what vLLM saw and sampled.

The tiny model's output is random; a fixed `seed` per turn keeps each run the same.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vime.agent.adapters import AdapterCore, AdapterError
from vime.agent.parsers import ToolCall, get_reasoning_parser, get_tool_parser, parse_hermes, parse_output, parse_think
from vime.agent.trajectory import segments_to_samples
from vime.errors import ConfigError
from vime.testing.engine import RecordingEngineClient, check_segments_against_engine
from vime.types import Sample

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
async def make_core(tokenizer, vllm_server):
    """`make_core(**kwargs) -> (core, engine)`: a core on the shared server whose engine client
    records every call; closed after the test."""
    engines = []

    def make(**kwargs) -> tuple[AdapterCore, RecordingEngineClient]:
        engines.append(RecordingEngineClient(vllm_server.url))
        return AdapterCore(tokenizer, vllm_server.url, engine=engines[-1], **kwargs), engines[-1]

    yield make
    for engine in engines:
        await engine.close()
    

def assistant(result) -> dict:
    """The assistant message a client sends back: the parsed turn, as the API returned it."""
    message = {"role": "assistant", "content": result.parsed.content}
    if result.parsed.reasoning:
        message["reasoning_content"] = result.parsed.reasoning
    if result.parsed.tool_calls:
        message["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in result.parsed.tool_calls]
    return message


# ---- parsers: no server ---------------------------------------------------------------------


def test_hermes_parses_calls_and_keeps_malformed_json_as_text():
    text = 'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
    content, calls = parse_hermes(text)
    assert content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("read_file", {"path": "a.py"})]
    bad = 'x <tool_call>{"name": "read_file", "arguments": {</tool_call> y'
    assert parse_hermes(bad) == (bad, [])
    assert parse_hermes("<tool_call>[1, 2]</tool_call>")[1] == []
    assert parse_hermes("<tool_call>{\"name\": \"f\"") == ("<tool_call>{\"name\": \"f\"", [])


def test_think_splits_reasoning_and_handles_missing_tags():
    assert parse_think("<think>\nplan\n</think>\n\nanswer") == ("plan", "answer")
    assert parse_think("plan</think>answer") == ("plan", "answer")
    assert parse_think("<think>\nunfinished") == ("unfinished", "")
    assert parse_think("just text") == (None, "just text")


def test_parsed_turn_renders_back_to_the_text_the_model_wrote(tokenizer):
    """The invariant that lets the next turn extend this one: template(parse(text)) == text."""
    text = ('<think>\nneed the file\n</think>\n\nReading it.\n<tool_call>\n{"name": "read_file", '
            '"arguments": {"path": "a.py"}}\n</tool_call>')
    parsed = parse_output(text, get_tool_parser("hermes"), get_reasoning_parser("think"))
    assert parsed.reasoning == "need the file" and parsed.content == "Reading it."
    message = {"role": "assistant", "content": parsed.content, "reasoning_content": parsed.reasoning,
               "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                              for c in parsed.tool_calls]}
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, message], tokenize=False)
    assert "<|im_start|>assistant\n" + text + "<|im_end|>" in rendered


def test_unknown_parser_names_list_the_known_ones():
    with pytest.raises(ConfigError, match="hermes"):
        get_tool_parser("nope")
    with pytest.raises(ConfigError, match="think"):
        get_reasoning_parser("nope")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("ab{}[]\":, \n") + ["<tool_call>", "</tool_call>", "<think>", "</think>",
                                                        '"name"', '"arguments"']), max_size=40).map("".join))
def test_parsers_never_raise_on_model_text(text):
    parsed = parse_output(text, get_tool_parser("hermes"), get_reasoning_parser("think"))
    assert all(isinstance(c, ToolCall) and c.name for c in parsed.tool_calls)


def test_segments_to_samples_shares_rollout_id_and_reward():
    from vime.agent.adapters import Segment, TurnBoundary

    seg = Segment([5, 6, 7, 8, 9, 10], [0, 0, 1, 0, 1, 1], [0.0, 0.0, -0.5, 0.0, -0.1, -0.2], 2,
                  [TurnBoundary(2, 3, "stop", [{"version": "1", "start": 0, "end": 1}]),
                   TurnBoundary(4, 6, "length", [{"version": "2", "start": 0, "end": 2}])], "first turn")
    seg2 = Segment([5, 11, 12], [0, 0, 1], [0.0, 0.0, -1.0], 2, [TurnBoundary(2, 3, "stop", [])], "compaction")
    base = Sample(prompt="task", label="x", metadata={"k": 1}, session_id="s")
    samples = segments_to_samples([seg, seg2], rollout_id="r1", reward=1.0, base=base, index=3)
    assert [s.rollout_id for s in samples] == ["r1", "r1"] and [s.reward for s in samples] == [1.0, 1.0]
    a, b = samples
    assert a.tokens == seg.token_ids and a.response_length == 4 and a.prompt_length == 2
    assert a.loss_mask == [1, 0, 1, 1] and a.rollout_log_probs == [-0.5, 0.0, -0.1, -0.2]
    assert a.weight_versions == [{"version": "1", "start": 0, "end": 1}, {"version": "2", "start": 2, "end": 4}]
    assert a.status == Sample.Status.TRUNCATED and b.status == Sample.Status.COMPLETED
    assert b.metadata["started_because"] == "compaction" and b.metadata["segment_index"] == 1
    assert a.label == "x" and a.index == 3 and a.session_id == "s" and a.metadata["k"] == 1
    assert base.tokens == [] and base.metadata == {"k": 1}


# ---- one session against vLLM ---------------------------------------------------------------


@pytest.mark.vllm
async def test_turns_that_extend_the_history_make_one_segment_of_exactly_the_sampled_tokens(make_core, tokenizer):
    core, engine = make_core()
    core.open_session("s-extend", {"temperature": 1.0, "max_tokens": 64})
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "Fix the bug in a.py"}]
    for turn in range(4):
        result = await core.run_turn("s-extend", messages, TOOLS, {"max_tokens": 12, "seed": turn})
        assert len(result.token_ids) == len(result.log_probs) == len(engine.calls[-1].output.token_ids)
        messages = messages + [assistant(result)]
        if turn % 2 == 0:
            messages.append({"role": "tool", "tool_call_id": "call_1", "content": f"contents {turn}"})
        else:
            messages.append({"role": "user", "content": f"continue {turn}"})
    segments = await core.finish_session("s-extend")
    assert len(segments) == 1, [s.started_because for s in segments]
    seg = segments[0]
    assert seg.started_because == "first turn" and len(seg.turns) == 4
    check_segments_against_engine(segments, engine.calls)
    for k, call in enumerate(engine.calls):  # each prompt extends the previous one's prompt + sample
        assert call.session_id == "s-extend"
        assert call.sampling_params["max_tokens"] == 12 and call.sampling_params["temperature"] == 1.0
        if k:
            prev = engine.calls[k - 1]
            assert call.prompt_ids[:len(prev.prompt_ids) + len(prev.output.token_ids)] == \
                prev.prompt_ids + prev.output.token_ids
    # the spliced-in text between turns is the template's rendering of the new messages
    between = seg.token_ids[seg.turns[0].end:seg.turns[1].start]
    assert "<tool_response>\ncontents 0\n</tool_response>" in tokenizer.decode(between)


@pytest.mark.vllm
async def test_edited_history_starts_a_new_segment_and_says_where(make_core, tokenizer):
    core, engine = make_core()
    core.open_session("s-edit")
    first = [{"role": "user", "content": "Write a parser for the config file."}]
    r1 = await core.run_turn("s-edit", first, None, {"max_tokens": 8, "seed": 1})
    r2 = await core.run_turn("s-edit", first + [assistant(r1), {"role": "user", "content": "more"}], None,
                             {"max_tokens": 8, "seed": 2})
    # the client rewrites its first message (as compaction or an edit would)
    edited = [{"role": "user", "content": "Write a lexer for the config file."}, assistant(r1)]
    await core.run_turn("s-edit", edited + [{"role": "user", "content": "more"}], None, {"max_tokens": 8, "seed": 3})
    # a retry of the first request: a prefix of segment 0, not an extension
    await core.run_turn("s-edit", first, None, {"max_tokens": 8, "seed": 4})
    # back on the original history: segment 0 is extended again
    await core.run_turn("s-edit", first + [assistant(r1), {"role": "user", "content": "more"}, assistant(r2),
                                           {"role": "user", "content": "again"}], None, {"max_tokens": 8, "seed": 5})
    segments = await core.finish_session("s-edit")
    assert len(segments) == 3
    assert [len(s.turns) for s in segments] == [3, 1, 1]
    assert segments[1].started_because.startswith("prompt diverges from segment 0 at token ")
    assert "'lexer" in segments[1].started_because and "'parser" in segments[1].started_because
    assert segments[2].started_because.startswith("prompt ends inside segment 0")
    check_segments_against_engine(segments, engine.calls)
    assert segments[1].prompt_length == len(engine.calls[2].prompt_ids)


@pytest.mark.vllm
async def test_max_tokens_is_clamped_to_the_room_left_and_caps_answer_limit(make_core, tokenizer):
    core, engine = make_core(max_context_tokens=40, max_turns=2)
    core.open_session("s-cap")
    messages = [{"role": "user", "content": "hi"}]
    prompt_len = core.count_tokens(messages, None)
    result = await core.run_turn("s-cap", messages, None, {"max_tokens": 128_000, "ignore_eos": True})
    assert len(result.token_ids) == 40 - prompt_len and result.finish_reason == "length"
    long = [{"role": "user", "content": "word " * 60}]
    with pytest.raises(AdapterError) as e:
        await core.run_turn("s-cap", long, None, {"max_tokens": 4})
    assert e.value.kind == "limit" and e.value.status == 400 and "the context holds 40" in e.value.message
    await core.run_turn("s-cap", messages, None, {"max_tokens": 2})
    with pytest.raises(AdapterError, match="used its 2 turns") as e:
        await core.run_turn("s-cap", messages, None, {"max_tokens": 2})
    assert e.value.kind == "limit"
    segments = await core.finish_session("s-cap")
    assert sum(len(s.turns) for s in segments) == 2 == len(engine.calls)
    check_segments_against_engine(segments, engine.calls)


@pytest.mark.vllm
async def test_the_servers_max_model_len_caps_the_context(make_core, tokenizer):
    core, engine = make_core()
    core.open_session("s-server-cap")
    with pytest.raises(AdapterError, match="the context holds 4096") as e:
        await core.run_turn("s-server-cap", [{"role": "user", "content": "x " * 5000}], None, {"max_tokens": 1})
    assert e.value.kind == "limit" and engine.calls == []
    assert await core.finish_session("s-server-cap") == []


@pytest.mark.vllm
async def test_invalid_turns_and_unknown_sessions_record_nothing(make_core, tokenizer):
    core, engine = make_core()
    core.open_session("s-bad")
    ok = [{"role": "user", "content": "hi"}]
    cases = [
        (ok, None, {"temperature": "hot"}, "temperature 'hot'"),
        (ok, None, {"max_tokens": 0}, "max_tokens 0"),
        (ok, None, {"top_p": 2}, "top_p 2"),
        (ok, None, {"stop": [""]}, "stop"),
        ([], None, {}, "non-empty list"),
        ([{"role": "robot", "content": "x"}], None, {}, "'robot'"),
        ([{"role": "user", "content": 5}], None, {}, "messages\\[0\\].content"),
        ([{"role": "user", "content": [{"type": "image"}]}], None, {}, "content\\[0\\]"),
        ([{"role": "user", "tool_calls": []}], None, {}, "tool_calls"),
        (ok, [{"type": "function"}], {}, "tools\\[0\\]"),
        (ok, "tools", {}, "tools must be a list"),
    ]
    for messages, tools, sampling, match in cases:
        with pytest.raises(AdapterError, match=match) as e:
            await core.run_turn("s-bad", messages, tools, sampling)
        assert e.value.kind == "invalid_request" and e.value.status == 400
    with pytest.raises(AdapterError, match="'nobody' is not open") as e:
        await core.run_turn("nobody", ok, None, {})
    assert e.value.kind == "not_found" and e.value.status == 404
    assert engine.calls == [] and await core.finish_session("s-bad") == []
    with pytest.raises(AdapterError, match="not open"):
        await core.finish_session("s-bad")
    with pytest.raises(ValueError, match="sampling_defaults: temperature -1"):
        core.open_session("s-bad-defaults", {"temperature": -1})


@pytest.mark.vllm
async def test_a_dead_engine_is_an_engine_error_and_records_nothing(tokenizer):
    from vime.engine.server import free_port

    core = AdapterCore(tokenizer, f"http://127.0.0.1:{free_port()}", allow_unknown_sessions=True)
    with pytest.raises(AdapterError) as e:
        await core.run_turn("s-dead", [{"role": "user", "content": "hi"}], None, {"max_tokens": 1})
    assert e.value.kind == "engine" and e.value.status == 502 and "cannot reach vLLM" in e.value.message
    assert await core.finish_session("s-dead") == []
    with pytest.raises(AdapterError, match="was finished"):  # a late request does not reopen it
        await core.run_turn("s-dead", [{"role": "user", "content": "hi"}], None, {"max_tokens": 1})
    await core.close()


@pytest.mark.vllm
async def test_concurrent_turns_of_one_session_are_serialized_and_finish_waits(make_core, tokenizer):
    core, engine = make_core()
    core.open_session("s-conc")
    messages = [{"role": "user", "content": "hello"}]
    turns = [asyncio.create_task(core.run_turn("s-conc", messages, None, {"max_tokens": 6, "seed": i}))
             for i in range(3)]
    await asyncio.sleep(0)
    segments = await core.finish_session("s-conc")  # waits for the turn in flight, then closes
    results = await asyncio.gather(*turns, return_exceptions=True)
    done = [r for r in results if not isinstance(r, Exception)]
    assert len(done) == sum(len(s.turns) for s in segments) == len(engine.calls) >= 1
    assert all(isinstance(r, AdapterError) and r.kind == "not_found" for r in results if r not in done)
    check_segments_against_engine(segments, engine.calls)


@pytest.mark.vllm
async def test_segments_become_samples_with_the_sampled_tokens(make_core, tokenizer):
    core, engine = make_core()
    core.open_session("s-samples")
    messages = [{"role": "user", "content": "sum two numbers"}]
    r1 = await core.run_turn("s-samples", messages, None, {"max_tokens": 5, "seed": 0})
    await core.run_turn("s-samples", messages + [assistant(r1), {"role": "user", "content": "and three"}], None,
                        {"max_tokens": 5, "seed": 1})
    await core.run_turn("s-samples", [{"role": "user", "content": "summary: sum numbers"}], None,
                        {"max_tokens": 5, "seed": 2})
    segments = await core.finish_session("s-samples")
    samples = segments_to_samples(segments, rollout_id="rollout-7", reward=0.5, tokenizer=tokenizer,
                                  base=Sample(prompt=messages, session_id="s-samples"))
    assert len(samples) == 2 and {s.rollout_id for s in samples} == {"rollout-7"}
    calls = engine.calls
    first = samples[0]
    assert first.prompt_length == len(calls[0].prompt_ids)
    assert first.tokens == calls[1].prompt_ids + calls[1].output.token_ids
    sampled = [t for t, m in zip(first.response_tokens, first.loss_mask) if m]
    assert sampled == calls[0].output.token_ids + calls[1].output.token_ids
    assert [lp for lp, m in zip(first.rollout_log_probs, first.loss_mask) if m] == \
        calls[0].output.log_probs + calls[1].output.log_probs
    assert samples[1].tokens == calls[2].prompt_ids + calls[2].output.token_ids
    assert samples[1].metadata["started_because"].startswith("prompt diverges")
