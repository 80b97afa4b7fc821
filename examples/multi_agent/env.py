"""The multi-agent environment (`--rollout-env multi_agent`): K solvers → a rewriter → a
selector, all the same policy, one durable `MultiAgentRolloutWorkflow` per rollout whose roles
are activities, grouped per prompt by `MultiAgentGroupWorkflow`.

Everything is named by string: the flag parser imports this module to learn its flags, and
nothing heavy loads until a rollout worker registers the activities.
"""

from examples.multi_agent.flags import MultiAgentFlags
from vime.envs.base import Environment

ENVIRONMENT = Environment(
    name="multi_agent",
    group_workflow="MultiAgentGroupWorkflow",
    workflows=("examples.multi_agent.workflow:MultiAgentGroupWorkflow",
               "examples.multi_agent.workflow:MultiAgentRolloutWorkflow"),
    activities="examples.multi_agent.activities:start",
    flags=MultiAgentFlags,
    check="examples.multi_agent.flags:check",
    description="K solvers, a rewriter and a selector per rollout, one fan-out with role tags (--num-solvers, "
                "--correct-reward-weight, --incorrect-reward-weight).",
)
