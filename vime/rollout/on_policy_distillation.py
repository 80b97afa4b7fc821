"""On-policy distillation, rollout side: the teacher's log-probs of the tokens the student sampled.

slime's route, unchanged in shape: the reward function (`--custom-rm-path
vime.rollout.on_policy_distillation.reward_func`) sends each finished sample to the teacher's
server, stores the teacher's log-prob of every response token on the sample
(`Sample.teacher_log_probs`, kept in the store with the sample) and returns reward 0.0: the
learning signal is the trainer's reverse-KL penalty (`--use-opd`, `vime.train.opd`), not a
reward. A reward function with a task reward of its own calls `score_with_teacher(args, sample)`
and returns its reward: GRPO on the task and distillation then add up.

The teacher is a frozen model: `args.vllm_model_routers["teacher"]` (a model named `teacher` with
`update_weights: false` in `--vllm-config`, or `--vllm-model-urls teacher=URL`), else `--rm-url`
(where slime scripts point at the teacher). It reads the student's token ids, so it must share the
student's tokenizer (`vime.config.preflight.check_opd` compares them before anything starts).

One request per sample, token ids in: vLLM's `/inference/v1/generate` with `prompt_logprobs: 0`
scores every token of prompt + response in one prefill (the one token it then generates is
discarded). The log-probs are the teacher's own distribution (temperature 1).
"""

from __future__ import annotations

from typing import Any

from vime.errors import ConfigError, ServiceError
from vime.types import Sample

TEACHER = "teacher"
"""The model name a `--vllm-config` gives the teacher."""

ROUTE = "/inference/v1/generate"


def teacher_url(args: Any) -> str | None:
    """Where the teacher is served: the `teacher` model of the run's topology, else `--rm-url`."""
    url = (args.vllm_model_routers or {}).get(TEACHER) or args.rm_url
    if not url:
        return None
    url = url.rstrip("/")
    for suffix in (ROUTE, "/generate"):  # slime's --rm-url names sglang's /generate route
        url = url.removesuffix(suffix)
    return url


def teacher_request(sample: Sample) -> dict[str, Any]:
    """The prefill that scores `sample.tokens` (prompt and response) under the teacher."""
    return {"token_ids": list(sample.tokens),
            "sampling_params": {"max_tokens": 1, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
                                "prompt_logprobs": 0, "detokenize": False}}


def response_log_probs(body: dict[str, Any], sample: Sample) -> list[float]:
    """The teacher's log-probs of the sample's response tokens, from the route's `prompt_logprobs`
    (one entry per prompt position, None for the first; each maps token id -> {"logprob": ...})."""
    entries = body.get("prompt_logprobs")
    if not isinstance(entries, list) or len(entries) != len(sample.tokens):
        got = len(entries) if isinstance(entries, list) else type(entries).__name__
        raise ServiceError(f"the teacher answered {got} prompt log-probs for {len(sample.tokens)} tokens")
    out = []
    for position in range(sample.prompt_length, len(sample.tokens)):
        entry, token = entries[position], sample.tokens[position]
        scored = entry.get(str(token), entry.get(token)) if isinstance(entry, dict) else None
        if not isinstance(scored, dict) or "logprob" not in scored:
            raise ServiceError(f"the teacher's prompt log-probs lack token {token} at position {position}")
        out.append(float(scored["logprob"]))
    return out


async def score_with_teacher(args: Any, sample: Sample) -> list[float]:
    """Fetch and store `sample.teacher_log_probs` (one per response token); returns them.

    A teacher that cannot be reached is a `ServiceError` (the rollout is retried, as when a reward
    model's server restarts); one that refuses the request (4xx: a token id outside its vocabulary,
    a sequence longer than its max_model_len) is a `ConfigError` that stops the run, naming it.
    """
    from vime.engine.client import EngineClient, EngineRequestError

    url = teacher_url(args)
    if url is None:
        raise ConfigError("on-policy distillation: no teacher; serve it as a model named 'teacher' with "
                          "update_weights: false in --vllm-config, or pass --vllm-model-urls teacher=http://HOST:PORT")
    if sample.response_length == 0:
        sample.teacher_log_probs = []
        return []
    try:
        async with EngineClient(url, timeout=600.0) as client:
            body = await client.post_json(ROUTE, teacher_request(sample))
    except EngineRequestError as exc:
        if 400 <= exc.status < 500:
            raise ConfigError(
                f"the OPD teacher at {url} refused sample {sample.index} ({len(sample.tokens)} tokens, ids up to "
                f"{max(sample.tokens)}): HTTP {exc.status} {exc.body[:200]}; the teacher must share the student's "
                "tokenizer and hold prompt + response (raise its max_model_len)") from None
        raise
    sample.teacher_log_probs = response_log_probs(body, sample)
    return sample.teacher_log_probs


async def reward_func(args: Any, sample: Sample, **kwargs: Any) -> float:
    """slime's OPD reward function: the teacher's log-probs stored on the sample, reward 0.0 (pure
    distillation; the signal is `--use-opd`'s reverse-KL penalty)."""
    await score_with_teacher(args, sample)
    return 0.0
