"""The tool-use environment's flags (`--tool-*`), and the checks that run before anything starts."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Any

from vime.envs.base import env_flag
from vime.errors import ConfigError


@dataclass
class ToolUseFlags:
    tool_max_turns: int = env_flag(3, "Model turns per rollout; the code of all but the last is run.")
    tool_timeout: float = env_flag(5.0, "Seconds one code block may run before it is stopped (an observation).")
    tool_memory_mb: int = env_flag(256, "Address space of one code block, MiB (a MemoryError beyond it).")


def check(args: Any) -> None:
    """Bad flags or a missing tool are one line naming the flag, before any service starts."""
    flags: ToolUseFlags = args.env_args
    if flags.tool_max_turns < 1:
        raise ConfigError(f"--tool-max-turns {flags.tool_max_turns}: must be at least 1")
    if not flags.tool_timeout > 0:
        raise ConfigError(f"--tool-timeout {flags.tool_timeout}: must be positive seconds")
    if flags.tool_memory_mb < 32:
        raise ConfigError(f"--tool-memory-mb {flags.tool_memory_mb}: Python needs at least 32 MiB to start")
    if args.prompt_data and not args.label_key:
        raise ConfigError("--rollout-env tool_use needs --label-key: the reward checks the answer against it")
    if args.sandbox_backend == "bwrap" and not (shutil.which("bwrap") and shutil.which("prlimit")):
        raise ConfigError("--rollout-env tool_use runs code under bubblewrap: install it (apt-get install -y "
                          "bubblewrap) or choose another --sandbox-backend")


def tool_use_config(args: Any):
    """The rollout's config from the run's flags (defaults for a run that parsed none)."""
    from vime.envs.tool_use.rollout import DEFAULT_BUDGET, ToolUseConfig
    from vime.envs.tool_use.tool import ToolLimits

    flags = args.env_args if isinstance(args.env_args, ToolUseFlags) else ToolUseFlags()
    return ToolUseConfig(max_turns=flags.tool_max_turns,
                         budget=args.rollout_max_response_len or DEFAULT_BUDGET,
                         limits=ToolLimits(timeout=flags.tool_timeout, memory_mb=flags.tool_memory_mb))
