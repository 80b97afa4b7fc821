"""The teacher: the tiny model after a short SFT to one clear behaviour, answering in CAPITAL WORDS.

    python -m examples.on_policy_distillation.teacher     # builds (or finds) it, prints its directory

Why this teacher: its behaviour is visible in any sample (a response is upper-case words, or it is
not), it is far from the random student (whose tokens are mostly lower-case code pieces), and it is
a distribution, not one string: each answer is 4-9 words drawn from a vocabulary of 40, so the
student has to match the teacher's spread over many tokens, not memorise a reply.

The SFT traces are `Sample`s (chat prompt, response tokens, loss mask on the response), trained by
`vime.train.sft.run_sft`, as `vime sft` would. The result is cached like the tiny model itself
(`$VIME_CACHE`, default `~/.cache/vime`), keyed by the base model and everything the build reads,
built under a lock into a temporary directory and renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import tempfile
from pathlib import Path

from vime.types import Sample

WORDS = ("THE", "SEA", "IS", "CALM", "AND", "BLUE", "A", "RIVER", "RUNS", "NORTH", "WE", "SAIL", "AT", "DAWN",
         "STARS", "SHINE", "OVER", "OLD", "TOWNS", "WIND", "FROM", "HILLS", "RAIN", "FALLS", "ON", "GREEN",
         "FIELDS", "LIGHT", "GOLD", "SUN", "BRIGHT", "CITY", "SLEEPS", "NIGHT", "COLD", "STONE", "BRIDGE",
         "FIRE", "WARM", "HOME")

TEACHER_PROMPTS = ("Write a title.", "Name a city.", "Say something.", "Describe the sea.", "Give a command.",
                   "Tell me a fact.", "Write a headline.", "Name a river.", "Describe the weather.",
                   "Say hello.", "Write a slogan.", "Name a color.")
"""The prompts the teacher was fine-tuned on. The student trains on some of these and is measured
on `HELDOUT_PROMPTS`, which neither model trained on."""

BUILD = {"version": 1, "traces": 256, "steps": 48, "batch": 16, "lr": 3e-3, "seed": 7}


def answer(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) + "."


def traces(model_dir: str, count: int, seed: int) -> list[Sample]:
    """`count` SFT samples: a chat prompt (rendered as rollouts render it) and a capital answer
    that ends the turn, every response token marked to learn."""
    from vime.rollout.tokenization import encode, get_tokenizer, render_prompt

    tok = get_tokenizer(model_dir)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    rng = random.Random(seed)
    out = []
    for i in range(count):
        prompt = [{"role": "user", "content": f"{TEACHER_PROMPTS[i % len(TEACHER_PROMPTS)]} ({rng.randint(0, 99)})"}]
        prompt_ids = encode(tok, render_prompt(tok, prompt))
        response = encode(tok, answer(rng)) + [end]
        out.append(Sample(index=i, rollout_id=str(i), prompt=prompt, tokens=prompt_ids + response,
                          response_length=len(response), loss_mask=[1] * len(response),
                          status=Sample.Status.COMPLETED))
    return out


def teacher_dir(base_model: str | Path) -> Path:
    """The cached teacher for `base_model`, fine-tuned on first use (~20 s on 2 cores)."""
    from vime.testing.tiny_model import _file_lock, cache_root, is_complete

    base = Path(base_model).resolve()
    key = hashlib.sha256(json.dumps({"base": str(base), "build": BUILD, "words": WORDS,
                                     "prompts": TEACHER_PROMPTS}).encode()).hexdigest()[:16]
    root = cache_root()
    final = root / f"opd-teacher-{key}"
    if is_complete(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{final.name}.lock"):
        if not is_complete(final):
            _build(base, final)
    return final


def _build(base: Path, final: Path) -> None:
    from vime.args import parse_args
    from vime.train.sft import run_sft

    work = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    out = work / "model"
    args = parse_args(["--hf-checkpoint", str(base), "--save", str(out), "--run-dir", str(work / "run"),
                       "--global-batch-size", str(BUILD["batch"]), "--sft-num-steps", str(BUILD["steps"]),
                       "--lr", str(BUILD["lr"]), "--seed", str(BUILD["seed"])])
    result = run_sft(args, traces(str(base), BUILD["traces"], BUILD["seed"]))
    print(f"[teacher] fine-tuned {base.name} to answer in capitals: SFT loss {result.first_loss:.2f} -> "
          f"{result.last_loss:.2f} in {result.steps} steps, {result.seconds:.0f} s")
    if final.exists():
        import shutil

        shutil.rmtree(final)
    os.rename(out, final)
    import shutil

    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    from vime.testing.tiny_model import tiny_model_dir

    print(teacher_dir(sys.argv[1] if len(sys.argv) > 1 else tiny_model_dir()))
