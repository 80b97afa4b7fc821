"""Every environment's rollout workflow shows its samples in its memo, where the Web UI reads it.

Each built-in environment runs through Temporal here with its real workflows and store
activities, and a scripted policy or stand-in sandbox activities in place of vLLM and
bubblewrap: the group's memo (and a per-sample rollout workflow's own) lists each sample's key,
reward, status and finish reason, what it is in its rollout (a multi-agent role and turn, a
multi-turn rollout's turns) and which activity attempt and worker sampled it. A truncated
sample finished (it hit the length limit): its preview names no failure. tool_use's memo is
checked in tests/test_tool_use.py, on its crash-and-resume test.

The multi-agent test also reads a retried role back with `vime show` (its role and its attempt)
and resets a finished rollout with `temporal workflow reset`: the reset runs it again and the
store keeps the samples it had, none sampled or written twice (docs/inspect.md says so).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.worker import Worker

from vime.agent.adapters.core import Segment, TurnBoundary
from vime.agent.recorder import TrajectoryRecorder
from vime.config.args import parse_args
from vime.envs.coding_agent.workflow import (AgentRolloutInput, AgentTask, DiffOutput, GradeOutput, SandboxRef,
                                             SessionInput, SessionOutput)
from vime.envs.base import EnvContext
from vime.envs.contract import GroupInput, GroupOutput
from vime.envs.rollouts import sampled_here
from vime.errors import ServiceError
from vime.store import SampleStore
from vime.temporal.dev_server import temporal_cli_path
from vime.types import Sample

pytestmark = pytest.mark.temporal


async def memo_samples(client, workflow_id: str) -> list[dict]:
    return (await (await client.get_workflow_handle(workflow_id).describe()).memo()).get("samples", [])


def run_args(tmp_path: Path, tiny_model_dir: Path, run_id: str, *flags: str):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Name a city.", "label": "Paris"}) + "\n")
    return parse_args(["--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(prompts), "--input-key", "prompt",
                       "--label-key", "label", "--run-id", run_id, "--run-dir", str(tmp_path / "run"), *flags])


# ---- groups: the default single-turn environment ---------------------------------------------

async def scripted_generate(args, sample, sampling_params):
    """Stands in for vLLM: sample 0 stops, sample 1 hits the length limit."""
    sample.tokens = [1, 2, 3, 4, 5]
    sample.response, sample.response_length = f"Paris {sample.index}", 2
    sample.loss_mask, sample.rollout_log_probs = [1, 1], [-0.5, -0.5]
    sample.status = Sample.Status.TRUNCATED if sample.index == 1 else Sample.Status.COMPLETED
    sample.weight_versions = [0]
    return sample


def exact_reward(args, sample) -> float:
    return 1.0 if sample.status == Sample.Status.COMPLETED else 0.0


async def test_a_default_group_shows_each_sample_and_a_truncated_one_finished_not_failed(
        temporal_env, tiny_model_dir, tmp_path):
    from activities.rollout import RolloutActivities
    from workflows.rollout import RolloutWorkflow

    run_id = f"memo-groups-{uuid.uuid4().hex[:6]}"
    args = run_args(tmp_path, tiny_model_dir, run_id, "--n-samples-per-prompt", "2",
                    "--custom-generate-function-path", f"{__name__}.scripted_generate",
                    "--custom-rm-path", f"{__name__}.exact_reward")
    with SampleStore.open(tmp_path / "run") as store:
        store.ensure_run(run_id)
        acts = RolloutActivities(args, store)
        async with Worker(temporal_env.client, task_queue=run_id, workflows=[RolloutWorkflow],
                          activities=[acts.generate_group]):
            out = await temporal_env.client.execute_workflow(
                RolloutWorkflow.run, GroupInput(run_id, 0, 0, 0, n_samples_per_prompt=2), id=f"{run_id}-rollout-0",
                task_queue=run_id)
    assert out.preview is None, "the training workflow's history carries no text"
    stopped, truncated = await memo_samples(temporal_env.client, f"{run_id}-rollout-0")
    assert (stopped["sample"], stopped["reward"], stopped["status"], stopped["finish"]) == ("0/0", 1.0, "completed",
                                                                                            "stop")
    assert (truncated["sample"], truncated["status"], truncated["finish"]) == ("1/0", "truncated", "length")
    assert "failure" not in truncated and truncated["response"] == "Paris 1"


# ---- multi_agent: a workflow per rollout, an activity per role --------------------------------

class ScriptedTeam:
    """Stands in for vime's generate: every role replies; the rewriter's engine fails once, so
    its turn is sampled by the activity's second attempt."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    async def __call__(self, args, sample, params):
        role, turn = sample.metadata["role"], sample.metadata["turn"]
        if role == "rewriter" and ("rewriter", turn) not in self.calls:
            self.calls.append((role, turn))
            raise ServiceError("the engine went away (scripted)")
        self.calls.append((role, turn))
        sample.tokens, sample.response, sample.response_length = [1, 2, 3, 4], "A" if role == "selector" else "Paris", 2
        sample.loss_mask, sample.rollout_log_probs, sample.status = [1, 1], [-0.5, -0.5], Sample.Status.COMPLETED
        return sample


