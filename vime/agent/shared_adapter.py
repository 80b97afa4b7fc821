"""The process's Anthropic-API adapters in front of the runs' vLLM routers: every agent session of
a rollout worker (the coding agent's, any environment's that runs an agent) goes through one
adapter per event loop and per (model, router), on one local port each; the worker stops them
when it stops. One worker serves many runs: two runs with other models or routers get two adapters."""

from __future__ import annotations

import asyncio
from typing import Any

from vime.agent.adapters import AnthropicAdapter

_adapters: dict[tuple[asyncio.AbstractEventLoop, str, str], AnthropicAdapter] = {}


async def shared_adapter(args: Any) -> AnthropicAdapter:
    """The adapter (one per event loop, checkpoint and router) in front of the run's
    `--vllm-router-ip/port` with the run's `--hf-checkpoint` tokenizer, started."""
    from vime.rollout.generate import router_url
    from vime.rollout.tokenization import get_tokenizer

    key = (asyncio.get_running_loop(), str(args.hf_checkpoint), router_url(args))
    if key not in _adapters:
        _adapters[key] = AnthropicAdapter(get_tokenizer(args.hf_checkpoint), key[2])
    adapter = _adapters[key]
    await adapter.start()
    return adapter


async def close_shared_adapters() -> None:
    """Stop this event loop's adapters (a stopping worker)."""
    loop = asyncio.get_running_loop()
    for key in [k for k in _adapters if k[0] is loop]:
        await _adapters.pop(key).stop()
