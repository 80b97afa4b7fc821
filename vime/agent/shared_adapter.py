"""The process's Anthropic-API adapter in front of the run's vLLM router: every agent session of
a rollout worker (the coding agent's, any environment's that runs an agent) goes through one
adapter per event loop, on one local port; the worker stops it when it stops."""

from __future__ import annotations

import asyncio
from typing import Any

from vime.agent.adapters import AnthropicAdapter

_adapters: dict[asyncio.AbstractEventLoop, AnthropicAdapter] = {}


async def shared_adapter(args: Any) -> AnthropicAdapter:
    """The process's adapter (one per event loop) in front of `--vllm-router-ip/port`, started:
    every agent session of a worker goes through it, on one local port."""
    from vime.rollout.generate import router_url
    from vime.rollout.tokenization import get_tokenizer

    loop = asyncio.get_running_loop()
    if loop not in _adapters:
        _adapters[loop] = AnthropicAdapter(get_tokenizer(args.hf_checkpoint), router_url(args))
    adapter = _adapters[loop]
    await adapter.start()
    return adapter


async def close_shared_adapters() -> None:
    """Stop this event loop's adapter (a stopping worker)."""
    adapter = _adapters.pop(asyncio.get_running_loop(), None)
    if adapter is not None:
        await adapter.stop()
