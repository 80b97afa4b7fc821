"""The toy task: arithmetic the model cannot do in its head, so it prints it with Python.

A prompt asks `What is 37*58?`. The model is expected to answer in the retool format:

    <code>print(37*58)</code>          sampled (loss_mask 1), generation stops at `</code>`
    <output>\n2146\n</output>\n        the sandbox's output, spliced in (loss_mask 0)
    Answer: 2146<|im_end|>             sampled

Two-digit operands give 16,200 problems: more than a tiny model memorises, so the reward (the
last `Answer: N` of the model's own text equals the label) is earned by copying the operands
into code and the output into the answer. Everything here is plain text in, text out: the
rollout, the SFT traces and the reward share these functions, so a trace is exactly what a
rollout samples.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

CODE_OPEN, CODE_CLOSE = "<code>", "</code>"
OUTPUT_OPEN, OUTPUT_CLOSE = "<output>\n", "\n</output>\n"
ANSWER = "Answer: "
OPS = ("+", "*")

_CODE = re.compile(re.escape(CODE_OPEN) + r"(.*?)" + re.escape(CODE_CLOSE), re.DOTALL)
_ANSWER = re.compile(r"Answer:\s*(-?\d+)")


@dataclass(frozen=True)
class Problem:
    a: int
    op: str
    b: int

    @property
    def expression(self) -> str:
        return f"{self.a}{self.op}{self.b}"

    @property
    def answer(self) -> int:
        return self.a + self.b if self.op == "+" else self.a * self.b

    @property
    def question(self) -> str:
        return f"What is {self.expression}?"


def problems(count: int, seed: int) -> list[Problem]:
    """`count` problems drawn from `seed` (two-digit operands, + or *)."""
    rng = random.Random(seed)
    return [Problem(rng.randint(10, 99), rng.choice(OPS), rng.randint(10, 99)) for _ in range(count)]


def write_prompts(path: Path, items: list[Problem]) -> Path:
    """The prompt file `vime train --prompt-data` reads: chat messages and the label."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for p in items:
            f.write(json.dumps({"prompt": [{"role": "user", "content": p.question}], "label": str(p.answer)}) + "\n")
    return path


def code_of(turn_text: str) -> str | None:
    """The Python of a turn that ends with a closed `<code>...</code>` block, else None (the
    turn is the model's final answer)."""
    if not turn_text.rstrip().endswith(CODE_CLOSE):
        return None
    blocks = _CODE.findall(turn_text)
    return blocks[-1] if blocks else None


def observation(stdout: str, stderr: str = "", rc: int = 0, timed_out: float | None = None,
                max_chars: int = 200) -> str:
    """What the model sees of a code run: stdout, then the error's last line when it failed.
    A timeout or a crash is an observation like any other, never an exception."""
    text = stdout
    if timed_out is not None:
        text += f"TimeoutError: the code ran past {timed_out:g} s and was stopped"
    elif rc != 0:
        lines = [line for line in stderr.strip().splitlines() if line.strip()]
        text += lines[-1] if lines else f"the code exited with status {rc}"
    text = text.strip()
    if len(text) > max_chars:
        text = text[:max_chars] + "..."
    return OUTPUT_OPEN + text + OUTPUT_CLOSE


def final_answer(model_text: str) -> int | None:
    """The last `Answer: N` in the text the model wrote (observations excluded by the caller)."""
    found = _ANSWER.findall(model_text)
    return int(found[-1]) if found else None


def score(model_text: str, label: str | int) -> float:
    """1.0 when the model's last `Answer: N` is the label, else 0.0."""
    answer = final_answer(model_text)
    return float(answer is not None and str(answer) == str(label).strip())


def gold_turns(p: Problem) -> list[str]:
    """The replies a model that uses the tool right writes: code, then the answer (the
    observation between them comes from the sandbox)."""
    return [f"{CODE_OPEN}print({p.expression}){CODE_CLOSE}", f"{ANSWER}{p.answer}"]


DECLINE = "I cannot work that out."


def decline_turns(p: Problem) -> list[str]:
    """The one reply of a model that does not reach for the tool: no answer, reward 0."""
    return [DECLINE]
