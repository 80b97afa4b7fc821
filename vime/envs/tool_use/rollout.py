"""The multi-turn rollout: sample a turn, run its code, splice the output in, checkpoint, repeat.

    prompt | <code>print(37*58)</code> | <output>\n2146\n</output>\n | Answer: 2146<|im_end|>
             sampled, loss_mask 1        spliced, loss_mask 0          sampled, loss_mask 1

Each turn is one vLLM request on the whole context so far (token ids in, token ids and their
logprobs out), stopped at `</code>` or the end of the turn. The sampled ids and logprobs are
appended exactly as vLLM returned them; the observation is encoded and appended with loss_mask 0
(logprob 0.0), so nothing the model sampled is ever re-tokenized. The response budget
(`--rollout-max-response-len`) covers sampled and spliced tokens together.

Durability: after every turn (its sampled tokens and the observation that followed) the turn is
appended to the store (`SampleStore.append_turn`: once, in order). A rollout started again after
a crash replays the stored turns into the sample and continues at the first turn not stored, so
no turn is sampled or run twice, and the trained tokens are the ones first sampled.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from vime.envs.tool_use.task import CODE_CLOSE, code_of, score
from vime.envs.tool_use.tool import CodeRun, ToolLimits, run_code
from vime.types import Sample

DEFAULT_BUDGET = 256


@dataclass(frozen=True)
class ToolUseConfig:
    """The environment's knobs (from `--tool-*`) plus the response budget."""

    max_turns: int = 3  # model turns; code is run for all but the last
    budget: int = DEFAULT_BUDGET  # sampled + spliced response tokens
    limits: ToolLimits = ToolLimits()


def replay(sample: Sample, turns: list) -> bool:
    """Append stored turns to a sample holding its prompt ids; True when the last one ended it."""
    for t in turns:
        sample.append_response_tokens(t.token_ids, t.log_probs, loss_mask=t.loss_mask,
                                      text=t.meta["text"] + t.meta.get("observation", ""))
        sample.weight_versions.extend(t.meta.get("weight_versions", []))
        sample.metadata.setdefault("turns", []).append(
            {"text": t.meta["text"], "observation": t.meta.get("observation"), "finish": t.meta["finish_reason"],
             **{k: t.meta[k] for k in ("sampled_by", "worker") if t.meta.get(k)}})  # who sampled it (TurnLog)
        sample.status = Sample.Status(t.meta["status"])
    return bool(turns) and bool(turns[-1].meta["done"])


def model_text(sample: Sample) -> str:
    """What the model wrote (observations left out): the text the reward reads."""
    return "".join(t["text"] for t in sample.metadata.get("turns", []))


def reward(sample: Sample) -> float:
    return score(model_text(sample), sample.label)


Generate = Callable[[list[int], dict[str, Any]], Awaitable[Any]]  # (ids, params) -> GenerateOutput
Tool = Callable[[Any, str, ToolLimits], Awaitable[CodeRun]]  # (sandbox, code, limits) -> what it did


async def run_tool_rollout(sample: Sample, *, generate: Generate, tokenizer: Any, sandbox: Any,
                           params: dict[str, Any], config: ToolUseConfig, turn_log: Any | None = None,
                           on_turn: Callable[[int], None] | None = None, tool: Tool = run_code) -> Sample:
    """Finish `sample` (its `tokens` hold the prompt's ids): replay the turns `turn_log` (a
    `vime.envs.TurnLog`) holds, then sample, run (`tool`: the hook that runs a code block) and
    store the rest. Returns the sample with its response, loss mask and
    logprobs; its `metadata["turns"]` lists each turn's text and observation."""
    sample.response_length, sample.loss_mask, sample.rollout_log_probs = 0, [], []
    stored = await turn_log.read() if turn_log is not None else []
    done = replay(sample, stored)
    turn = sample.metadata["resumed_at"] = len(stored)
    while not done and turn < config.max_turns:
        left = config.budget - sample.response_length
        if left <= 0:
            sample.status = Sample.Status.TRUNCATED
            break
        request = {**params, "max_tokens": left, "stop": [CODE_CLOSE], "include_stop_str_in_output": True}
        if "seed" in request:
            request["seed"] = int(request["seed"]) + 7919 * turn  # each turn its own draw, the same on a retry
        out = await generate(sample.tokens, request)
        text = tokenizer.decode(out.token_ids, skip_special_tokens=False)
        ids, mask, logps = list(out.token_ids), [1] * len(out.token_ids), list(out.log_probs)
        status = Sample.Status.TRUNCATED if out.finish_reason == "length" else Sample.Status.COMPLETED
        code = code_of(text) if out.finish_reason == "stop" and turn + 1 < config.max_turns else None
        obs = ""
        if code is not None:
            obs = (await tool(sandbox, code, config.limits)).observation(config.limits)
            obs_ids = list(tokenizer.encode(obs, add_special_tokens=False))[:max(0, left - len(ids))]
            obs = tokenizer.decode(obs_ids, skip_special_tokens=False)
            ids, mask, logps = ids + obs_ids, mask + [0] * len(obs_ids), logps + [0.0] * len(obs_ids)
        done = code is None or len(ids) >= left
        meta = {"text": text, "observation": obs, "finish_reason": out.finish_reason, "done": done,
                "status": status.value, "weight_versions": list(out.weight_versions)}
        if turn_log is not None:
            await turn_log.append(turn, ids, mask, logps, meta)
        replay(sample, [_Turn(ids, mask, logps, meta)])
        turn += 1
        if on_turn is not None:
            on_turn(turn)
    sample.metadata["tool_calls"] = sum(1 for t in sample.metadata.get("turns", []) if t["observation"])
    return sample


@dataclass
class _Turn:
    """A turn as `replay` reads it (the store's `Turn` has the same fields)."""

    token_ids: list[int]
    loss_mask: list[int]
    log_probs: list[float]
    meta: dict

