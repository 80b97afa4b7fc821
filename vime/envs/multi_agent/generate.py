"""The multi-agent system as a slime generate hook: one sample in, the whole team's turns out.

    vime train --custom-generate-function-path vime.envs.multi_agent.generate.generate \\
        --num-solvers 3 --correct-reward-weight 1.2 --incorrect-reward-weight 0.8 ...

The seed's route for "multiple training samples from one prompt": K solvers, then the rewriter,
then the selector, and `generate` returns them as one `list[Sample]` fan-out sharing the
sample's `rollout_id`, each tagged `metadata["role"]` and already rewarded (by the default hooks
`task.score` and `task.reward`), so no reward flag is needed. The same roles as the durable
environment (`--rollout-env multi_agent`), without its per-role durability: a crashed group is
generated again from the start.
"""

from __future__ import annotations

from typing import Any

from vime.envs.multi_agent import ENVIRONMENT  # noqa: F401 - the hook's module names its flags' environment
from vime.envs.multi_agent import roles, task
from vime.envs.multi_agent.flags import multi_agent_flags
from vime.types import Sample


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any],
                   evaluation: bool = False) -> list[Sample]:
    flags = multi_agent_flags(args)
    turns = await roles.solvers(args, sample, sampling_params, flags.num_solvers)
    if any(task.usable(s) for s in turns):  # else there is nothing to rewrite or select: a shorter fan-out
        rewrite = await roles.rewriter(args, sample, sampling_params, turns)
        turns += [rewrite, await roles.selector(args, sample, sampling_params, turns, rewrite)]
    await roles.pay(task.reward, args, turns)
    rollout_id = sample.rollout_id if sample.rollout_id is not None else sample.index
    for s in turns:
        s.rollout_id = rollout_id
    return turns
