"""The `smoke_generate` activity: chat-template the prompts, sample them token-in/token-out."""

from __future__ import annotations

import asyncio

from temporalio import activity

from vime.engine.client import EngineClient
from vime.temporal.smoke import SMOKE_GENERATE, SmokeCompletion, SmokeInput, SmokeResult


@activity.defn(name=SMOKE_GENERATE)
async def smoke_generate(inp: SmokeInput) -> SmokeResult:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(inp.model_dir)
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
        for p in inp.prompts
    ]
    prompts = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts]
    params = {"max_tokens": inp.max_tokens, "temperature": inp.temperature}
    async with EngineClient(inp.engine_url) as client:
        outputs = await asyncio.gather(*(client.generate(ids, params) for ids in prompts))
    return SmokeResult([
        SmokeCompletion(
            prompt=text,
            prompt_tokens=len(ids),
            token_ids=out.token_ids,
            mean_logprob=sum(out.log_probs) / max(1, len(out.log_probs)),
            finish_reason=out.finish_reason,
            text=tokenizer.decode(out.token_ids),  # for display only; training never re-tokenizes
        )
        for text, ids, out in zip(inp.prompts, prompts, outputs)
    ])
