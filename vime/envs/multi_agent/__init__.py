"""The multi-agent environment (`--rollout-env multi_agent`): K solvers → a rewriter → a
selector, all the same policy, one durable `MultiAgentRolloutWorkflow` per rollout whose roles
are activities, grouped per prompt by `MultiAgentGroupWorkflow`.

Its parts: `task` (the toy task, role prompts, scores and rewards), `roles` (sampling each
role's turns), `generate` (all roles in one slime generate hook), `workflow`/`activities` (the
durable environment, one activity per role; `start` takes the score and the reward as hooks),
`flags` (`--num-solvers`, the reward weights). The runnable example is `examples/multi_agent`.

Everything is named by string: the flag parser imports this module to learn its flags, and
nothing heavy loads until a rollout worker registers the activities.
"""

from vime.envs.base import Environment
from vime.envs.multi_agent.flags import MultiAgentFlags

ENVIRONMENT = Environment(
    name="multi_agent",
    group_workflow="MultiAgentGroupWorkflow",
    workflows=("vime.envs.multi_agent.workflow:MultiAgentGroupWorkflow",
               "vime.envs.multi_agent.workflow:MultiAgentRolloutWorkflow"),
    activities="vime.envs.multi_agent.activities:start",
    flags=MultiAgentFlags,
    check="vime.envs.multi_agent.flags:check",
    description="K solvers, a rewriter and a selector per rollout, one fan-out with role tags (--num-solvers, "
                "--correct-reward-weight, --incorrect-reward-weight).",
)
