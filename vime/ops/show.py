"""`vime show RUN KEY`: one rollout as a person reads it, from the store alone.

The prompt and response text, the response's tokens coloured by loss mask (trained in green,
masked in grey) with their logprobs, the policy version(s) that sampled them, a multi-agent
sample's role and turn, each turn and which activity attempt and worker sampled it (`sampled_by`:
a rollout resumed after a crash shows attempt 2), an agent's diff and grading, and why the
rollout failed when it did. KEY is a rollout id (every sibling) or `rollout/sibling` (one sample),
as `vime samples` lists them. Steps are numbered from 1, as everywhere people read them
(`vime.ops.steps`).

It answers in a second or two on a loaded machine: nothing here imports torch, transformers or
vLLM (the token texts come from the checkpoint's `tokenizer.json` through `tokenizers`), and a
test holds it to that.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select

from vime.errors import ConfigError
from vime.ops.steps import step_number, step_text
from vime.sample_summary import attempts_text, failure_of, finish_of, sample_attempts, versions_text
from vime.store import MissingSampleError, SampleStore
from vime.store.models import RunRow, SampleRow
from vime.types import Sample

GREEN, GREY, BOLD, RESET = "\033[32m", "\033[90m", "\033[1m", "\033[0m"
# A turn's keys `_turn_lines` prints itself (a turn's weight versions are in the sample's own).
_TURN_KEYS_SHOWN = {"start", "end", "finish_reason", "finish", "text", "observation", "weight_versions", "sampled_by",
                    "worker"}


@dataclass
class ShownSample:
    key: str
    sample: Sample
    step: int | None

    def to_dict(self, tokens: list[str] | None) -> dict[str, Any]:
        s = self.sample
        failure, cause = failure_of(s.status.value, s.metadata or {})
        sampled_by, worker = sample_attempts(s.metadata or {})
        response_ids = s.response_tokens
        return {"key": self.key, "rollout_id": str(s.rollout_id), "status": s.status.value, "reward": s.reward,
                "trained_step": self.step, "step": step_number(self.step),  # the store's index; the step from 1
                "weight_versions": s.weight_versions, "failure": failure, "cause": cause,
                "finish": finish_of(s.status.value), "sampled_by": sampled_by, "worker": worker,
                "prompt": s.prompt, "response": s.response, "label": s.label,
                "response_tokens": [{"id": t, "text": tokens[i] if tokens else None,
                                     "loss_mask": s.loss_mask[i] if s.loss_mask else None,
                                     "logprob": s.rollout_log_probs[i] if s.rollout_log_probs else None}
                                    for i, t in enumerate(response_ids)],
                "metadata": s.metadata}


def load(store: SampleStore, run_id: str, key: str) -> list[ShownSample]:
    sibling = key.rsplit("/", 1)[1] if "/" in key else ""
    one = sibling.isdigit()
    try:
        samples = store.read_samples(run_id, [key]) if one else store.read_rollout(run_id, key)
    except MissingSampleError:
        samples = []
    if not samples:
        raise ConfigError(f"run {run_id!r} has no {'sample' if one else 'rollout'} {key!r} in {store.url}; "
                          f"`vime samples {run_id}` lists them")
    keys = [key] if one else [f"{key}/{i}" for i in range(len(samples))]
    query = select(SampleRow.key, SampleRow.trained_step).where(SampleRow.run_id == run_id, SampleRow.key.in_(keys))
    with store.engine.connect() as conn:
        steps = dict(conn.execute(query).all())
    return [ShownSample(k, s, steps.get(k)) for k, s in zip(keys, samples, strict=True)]


def run_tokenizer(store: SampleStore, run_id: str):
    """The run's tokenizer (its --hf-checkpoint's `tokenizer.json`, read by `tokenizers`: no torch
    or transformers import), to print each token's text; None if it is gone or has none."""
    with store.engine.connect() as conn:
        config = conn.execute(select(RunRow.config).where(RunRow.run_id == run_id)).scalar_one_or_none() or {}
    path = config.get("hf_checkpoint")
    if not path or not (Path(path) / "tokenizer.json").is_file():
        return None
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
    except Exception:  # noqa: BLE001 - an unreadable file: show token ids instead
        return None


def token_texts(tokenizer, ids: list[int]) -> list[str] | None:
    if tokenizer is None:
        return None
    return [tokenizer.decode([t], skip_special_tokens=False) for t in ids]


