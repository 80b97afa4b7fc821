"""The coding agent as a slime generate hook (`--custom-generate-function-path
vime.envs.coding_agent.generate.generate`): a prompt group in, fanned-out samples with the graded
reward out, through the real adapter, vLLM on the tiny model and bubblewrap sandboxes."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from examples.coding_agent_rl.gold_edits import write_prompts
from examples.coding_agent_rl.tasks.prepare import load_tasks
from tests.conftest import engine_flags
from vime.config.args import parse_args
from vime.errors import ConfigError
from vime.rollout.data_source import make_data_source
from vime.rollout.group import run_group

pytestmark = pytest.mark.vllm


def _args(tmp_path: Path, server, model: Path, prompts: Path):
    return parse_args([
        "--hf-checkpoint", str(model), "--prompt-data", str(prompts), "--input-key", "prompt", "--label-key", "label",
        "--custom-generate-function-path", "vime.envs.coding_agent.generate.generate", "--n-samples-per-prompt", "2",
        "--rollout-batch-size", "1", "--agent-max-turns", "3", "--agent-max-format-errors", "3",
        "--agent-max-tokens", "16", "--run-dir", str(tmp_path / "run"), *engine_flags(server)])


async def test_a_group_of_agent_rollouts_comes_back_as_fanned_out_graded_samples(
        tmp_path, vllm_server, tiny_model_dir, sandbox_base, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(sandbox_base))  # where the sandboxes' workdirs go
    args = _args(tmp_path, vllm_server, tiny_model_dir, write_prompts(load_tasks()[:1], tmp_path / "prompts.jsonl"))
    group = make_data_source(args).prompt_group(0)

    rollouts = await run_group(args, group)

    assert len(rollouts) == 2
    for original, siblings in zip(group, rollouts):
        assert siblings and {s.rollout_id for s in siblings} == {original.index}  # one rollout, one id
        assert [s.reward for s in siblings] == [0.0] * len(siblings)  # the random model fixes nothing
        assert siblings[-1].metadata["segment_kind"] == "final"
        assert siblings[-1].metadata["grade"]["outcome"] in ("empty_diff", "tests_failed", "patch_failed")
        assert sum(len(s.metadata["turns"]) for s in siblings) == 3
        assert all(s.loss_mask and len(s.loss_mask) == s.response_length for s in siblings)
    assert not list(sandbox_base.glob("vime-sbx-*"))  # no sandbox left behind


async def test_a_prompt_that_is_not_a_coding_task_is_a_clear_error(tmp_path, vllm_server, tiny_model_dir):
    prompts = tmp_path / "plain.jsonl"
    prompts.write_text('{"prompt": "hi", "label": "x"}\n')
    args = _args(tmp_path, vllm_server, tiny_model_dir, prompts)
    with pytest.raises(ConfigError, match=r"metadata lacks \['repo', 'test_command'\]"):
        await run_group(args, make_data_source(args).prompt_group(0))
