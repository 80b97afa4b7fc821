"""Synthetic SFT traces: the tool-use loop with scripted policies, as training data.

A randomly initialised model never writes `<code>...</code>`, so RL on it sees reward 0 and
learns nothing. The warm start shows it the format: each trace is the real rollout loop
(`run_tool_rollout`) with a real sandbox running the code, and a scripted policy. Like SFT data
pooled from several sources, the traces come from two policies: one writes
`<code>print(a*b)</code>` and then `Answer: <the output>`; the other (`decline_share` of the
traces) does not reach for the tool and declines (`I cannot work that out.`). The warm-started
model does both, and that the tool pays is what RL has to find out. (A policy answering at a
glance, `Answer: <an estimate>`, made a worse teacher: its numbers, unrelated to any output,
taught the tiny model to write any number after `Answer:`, and it stopped copying the tool's
output.) The scripted turns are encoded as vLLM would return them (the code turn ends at
`</code>`, the answer turn with `<|im_end|>`), so SFT trains the very tokens an RL rollout
samples, observation masked. Logprobs are 0.0: SFT ignores
them. Each trace is checked (its reward is what its policy earns) before it is kept.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from vime.engine.client import GenerateOutput
from vime.envs.tool_use.rollout import ToolUseConfig, reward, run_tool_rollout
from vime.envs.tool_use.task import Problem, decline_turns, gold_turns
from vime.envs.tool_use.tool import ToolLimits, tool_sandbox
from vime.types import Sample

END_OF_TURN = "<|im_end|>"


def scripted_generate(tokenizer: Any, replies: list[str]):
    """A generate function answering with `replies` in turn, tokenized as vLLM returns them."""
    end_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    turns = iter(replies)

    async def generate(ids: list[int], params: dict) -> GenerateOutput:
        reply = next(turns)
        out = list(tokenizer.encode(reply, add_special_tokens=False))
        if not any(reply.endswith(s) for s in params.get("stop", [])):
            out.append(end_id)
        return GenerateOutput(token_ids=out, log_probs=[0.0] * len(out), finish_reason="stop")

    return generate


async def trace(tokenizer: Any, problem: Problem, sandbox: Any, config: ToolUseConfig,
                decline: bool = False) -> Sample:
    """The trace of `problem` by the tool-using policy (or, `decline`, the declining one), after
    checking that it earns what that policy earns: 1 with the tool, 0 without."""
    turns = decline_turns(problem) if decline else gold_turns(problem)
    expected = 0.0 if decline else 1.0
    messages = [{"role": "user", "content": problem.question}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    sample = Sample(prompt=messages, label=str(problem.answer),
                    tokens=list(tokenizer.encode(prompt, add_special_tokens=False)))
    sample = await run_tool_rollout(sample, generate=scripted_generate(tokenizer, turns),
                                    tokenizer=tokenizer, sandbox=sandbox, params={}, config=config)
    if reward(sample) != expected:
        raise RuntimeError(f"the trace of {problem.question!r} does not earn {expected}: {sample.response!r}")
    sample.reward = expected
    return sample


async def write_traces(model: str, out: Path, problems: list[Problem], backend: str = "bwrap",
                       decline_share: float = 0.0) -> int:
    """Write one trace per problem to `out` (JSONL of `Sample.to_dict()`); returns the count.
    The problems whose index falls in the first `decline_share` of each ten are declined."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    config = ToolUseConfig(max_turns=2, limits=ToolLimits())
    gate = asyncio.Semaphore(8)
    async with tool_sandbox(backend, config.limits) as sandbox:
        async def one(i: int, p: Problem) -> Sample:
            async with gate:
                return await trace(tokenizer, p, sandbox, config, decline=i % 10 < round(decline_share * 10))

        samples = await asyncio.gather(*(one(i, p) for i, p in enumerate(problems)))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for i, s in enumerate(samples):
            s.index = i
            f.write(json.dumps(s.to_dict()) + "\n")
    tmp.replace(out)
    return len(samples)
