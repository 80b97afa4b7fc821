"""From the `--agent-*`, `--sandbox-*` and `--rollout-*` flags to what a coding session needs.

One place, so the durable workflow's activities and the `generate` hook run the same agent
with the same sampling in the same kind of sandbox, through the same process-wide adapter.
"""

from __future__ import annotations

from typing import Any

from vime.agent.shared_adapter import close_shared_adapters, shared_adapter  # noqa: F401 - the agent's adapter
from vime.envs.coding_agent.agent import AgentConfig
from vime.envs.coding_agent.flags import coding_flags
from vime.rollout.sampling import eval_or


def sampling_defaults(args: Any, evaluation: bool = False) -> dict[str, Any]:
    """vLLM sampling parameters of every agent turn (the adapter session's defaults); in an eval
    rollout `--eval-temperature`, `--eval-top-p` and `--eval-top-k` where given. A turn's
    `max_tokens` stays `--agent-max-tokens` (the session's budget is `--agent-max-turns`)."""
    params: dict[str, Any] = {"temperature": eval_or(args, "temperature", evaluation),
                              "max_tokens": coding_flags(args).agent_max_tokens}
    for name in ("top_p", "top_k", "stop", "stop_token_ids"):
        value = eval_or(args, name, evaluation)
        if value is not None:
            params[name] = value
    return params


def agent_config(args: Any) -> AgentConfig:
    flags = coding_flags(args)
    return AgentConfig(max_turns=flags.agent_max_turns, max_tokens=flags.agent_max_tokens,
                       compact_at_tokens=flags.agent_compact_at_tokens, command_timeout=flags.agent_command_timeout,
                       max_format_errors=flags.agent_max_format_errors)


def sandbox_options(args: Any, repo_dir: str | None = None) -> dict[str, Any]:
    """Constructor kwargs of `--sandbox-backend`: for bwrap, the `--sandbox-*` limits (the Claude
    Code CLI must reach the adapter on the host, so its bubblewrap sandboxes keep the network)."""
    options: dict[str, Any] = {}
    if args.sandbox_backend == "bwrap":
        from vime.sandbox.bwrap_limits import flag_options

        options.update(flag_options(args))
    if coding_flags(args).agent_harness == "claude_code" and args.sandbox_backend == "bwrap":
        from vime.envs.coding_agent.claude_code import claude_code_binds

        options["network"] = True
        options["ro_binds"] = claude_code_binds()
    if repo_dir is not None:
        options["repo_dir"] = repo_dir
    return options