async def test_multi_agent_memos_show_each_roles_turn_and_vime_show_the_retried_roles_attempt(
        temporal_env, tiny_model_dir, tmp_path, monkeypatch):
    from vime.envs.multi_agent import roles
    from vime.envs.multi_agent.activities import start
    from vime.envs.multi_agent.workflow import MultiAgentGroupWorkflow, MultiAgentRolloutWorkflow
    from vime.ops.show import load, render

    team = ScriptedTeam()
    monkeypatch.setattr(roles, "generate", team)
    run_id = f"memo-team-{uuid.uuid4().hex[:6]}"
    args = run_args(tmp_path, tiny_model_dir, run_id, "--rollout-env", "multi_agent", "--num-solvers", "2")
    rollout_wf = f"{run_id}-rollout-0-0"
    with SampleStore.open(tmp_path / "run") as store:
        store.ensure_run(run_id)
        acts = start(EnvContext(args, store, temporal_env.client), score=lambda args, s: 0.5,
                     reward=lambda args, turns: [float(t.metadata["turn"]) for t in turns]).activities
        async with Worker(temporal_env.client, task_queue=run_id, activities=acts,
                          workflows=[MultiAgentGroupWorkflow, MultiAgentRolloutWorkflow]):
            out = await temporal_env.client.execute_workflow(
                MultiAgentGroupWorkflow.run, GroupInput(run_id, 0, 0, 0, n_samples_per_prompt=1, heartbeat_seconds=30),
                id=f"{run_id}-rollout-0", task_queue=run_id)
            assert out.preview is None and out.samples == 4
            rollout_memo = await memo_samples(temporal_env.client, rollout_wf)
            assert await memo_samples(temporal_env.client, f"{run_id}-rollout-0") == rollout_memo, "the group's too"
            assert [(p["sample"], p["role"], p["turn"], p["reward"]) for p in rollout_memo] == [
                ("0/0", "solver", 0, 0.0), ("0/1", "solver", 1, 1.0), ("0/2", "rewriter", 2, 2.0),
                ("0/3", "selector", 3, 3.0)]
            attempts = {p["role"]: p["sampled_by"].split("#")[1] for p in rollout_memo}
            assert attempts == {"solver": "1", "rewriter": "2", "selector": "1"}
            assert all(p["worker"] == temporal_env.client.identity for p in rollout_memo)

            rewriter = render(load(store, run_id, "0/2")[0], None, color=False, token_table=False)
            assert "role: rewriter (slot 0), turn 2 of the rollout, score 0.5" in rewriter
            assert f"attempt 2 (a retry) on worker {temporal_env.client.identity}" in rewriter

            before, calls = store.read_rollout(run_id, "0"), list(team.calls)
            first_run = (await temporal_env.client.get_workflow_handle(rollout_wf).describe()).run_id
            target = temporal_env.client.service_client.config.target_host
            subprocess.run([str(temporal_cli_path()), "workflow", "reset", "--address", target, "-w", rollout_wf,
                            "-t", "FirstWorkflowTask", "--reason", "test: reset a finished rollout"],
                           check=True, capture_output=True, timeout=60)
            again = temporal_env.client.get_workflow_handle(rollout_wf)  # its newest run: the reset's
            assert (await again.result())["rollout"]["rollout_id"] == "0"
            assert (await again.describe()).run_id != first_run
            after = store.read_rollout(run_id, "0")
    assert team.calls == calls, "the reset sampled nothing: every role's turns were stored"
    assert after == before, "the same samples, none written twice"


