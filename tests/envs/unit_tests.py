"""A single-turn environment whose reward runs the model's code against unit tests in a sandbox.

`--rollout-env tests.envs.unit_tests`: each prompt's label holds the tests (Python asserts); the
response's code (its last ```python block, else all of it) runs with them under bubblewrap, and
the reward is 1.0 when they pass. `metadata["grade"]` says why not (failed/error/timeout).
"""

import re
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from vime.envs import Environment, EnvWorkers, GroupInput, GroupOutput, execute_group_activity, finish_group


@workflow.defn(name="UnitTestGroupWorkflow")
class UnitTestGroupWorkflow:
    @workflow.run
    async def run(self, inp: GroupInput) -> GroupOutput:
        return finish_group(await execute_group_activity(inp, "unit_test_group", timedelta(minutes=10)))


async def reward(args, sample) -> float:
    from vime.envs import run_program

    blocks = re.findall(r"```(?:python)?\n(.*?)```", sample.response, re.S)
    result = await run_program((blocks[-1] if blocks else sample.response) + "\n\n" + sample.label, timeout=5)
    sample.metadata["grade"] = result.grade()
    return 1.0 if result.passed else 0.0


def start(ctx) -> EnvWorkers:
    from vime.envs import group_activity

    return EnvWorkers(activities=[group_activity("unit_test_group", ctx, reward=reward)])


ENVIRONMENT = Environment(name="unit_tests", group_workflow="UnitTestGroupWorkflow",
                          workflows=(UnitTestGroupWorkflow,), activities=start)
