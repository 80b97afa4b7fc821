"""The coding agent as a slime generate hook: one sample in, the fanned-out `list[Sample]` out.

    vime train --custom-generate-function-path vime.envs.coding_agent.generate.generate \\
        --prompt-data tasks.jsonl ...   # records with metadata.repo and metadata.test_command

For users who keep the per-group `RolloutWorkflow` (or call it from their own rollout
function): boot a sandbox, run the built-in agent through the process's adapter, capture the
diff, grade it in a clean sandbox, and return one `Sample` per segment (subagents, wipes, the
final chain) sharing the sample's `rollout_id` and the reward. It is the same agent, sampling
and sandbox as `CodingAgentRolloutWorkflow` (vime.envs.coding_agent.config), without that
workflow's durability: a crashed group is generated again from the start. A sandbox that
breaks is raised as `SandboxError`, which the rollout group records as an infra failure.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from vime.envs.coding_agent.agent import run_coding_agent
from vime.envs.coding_agent.config import agent_config, sampling_defaults, sandbox_options, shared_adapter
from vime.envs.coding_agent.flags import coding_flags
from vime.envs.coding_agent.grading import grade_in_sandbox, task_test_files
from vime.envs.coding_agent.task import coding_task
from vime.agent.fanout import trajectory_to_samples
from vime.sandbox import make_sandbox
from vime.sandbox.git import capture_diff, init_base
from vime.rollout.generate import fail
from vime.rollout.eval_data import eval_sets
from vime.types import Sample

async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any],
                   evaluation: bool = False) -> list[Sample]:
    source = dict(eval_sets(args)).get(sample.metadata.get("eval_set")) if evaluation else args.prompt_data
    task = coding_task(sample, Path(source or ".").resolve().parent)  # repositories are relative to their file
    adapter = await shared_adapter(args)
    defaults = {**sampling_defaults(args, evaluation), **{k: v for k, v in sampling_params.items() if k in ("temperature", "top_p", "top_k", "seed")}}
    async with make_sandbox(args.sandbox_backend, **sandbox_options(args, task.repo_dir)) as sbx:
        await init_base(sbx)
        run = await run_coding_agent(adapter, sbx, task.prompt, session_prefix=f"{sample.index}-{uuid.uuid4().hex[:8]}",
                                     config=agent_config(args), sampling_defaults=defaults)
        diff = await capture_diff(sbx)
    grade = await grade_in_sandbox(lambda: make_sandbox(args.sandbox_backend, **sandbox_options(args, task.repo_dir)),
                                   diff, task.test_command, test_files=task_test_files(task.repo_dir),
                                   timeout=coding_flags(args).agent_command_timeout)
    rollout_id = sample.rollout_id if sample.rollout_id is not None else sample.index
    samples = trajectory_to_samples(run.segments, rollout_id=rollout_id, reward=grade.reward, base=sample,
                                    tokenizer=adapter.core.tokenizer)
    for s in samples:
        s.metadata.update(task_id=task.task_id, diff=diff, grade={"outcome": grade.outcome, "reason": grade.reason},
                          stop_reason=run.state.stop_reason)
    return samples or [fail(sample, "the agent sampled nothing", stop_reason=run.state.stop_reason)]
