"""The quickstart's reward: the fraction of response tokens that contain a capital letter.

A random model writes such tokens about 23% of the time with the tiny model's tokenizer, so the
task is easy to state, cheap to score, and far from solved at step 0. Written as a slime reward
function (`--custom-rm-path examples.quickstart.reward.capitals`): it runs unchanged in slime.
`alternating_capitals` is a second toy task for 32-token responses (bench/toy_vs_trl.py).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=4)
def _has_capital(checkpoint: str) -> tuple[bool, ...]:
    """Per token id, whether its text has a capital. Read with the `tokenizers` library when the
    checkpoint has a `tokenizer.json` (0.03 s): `from transformers import AutoTokenizer` imports
    every model's configuration, 2.5-3.2 s of the first step's rollout on these cores (measured
    with py-spy in the rollout worker). Both give the same table on the tiny model."""
    fast = Path(checkpoint) / "tokenizer.json"
    if fast.is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(fast))
        return tuple(any(c.isupper() for c in tok.decode([i], skip_special_tokens=False))
                     for i in range(tok.get_vocab_size(with_added_tokens=True)))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    return tuple(any(c.isupper() for c in tok.decode([i])) for i in range(len(tok)))


async def capitals(args, sample, **kwargs) -> float:
    table = _has_capital(args.hf_checkpoint)
    response = sample.tokens[len(sample.tokens) - sample.response_length:]
    if not response:
        return 0.0
    return sum(table[t] for t in response if t < len(table)) / len(response)


LONG_RESPONSE = 32


async def alternating_capitals(args, sample, **kwargs) -> float:
    """A second toy task, where the response's length and order matter: the fraction of the
    first `LONG_RESPONSE` (32) positions' adjacent pairs whose tokens alternate between having a
    capital and not (a position past the response's end counts as a broken pair). A random model
    scores about 0.35 (2 x 0.23 x 0.77); a response that stops early cannot pass its own length
    over 31; and unlike `capitals` a token's reward depends on the one before it."""
    table = _has_capital(args.hf_checkpoint)
    response = sample.tokens[len(sample.tokens) - sample.response_length:][:LONG_RESPONSE]
    caps = [t < len(table) and table[t] for t in response]
    return sum(a != b for a, b in zip(caps, caps[1:])) / (LONG_RESPONSE - 1)
