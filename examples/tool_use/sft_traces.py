"""Synthetic SFT traces: the tool-use loop with a policy that uses the tool right, as training data.

A randomly initialised model never writes `<code>...</code>`, so RL on it sees reward 0 and
learns nothing. The warm start shows it the format: each trace is the real rollout loop
(`run_tool_rollout`) with a real sandbox running the code, and a scripted policy that writes
`<code>print(a*b)</code>` and then `Answer: <the output>`. The scripted turns are encoded as vLLM
would return them (the code turn ends at `</code>`, the answer turn with `<|im_end|>`), so SFT
trains the very tokens an RL rollout samples, observation masked. Logprobs are 0.0: SFT ignores
them. Each trace is checked (its reward is 1) before it is kept.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from examples.tool_use.rollout import ToolUseConfig, reward, run_tool_rollout
from examples.tool_use.task import Problem, gold_turns
from examples.tool_use.tool import ToolLimits, tool_sandbox
from vime.engine.client import GenerateOutput
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


async def trace(tokenizer: Any, problem: Problem, sandbox: Any, config: ToolUseConfig) -> Sample:
    """The gold trace of `problem`, after checking that it earns reward 1."""
    messages = [{"role": "user", "content": problem.question}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    sample = Sample(prompt=messages, label=str(problem.answer),
                    tokens=list(tokenizer.encode(prompt, add_special_tokens=False)))
    sample = await run_tool_rollout(sample, generate=scripted_generate(tokenizer, gold_turns(problem)),
                                    tokenizer=tokenizer, sandbox=sandbox, params={}, config=config)
    if reward(sample) != 1.0:
        raise RuntimeError(f"the gold trace of {problem.question!r} does not earn reward 1: {sample.response!r}")
    sample.reward = 1.0
    return sample


async def write_traces(model: str, out: Path, problems: list[Problem], backend: str = "bwrap") -> int:
    """Write one trace per problem to `out` (JSONL of `Sample.to_dict()`); returns the count."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    config = ToolUseConfig(max_turns=2, limits=ToolLimits())
    gate = asyncio.Semaphore(8)
    async with tool_sandbox(backend, config.limits) as sandbox:
        async def one(p: Problem) -> Sample:
            async with gate:
                return await trace(tokenizer, p, sandbox, config)

        samples = await asyncio.gather(*(one(p) for p in problems))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for i, s in enumerate(samples):
            s.index = i
            f.write(json.dumps(s.to_dict()) + "\n")
    tmp.replace(out)
    return len(samples)
