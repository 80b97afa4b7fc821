"""An environment from outside vime in 40 lines (`tests/envs/unit_tests.py`): single-turn, its
reward runs the model's code against the prompt's unit tests in a bubblewrap sandbox, and a run
trains on it through `--rollout-env` with no reward flag at all. Also the pieces it stands on:
`run_program`'s outcomes and an environment's own reward in `run_group`'s scoring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import engine_flags
from tests.envs.unit_tests import reward
from tests.runs import TrainRun
from vime.config.args import VimeArgs
from vime.envs import load_environment, workflow_classes
from vime.rollout.group import score_rollouts
from vime.sandbox import OUTCOMES, run_program
from vime.store import SampleStore
from vime.types import Sample

ENV_FILE = Path(__file__).parent / "envs" / "unit_tests.py"
TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"


def test_the_environment_fits_in_40_lines_and_declares_its_workflow():
    assert len(ENV_FILE.read_text().splitlines()) <= 40
    env = load_environment("tests.envs.unit_tests")
    assert [c.__name__ for c in workflow_classes(env)] == ["UnitTestGroupWorkflow"]


@pytest.mark.parametrize("code, outcome, reason", [
    ("def add(a, b):\n    return a + b\n", "passed", "exit 0"),
    ("def add(a, b):\n    return a - b\n", "failed", "AssertionError"),
    ("def add(a, b) return a\n", "error", "SyntaxError"),
    ("def add(a, b):\n    return undefined\n", "error", "NameError"),
    ("while True:\n    pass\n", "timeout", "timed out after 2 s"),
])
async def test_run_program_says_passed_failed_error_or_timeout_with_the_reason(code, outcome, reason):
    result = await run_program(code + "\n" + TESTS, timeout=2)
    assert result.outcome in OUTCOMES
    assert (result.outcome, result.passed) == (outcome, outcome == "passed"), result
    assert reason in result.reason and result.grade() == {"outcome": outcome, "reason": result.reason}


async def test_run_program_takes_files_and_commands():
    result = await run_program("from solution import add\n" + TESTS, files={"solution.py": "add = lambda a, b: a + b\n"})
    assert result.passed, result
    assert (await run_program(["/bin/sh", "-c", "exit 3"])).outcome == "failed"


async def test_the_environments_reward_grades_the_last_code_block_and_records_why():
    good = Sample(response="Here:\n```python\ndef add(a, b):\n    return a + b\n```", label=TESTS)
    bad = Sample(response="```python\ndef add(a, b):\n    return a * b\n```", label=TESTS)
    assert await reward(None, good) == 1.0 and good.metadata["grade"]["outcome"] == "passed"
    assert await reward(None, bad) == 0.0 and bad.metadata["grade"]["outcome"] == "failed"


async def test_an_environments_own_reward_needs_no_reward_flag():
    args = VimeArgs()  # no --rm-type, --rm-url, --custom-rm-path
    rollouts = [[Sample(index=0, response="x", status=Sample.Status.COMPLETED)]]
    await score_rollouts(args, rollouts, reward=lambda args, sample: 0.75)
    assert rollouts[0][0].reward == 0.75


async def test_an_environments_reward_that_raises_fails_its_sample_by_name():
    def broken(args, sample):
        raise ValueError("no tests in the label")

    rollouts = [[Sample(index=0, response="x", status=Sample.Status.COMPLETED)]]
    await score_rollouts(VimeArgs(), rollouts, reward=broken)
    sample = rollouts[0][0]
    assert sample.status == Sample.Status.FAILED and sample.reward is None
    assert "environment reward" in sample.metadata["hook_failure"] and "no tests in the label" in sample.metadata[
        "hook_failure"]


@pytest.mark.vllm
def test_a_run_trains_on_the_unit_test_environment_without_a_reward_flag(training_server, tiny_model_dir, tmp_path):
    run = TrainRun(tmp_path, tiny_model_dir, *engine_flags(training_server), "--rollout-env", "tests.envs.unit_tests",
                   steps=2, groups=2, n=2)
    i = run.argv.index("--rm-type")
    del run.argv[i:i + 2]  # the environment scores its own samples
    (tmp_path / "prompts.jsonl").write_text("".join(
        json.dumps({"prompt": f"Write add(a, b) in Python ({i}).", "label": TESTS}) + "\n" for i in range(8)))
    assert run.run_to_end() == 0, run.tail()
    run.assert_trained_exactly_once()
    with SampleStore.open(run.run_dir) as store:
        samples = [s for _, s in store.iter_samples(run.run_id)]
    assert samples and all(s.metadata["env"] == "unit_test_group" and s.reward in (0.0, 1.0) for s in samples)
    assert all(s.metadata["grade"]["outcome"] in OUTCOMES and s.metadata["grade"]["reason"] for s in samples)
