"""The two models of the example, both the tiny model after a short SFT (cached, built on first use):

- the teacher answers in CAPITAL WORDS: `python -m examples.on_policy_distillation.teacher` prints
  its directory;
- the student's warm start answers with the same words, each upper or lower case at random.

Why this pair: the behaviour is visible in any sample (how many of the answer's tokens are
capitals), and the teacher is a distribution, not one string: each answer is 4-9 words drawn from
a vocabulary of 40, so the student must match its spread over many tokens, not memorise a reply.
The student starts where OPD starts in practice, from a model whose samples the teacher can grade
(see `student_dir`), and has to learn the teacher's style from the teacher's log-probs alone.

The SFT traces are `Sample`s (chat prompt, response tokens, loss mask on the response), trained by
`vime.train.sft.run_sft`, as `vime sft` would. Each model is cached like the tiny model itself
(`$VIME_CACHE`, default `~/.cache/vime`), keyed by the base model and everything the build reads,
built under a lock into a temporary directory and renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
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


def answer(rng: random.Random, style: str = "capitals") -> str:
    """4-9 words; `capitals`: all upper case (the teacher), `mixed`: each word upper or lower case
    at random (the student's warm start: it knows the words, not the style)."""
    words = [rng.choice(WORDS) for _ in range(rng.randint(4, 9))]
    if style == "mixed":
        words = [w if rng.random() < 0.5 else w.lower() for w in words]
    return " ".join(words) + "."


def traces(model_dir: str, count: int, seed: int, style: str = "capitals") -> list[Sample]:
    """`count` SFT samples: a chat prompt (rendered as rollouts render it) and an answer in `style`
    that ends the turn, every response token marked to learn."""
    from vime.rollout.tokenization import encode, get_tokenizer, render_prompt

    tok = get_tokenizer(model_dir)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    rng = random.Random(seed)
    out = []
    for i in range(count):
        prompt = [{"role": "user", "content": f"{TEACHER_PROMPTS[i % len(TEACHER_PROMPTS)]} ({rng.randint(0, 99)})"}]
        prompt_ids = encode(tok, render_prompt(tok, prompt))
        response = encode(tok, answer(rng, style)) + [end]
        out.append(Sample(index=i, rollout_id=str(i), prompt=prompt, tokens=prompt_ids + response,
                          response_length=len(response), loss_mask=[1] * len(response),
                          status=Sample.Status.COMPLETED))
    return out


def teacher_dir(base_model: str | Path) -> Path:
    """The cached teacher for `base_model`: answers in capitals (fine-tuned on first use)."""
    return finetuned_dir(base_model, "capitals")


def student_dir(base_model: str | Path) -> Path:
    """The cached student warm start for `base_model`: the same words, each upper or lower case at
    random. OPD needs a student whose samples the teacher can grade: from the random tiny model,
    almost no sampled token is one the teacher would write, and the sampled reverse KL then moved
    nothing in a short CPU run (README: held-out KL 1.097 -> 1.087 in 16 steps)."""
    return finetuned_dir(base_model, "mixed")


def finetuned_dir(base_model: str | Path, style: str) -> Path:
    """`base_model` fine-tuned to answer in `style`, cached (built on first use: ~20-40 s on 2 cores)."""
    from vime.testing.tiny_model import _file_lock, cache_root, is_complete

    base = Path(base_model).resolve()
    key = hashlib.sha256(json.dumps({"base": str(base), "build": BUILD, "words": WORDS, "style": style,
                                     "prompts": TEACHER_PROMPTS}).encode()).hexdigest()[:16]
    root = cache_root()
    final = root / f"opd-{style}-{key}"
    if is_complete(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{final.name}.lock"):
        if not is_complete(final):
            _build(base, final, style)
    return final


def _build(base: Path, final: Path, style: str) -> None:
    from vime.config.args import parse_args
    from vime.train.sft import run_sft

    work = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    out = work / "model"
    args = parse_args(["--hf-checkpoint", str(base), "--save", str(out), "--run-dir", str(work / "run"),
                       "--global-batch-size", str(BUILD["batch"]), "--sft-num-steps", str(BUILD["steps"]),
                       "--lr", str(BUILD["lr"]), "--seed", str(BUILD["seed"])])
    result = run_sft(args, traces(str(base), BUILD["traces"], BUILD["seed"], style))
    print(f"[opd] fine-tuned {base.name} to answer in {style} case: SFT loss {result.first_loss:.2f} -> "
          f"{result.last_loss:.2f} in {result.steps} steps, {result.seconds:.0f} s")
    if final.exists():  # an incomplete earlier build
        shutil.rmtree(final)
    os.rename(out, final)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    from vime.testing.tiny_model import tiny_model_dir

    print(teacher_dir(sys.argv[1] if len(sys.argv) > 1 else tiny_model_dir()))
