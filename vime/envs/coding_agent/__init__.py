"""The coding agent environment: one durable `CodingAgentRolloutWorkflow` per rollout (sandbox
boot, agent session resumable per turn, diff, grading in a clean sandbox), grouped per prompt by
`CodingAgentGroupWorkflow`.

Its parts: `workflow` (the workflows and their data), `activities`/`session`/`sandbox_activities`
(the activities), `agent`/`tools`/`claude_code` (the agents: a compact Messages-API loop with
subagents and compaction, or the Claude Code CLI), `task`/`grading` (coding tasks and their
tests), `config`/`flags` (the `--agent-*` flags), `generate` (the same agent as a slime generate
hook, without the per-turn durability). Everything is named by string here: importing this
module (as the flag parser does) imports nothing heavy.
"""

from vime.envs.base import Environment
from vime.envs.coding_agent.flags import CodingAgentFlags

ENVIRONMENT = Environment(
    name="coding_agent",
    group_workflow="CodingAgentGroupWorkflow",
    workflows=("vime.envs.coding_agent.workflow:CodingAgentGroupWorkflow",
               "vime.envs.coding_agent.workflow:CodingAgentRolloutWorkflow"),
    activities="vime.envs.coding_agent.activities:start",
    flags=CodingAgentFlags,
    check="vime.envs.coding_agent.flags:check",
    description="Agent rollouts on coding tasks in sandboxes (--agent-* flags).",
)
