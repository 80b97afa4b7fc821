"""The default environment: single-turn prompt groups, one `RolloutWorkflow` per group, generated
by `--custom-generate-function-path` (or vime's default generate) and scored by the reward flags.
Its activities (`generate_group`, ...) are the rollout worker's own, so it declares none."""

from vime.envs.base import Environment

ENVIRONMENT = Environment(
    name="groups",
    group_workflow="RolloutWorkflow",
    workflows=("workflows.rollout:RolloutWorkflow",),
    description="Single-turn prompt groups (RolloutWorkflow): generate, reward, store.",
)
