"""The tool-use environment (`--rollout-env tool_use`): retool-style multi-turn rollouts whose
Python runs in a sandbox. Named by strings only: the flag parser imports this module, and the
sandbox, tokenizer and engine wait for the rollout worker."""

from examples.tool_use.flags import ToolUseFlags
from vime.envs.base import Environment

ENVIRONMENT = Environment(
    name="tool_use",
    group_workflow="ToolUseGroupWorkflow",
    workflows=("examples.tool_use.workflow:ToolUseGroupWorkflow",),
    activities="examples.tool_use.activities:start",
    flags=ToolUseFlags,
    check="examples.tool_use.flags:check",
    description="Multi-turn tool use: the model's Python runs in a sandbox, its output is a masked observation.",
)
