"""The coding agent's flags (`--agent-*`): parsed into `args.env_args` when the run uses the
coding agent (`--rollout-env coding_agent`, or its generate hook)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vime.envs.base import env_flag
from vime.errors import ConfigError


@dataclass
class CodingAgentFlags:
    agent_harness: str = env_flag("builtin", "Agent: the built-in coding agent or the Claude Code CLI.",
                                  choices=("builtin", "claude_code"))
    agent_max_turns: int = env_flag(16, "Model turns per agent session (subagents included).")
    agent_max_tokens: int = env_flag(512, "max_tokens of one agent turn.")
    agent_compact_at_tokens: int | None = env_flag(None, "Compact the conversation when a prompt exceeds this.")
    agent_command_timeout: float = env_flag(60.0, "Seconds a command the agent runs may take.")
    agent_max_format_errors: int = env_flag(0, "Replies without a tool call answered with a reminder, not an end.")


def check(args: Any) -> None:
    flags: CodingAgentFlags = args.env_args
    if flags.agent_max_turns <= 0 or flags.agent_max_tokens <= 0 or flags.agent_max_format_errors < 0:
        raise ConfigError("--agent-max-turns and --agent-max-tokens must be positive, --agent-max-format-errors >= 0")
    if flags.agent_command_timeout <= 0:
        raise ConfigError(f"--agent-command-timeout {flags.agent_command_timeout}: must be positive seconds")
    if args.sandbox_backend == "bwrap":
        from vime.sandbox.bwrap_limits import flag_options

        flag_options(args)  # a bad --sandbox-* limit fails here, before any service starts


def coding_flags(args: Any) -> CodingAgentFlags:
    """The run's coding-agent flags (their defaults for a run that parsed none, e.g. a test's)."""
    flags = args.env_args
    return flags if isinstance(flags, CodingAgentFlags) else CodingAgentFlags()
