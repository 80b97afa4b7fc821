"""The tool-use environment (`--rollout-env tool_use`): retool-style multi-turn rollouts whose
Python runs in a sandbox. Named by strings only: the flag parser imports this module, and the
sandbox, tokenizer and engine wait for the rollout worker.

Its parts: `workflow` (the group workflow and its data), `activities` (one rollout, storing a
group; `start` takes the reward and the tool as hooks), `rollout` (the turn loop), `tool` (a code
block in a sandbox), `task` (the toy arithmetic task and its grader), `flags` (`--tool-*`).
The runnable example (SFT warm start, then GRPO) is `examples/tool_use`.
"""

from vime.envs.base import Environment
from vime.envs.tool_use.flags import ToolUseFlags

ENVIRONMENT = Environment(
    name="tool_use",
    group_workflow="ToolUseGroupWorkflow",
    workflows=("vime.envs.tool_use.workflow:ToolUseGroupWorkflow",),
    activities="vime.envs.tool_use.activities:start",
    flags=ToolUseFlags,
    check="vime.envs.tool_use.flags:check",
    description="Multi-turn tool use: the model's Python runs in a sandbox, its output is a masked observation.",
)