# ---- coding_agent: stand-in sandbox activities, the real store -----------------------------------

def stand_ins(queue: str) -> list:
    """The coding agent's task, sandbox and grading activities, standing in for bubblewrap and the
    agent: the session stores one step per attempt and dies after its first, as a killed worker
    would; the real `store_agent_rollout` turns the stored steps into the rollout's sample."""
    @activity.defn(name="agent_task")
    async def agent_task(inp: AgentRolloutInput) -> AgentTask:
        return AgentTask(str(inp.index), inp.position, inp.index, "fix chunks()", "/nowhere", "true", "chunks")

    @activity.defn(name="boot_sandbox")
    async def boot_sandbox(_) -> SandboxRef:
        return SandboxRef("sandbox-1", queue)

    @activity.defn(name="agent_session")
    async def agent_session(inp: SessionInput) -> SessionOutput:
        recorder = TrajectoryRecorder(store_of[inp.run_id], inp.run_id, inp.task.rollout_id)
        step = recorder.load().next_turn
        prompt = [1, 2, 3]
        turns = [TurnBoundary(3 + 2 * i, 5 + 2 * i, "tool_calls" if i == 0 else "stop") for i in range(step + 1)]
        ids = prompt + [10, 11, 12, 13][: 2 * (step + 1)]
        segment = Segment(ids, [0] * 3 + [1] * (len(ids) - 3), [0.0] * 3 + [-0.5] * (len(ids) - 3), 3, turns)
        here = sampled_here()
        recorder.save({"main": [segment]}, {"step": step}, "--- a/chunking.py\n", attempt=here["sampled_by"],
                      worker=here["worker"])
        if step == 0:
            raise ServiceError("the worker died mid-session (scripted)")
        return SessionOutput(2, "stop", True)

    @activity.defn(name="capture_diff")
    async def capture_diff(_) -> DiffOutput:
        return DiffOutput("sha256:0", "--- a/chunking.py\n")

    @activity.defn(name="grade_diff")
    async def grade_diff(_) -> GradeOutput:
        return GradeOutput(1.0, "passed", "tests pass")

    @activity.defn(name="teardown_sandbox")
    async def teardown_sandbox(_) -> None:
        return None

    return [agent_task, boot_sandbox, agent_session, capture_diff, grade_diff, teardown_sandbox]


store_of: dict[str, SampleStore] = {}


async def test_a_coding_agent_rollouts_memo_shows_its_turns_reward_and_the_attempts_that_sampled_them(
        temporal_env, tiny_model_dir, tmp_path):
    from vime.envs.coding_agent.activities import CodingAgentActivities
    from vime.envs.coding_agent.workflow import CodingAgentGroupWorkflow, CodingAgentRolloutWorkflow

    run_id = f"memo-agent-{uuid.uuid4().hex[:6]}"
    args = run_args(tmp_path, tiny_model_dir, run_id)
    with SampleStore.open(tmp_path / "run") as store:
        store.ensure_run(run_id)
        store_of[run_id] = store
        agents = CodingAgentActivities(EnvContext(args, store, temporal_env.client))
        async with Worker(temporal_env.client, task_queue=run_id, activities=[*stand_ins(run_id), agents.store_agent_rollout],
                          workflows=[CodingAgentGroupWorkflow, CodingAgentRolloutWorkflow]):
            out = await temporal_env.client.execute_workflow(
                CodingAgentGroupWorkflow.run,
                GroupInput(run_id, 0, 0, 0, n_samples_per_prompt=1, sandbox_task_queue=run_id, heartbeat_seconds=30),
                id=f"{run_id}-rollout-0", task_queue=run_id)
        store_of.pop(run_id)
    assert out.preview is None and out.reward_mean == 1.0
    (preview,) = await memo_samples(temporal_env.client, f"{run_id}-rollout-0-0")
    assert (preview["sample"], preview["reward"], preview["turns"], preview["finish"]) == ("0/0", 1.0, 2, "stop")
    session = preview["sampled_by"].split(",")
    assert [a.split("#")[1] for a in session] == ["1", "2"], "the step each session attempt stored"
    assert preview["worker"] == temporal_env.client.identity
    assert await memo_samples(temporal_env.client, f"{run_id}-rollout-0") == [preview], "the group's memo too"
