"""The quickstart's reward: the fraction of response tokens that contain a capital letter.

A random model writes such tokens about 23% of the time with the tiny model's tokenizer, so the
task is easy to state, cheap to score, and far from solved at step 0. Written as a slime reward
function (`--custom-rm-path examples.quickstart.reward.capitals`): it runs unchanged in slime.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=4)
def _has_capital(checkpoint: str) -> tuple[bool, ...]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    return tuple(any(c.isupper() for c in tok.decode([i])) for i in range(len(tok)))


async def capitals(args, sample, **kwargs) -> float:
    table = _has_capital(args.hf_checkpoint)
    response = sample.tokens[len(sample.tokens) - sample.response_length:]
    if not response:
        return 0.0
    return sum(table[t] for t in response if t < len(table)) / len(response)
