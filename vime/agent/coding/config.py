"""From the `--agent-*`, `--sandbox-*` and `--rollout-*` flags to what a coding session needs.

One place, so the durable workflow's activities and the `generate` hook run the same agent
with the same sampling in the same kind of sandbox, through the same process-wide adapter.
"""

from __future__ import annotations

import asyncio
from typing import Any

from vime.agent.adapters import AnthropicAdapter
from vime.agent.coding.agent import AgentConfig


def sampling_defaults(args: Any) -> dict[str, Any]:
    """vLLM sampling parameters of every agent turn (the adapter session's defaults)."""
    params: dict[str, Any] = {"temperature": args.rollout_temperature, "max_tokens": args.agent_max_tokens}
    for name, key in (("rollout_top_p", "top_p"), ("rollout_top_k", "top_k"), ("rollout_stop", "stop"),
                      ("rollout_stop_token_ids", "stop_token_ids")):
        value = getattr(args, name, None)
        if value is not None:
            params[key] = value
    return params


def agent_config(args: Any) -> AgentConfig:
    return AgentConfig(max_turns=args.agent_max_turns, max_tokens=args.agent_max_tokens,
                       compact_at_tokens=args.agent_compact_at_tokens, command_timeout=args.agent_command_timeout,
                       max_format_errors=args.agent_max_format_errors)


def sandbox_options(args: Any, repo_dir: str | None = None) -> dict[str, Any]:
    """Constructor kwargs of `--sandbox-backend` (the Claude Code CLI must reach the adapter on
    the host, so its bubblewrap sandboxes keep the network)."""
    options: dict[str, Any] = {}
    if getattr(args, "agent_harness", "builtin") == "claude_code" and args.sandbox_backend == "bwrap":
        from vime.agent.coding.claude_code import claude_code_binds

        options["network"] = True
        options["ro_binds"] = claude_code_binds()
    if repo_dir is not None:
        options["repo_dir"] = repo_dir
    return options


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