def render(shown: ShownSample, tokens: list[str] | None, *, color: bool, token_table: bool) -> str:
    s = shown.sample
    c = (lambda code, text: f"{code}{text}{RESET}") if color else (lambda code, text: text)
    meta = s.metadata or {}
    failure, cause = failure_of(s.status.value, meta)
    trained = f"trained at {step_text(shown.step)}" if shown.step is not None else "not trained"
    finish = " (hit the length limit)" if finish_of(s.status.value) == "length" else ""
    lines = [c(BOLD, f"{shown.key}") + f"  {s.status.value}{finish}, reward {_reward(s.reward)}, {trained}, "
             f"policy version {versions_text(s.weight_versions)}"]
    if meta.get("role"):
        lines.append(c(BOLD, "role: ") + _role_text(meta))
    if sampled := attempts_text(*sample_attempts(meta)):
        lines.append(c(BOLD, "sampled by: ") + sampled)
    if failure:
        lines.append(c(BOLD, "failure: ") + failure + (f": {cause}" if cause else ""))
    lines += ["", c(BOLD, "── prompt ──"), _prompt_text(s.prompt)]
    response_ids = s.response_tokens
    mask = s.loss_mask if s.loss_mask is not None else [1] * len(response_ids)
    lines += ["", c(BOLD, f"── response ({len(response_ids)} tokens, {sum(mask)} trained"
                    + (": green trained, grey masked" if color else "") + ") ──")]
    if tokens is not None and color:
        runs = itertools.groupby(zip(tokens, mask, strict=False), key=lambda token_mask: bool(token_mask[1]))
        lines.append("".join(c(GREEN if trained else GREY, "".join(t for t, _ in run)) for trained, run in runs))
    else:
        lines.append(s.response)
    if token_table:
        lines += ["", c(BOLD, "── tokens ──"), f"{'#':>5} {'id':>8}  {'mask':>4}  {'logprob':>8}  text"]
        for i, t in enumerate(response_ids):
            lp = s.rollout_log_probs[i] if s.rollout_log_probs else None
            text = json.dumps(tokens[i]) if tokens else ""
            lines.append(f"{i:>5} {t:>8}  {mask[i]:>4}  {'' if lp is None else f'{lp:8.4f}':>8}  {text}")
    spans = [v for v in s.weight_versions or [] if isinstance(v, dict)]
    if len(spans) > 1:
        lines += ["", c(BOLD, "── weight versions ──")]
        lines += [f"tokens {v.get('start')}-{v.get('end')}: version {v.get('version')}" for v in spans]
    if meta.get("turns"):
        turns = meta["turns"] if isinstance(meta["turns"], list) else [meta["turns"]]
        lines += ["", c(BOLD, f"── turns ({len(turns)}) ──")]
        if meta.get("chain") or meta.get("segment_kind"):
            lines.append(f"chain {meta.get('chain', '?')}, {meta.get('segment_kind', '?')} segment"
                         + (f", started because: {meta['started_because']}" if meta.get("started_because") else ""))
        lines += _turn_lines(turns, s.prompt_length)
    if meta.get("diff"):
        lines += ["", c(BOLD, "── diff ──"), meta["diff"].rstrip()]
    if meta.get("grade"):
        lines += ["", c(BOLD, "── grading ──"), json.dumps(meta["grade"], indent=1)]
    return "\n".join(lines)


def _turn_lines(turns: list, prompt_length: int) -> list[str]:
    """Each environment writes its own turns into `metadata["turns"]`: an adapter session (the
    coding agent) token offsets `start`/`end` (absolute in `tokens`) and `finish_reason`;
    tool_use each turn's `text`, the tool's `observation` and `finish`. Show what a turn has
    rather than assume one shape: a store holds every environment's samples."""
    lines = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            lines.append(f"{i}: {json.dumps(turn, default=str)}")
            continue
        head = []
        if isinstance(turn.get("start"), int) and isinstance(turn.get("end"), int):
            head.append(f"response tokens {turn['start'] - prompt_length}-{turn['end'] - prompt_length}")
        finish = turn.get("finish_reason", turn.get("finish"))
        if finish is not None:
            head.append(str(finish))
        if sampled := attempts_text(turn.get("sampled_by"), turn.get("worker")):
            head.append(sampled)
        lines.append(f"{i}: {', '.join(head) or 'turn'}")
        for key, label in (("text", "model"), ("observation", "observation")):
            if turn.get(key):
                lines += _indented(f"[{label}] {turn[key]}")
        rest = {k: v for k, v in turn.items() if k not in _TURN_KEYS_SHOWN and v not in (None, "", [], {})}
        if rest:
            lines += _indented(json.dumps(rest, default=str))
    return lines


def _role_text(meta: dict) -> str:
    """A multi-agent role's turn: one sample per turn, tagged with its role, slot and score (the
    attempt that sampled it is the `sampled by` line)."""
    text = f"{meta['role']}" + (f" (slot {meta['slot']})" if meta.get("slot") is not None else "")
    if meta.get("turn") is not None:
        text += f", turn {meta['turn']} of the rollout"
    if meta.get("score") is not None:
        text += f", score {_reward(meta['score'])}"
    if "pick" in meta:
        text += f", picked {meta['pick'] or 'none'}" + (
            f" (turn {meta['picked_turn']})" if meta.get("picked_turn") is not None else "")
    return text


def _indented(text: str) -> list[str]:
    return ["   " + line for line in str(text).splitlines() or [""]]


def _reward(reward) -> str:
    return "none" if reward is None else (f"{reward:g}" if isinstance(reward, float | int) else json.dumps(reward))


def _prompt_text(prompt) -> str:
    if isinstance(prompt, list):
        return "\n".join(f"[{m.get('role', '?')}] {m.get('content', '')}" if isinstance(m, dict) else str(m)
                         for m in prompt)
    return str(prompt)
