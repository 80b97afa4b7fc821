"""The environment SDK serves eval rounds without an environment's own code: given the group's
input, `prompt_group`/`prompt_sample` give an eval group its eval set's prompts under eval rollout
ids, `sampling_params` the eval settings, `store_group`/`store_rollout` store them as the round's
eval samples (never trained, each once), and every sample is checked to come from exactly the
round's policy version (training: from none older than the group's). The seed's signatures,
a plain position, still name a training prompt. No servers: a SQLite store and the flags."""

from __future__ import annotations

import json

import pytest

from vime.config.args import parse_args
from vime.envs import (GroupInput, SampleInput, TurnLog, check_policy, group_args, prompt_file, prompt_group,
                       prompt_sample, sampling_params, store_group, store_rollout, stored_group)
from vime.rollout.policy_check import StalePolicyError
from vime.store import SampleStore
from vime.types import Sample


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture
def args(tmp_path, tiny_model_dir):
    train = write_jsonl(tmp_path / "train.jsonl", [{"input": f"train {i}", "label": "t"} for i in range(4)])
    (tmp_path / "sets").mkdir()
    held = write_jsonl(tmp_path / "sets" / "held.jsonl", [{"input": f"held {i}", "label": "h"} for i in range(3)])
    return parse_args(["--hf-checkpoint", str(tiny_model_dir), "--run-dir", str(tmp_path / "run"),
                       "--prompt-data", train, "--n-samples-per-prompt", "2",
                       "--eval-prompt-data", "held", held, "--n-samples-per-eval-prompt", "3",
                       "--rollout-temperature", "1.0", "--eval-temperature", "0.25"])


@pytest.fixture
def store(tmp_path):
    with SampleStore.open(tmp_path / "run") as s:
        s.ensure_run("r")
        yield s


def eval_group(position: int = 1, version: int = 2) -> GroupInput:
    return GroupInput("r", 4, position, version, evaluation=True, eval_set="held", n_samples_per_prompt=3)


def sampled(sample: Sample, version: str | int, reward: float = 1.0) -> Sample:
    sample.response, sample.response_length, sample.reward = "x", 1, reward
    sample.tokens = [1, 2]
    sample.weight_versions = [{"version": str(version), "start": 0, "end": 1}]
    return sample


async def test_an_eval_group_gets_its_eval_prompts_under_eval_ids_and_a_position_still_names_training(args, tmp_path):
    group = await prompt_group(args, eval_group())
    assert [(s.prompt, s.index, s.group_index, s.rollout_id) for s in group] == \
        [("held 1", 3, 1, "eval4-held-3"), ("held 1", 4, 1, "eval4-held-4"), ("held 1", 5, 1, "eval4-held-5")]
    one = SampleInput.of(eval_group(), 2)
    assert (one.evaluation, one.eval_set) == (True, "held")
    assert (await prompt_group(args, one))[2].rollout_id == "eval4-held-5"
    assert prompt_file(args, one) == str(tmp_path / "sets" / "held.jsonl")  # a task's relative paths start there

    training = await prompt_group(args, 1)  # the seed's signature: a training prompt's position
    assert [(s.prompt, s.rollout_id) for s in training] == [("train 1", "2"), ("train 1", "3")]
    assert [s.rollout_id for s in await prompt_group(args, GroupInput("r", 4, 1, 2))] == ["2", "3"]
    assert prompt_file(args, 1) == args.prompt_data


async def test_prompt_sample_keeps_the_seeds_signature_and_takes_a_samples_input(args):
    assert (await prompt_sample(args, 1, 1)).prompt == "train 1"
    sample = await prompt_sample(args, SampleInput.of(eval_group(), 1))
    assert (sample.prompt, sample.rollout_id) == ("held 1", "eval4-held-4")


async def test_an_eval_group_samples_with_the_eval_settings(args):
    group = await prompt_group(args, eval_group())
    assert sampling_params(args, eval_group(), group[0])["temperature"] == 0.25
    assert sampling_params(args, GroupInput("r", 4, 1, 2), group[0])["temperature"] == 1.0


async def test_an_eval_group_is_stored_as_its_rounds_eval_samples_once_and_never_with_training(args, store):
    inp = eval_group()
    group = [sampled(s, 2) for s in await prompt_group(args, inp)]
    out = await store_group(store, inp, {s.rollout_id: [s] for s in group})
    assert out.rollout_ids == ["eval4-held-3", "eval4-held-4", "eval4-held-5"] and out.samples == 3
    again = await stored_group(store, inp, out.rollout_ids)  # a retried activity answers from the store
    assert again is not None and again.rollout_ids == out.rollout_ids
    await store_group(store, inp, {s.rollout_id: [s] for s in group})  # stored once, whatever the retries
    evals = [s for _, s in store.iter_samples("r", evaluation=True, eval_step=4)]
    assert len(evals) == 3 and store.count_samples("r") == 0  # apart from the training samples
    assert all(s.metadata["weight_version"] == 2 and s.metadata["eval_set"] == "held" for s in evals)


async def test_a_fanned_out_eval_rollout_is_stored_once_with_every_sibling_tagged(args, store):
    where = SampleInput.of(eval_group(), 0)
    base = (await prompt_group(args, where))[0]
    siblings = [sampled(Sample(group_index=base.group_index, index=base.index, prompt=f"role {i}"), 2)
                for i in range(3)]  # a team's roles: fresh samples, no eval metadata of their own
    refs = await store_rollout(store, where, base.rollout_id, siblings)
    assert [r.key for r in refs] == [f"eval4-held-3/{i}" for i in range(3)]
    stored = [s for _, s in store.iter_samples("r", evaluation=True, eval_step=4)]
    assert [s.metadata["eval_set"] for s in stored] == ["held"] * 3 and store.count_samples("r") == 0


async def test_an_eval_sample_must_come_from_exactly_the_rounds_version_a_training_one_from_none_older(args, store):
    inp = eval_group(version=2)
    newer, older, base = (sampled(Sample(), v) for v in (3, 1, "default"))
    with pytest.raises(StalePolicyError, match="sampled by policy version 3, the round evaluates version 2"):
        check_policy([newer], inp, "group 1")
    with pytest.raises(StalePolicyError):
        check_policy([older], inp, "group 1")
    training = GroupInput("r", 4, 1, 2)
    check_policy([newer], training, "group 1")  # the servers moved on: fine for training
    with pytest.raises(StalePolicyError):
        check_policy([base], training, "group 1")  # a restarted server on the base weights
    group = await prompt_group(args, inp)
    with pytest.raises(StalePolicyError):
        await store_group(store, inp, {group[0].rollout_id: [sampled(group[0], 3)]})
    assert store.count_samples("r", evaluation=True) == 0  # nothing stored: the retry samples again


async def test_a_turn_from_other_weights_is_not_stored_so_the_retry_samples_it_again(store):
    inp = SampleInput.of(eval_group(version=2), 0)
    log = TurnLog(store, "r", "eval4-held-3", inp)
    meta = {"text": "a", "weight_versions": [{"version": "2"}]}
    await log.append(0, [1], [1], [-0.1], meta)
    with pytest.raises(StalePolicyError):
        await log.append(1, [2], [1], [-0.1], {**meta, "weight_versions": [{"version": "3"}]})
    assert [t.turn for t in await log.read()] == [0]
    await TurnLog(store, "r", "7").append(0, [1], [1], [-0.1], {"weight_versions": [{"version": "0"}]})  # unchecked


def test_an_environment_that_ignores_evaluation_stops_the_round_in_one_line_naming_the_fix():
    from temporalio.exceptions import ApplicationError

    from vime.envs import GroupOutput
    from workflows.eval_round import check_eval_ids

    check_eval_ids(GroupOutput(1, ["eval4-held-3", "eval4-held-4"]), "MyGroupWorkflow", 4, "held")
    with pytest.raises(ApplicationError) as info:  # a training prompt's plain ids: eval samples into training
        check_eval_ids(GroupOutput(1, ["2", "3"]), "MyGroupWorkflow", 4, "held")
    message = str(info.value)
    assert "MyGroupWorkflow stored rollout id(s) 2, 3" in message and "vime.envs.prompt_group(args, inp)" in message
    assert info.value.non_retryable and "\n" not in message


def test_vime_eval_of_the_coding_agent_is_a_new_eval_run_when_an_agent_flag_changes(tmp_path, tiny_model_dir,
                                                                                  monkeypatch):
    from examples.coding_agent_rl.gold_edits import write_prompts
    from examples.coding_agent_rl.tasks.prepare import load_tasks
    from vime.launcher.eval_command import parse_eval_command

    monkeypatch.chdir(tmp_path)
    heldout = write_prompts(load_tasks()[4:6], tmp_path / "heldout.jsonl")
    argv = ["--hf-checkpoint", str(tiny_model_dir), "--rollout-env", "coding_agent", "--input-key", "prompt",
            "--eval-prompt-data", "heldout", str(heldout), "--agent-max-turns", "4"]
    first, again = parse_eval_command(argv), parse_eval_command(argv)
    assert first.args.run_id == again.args.run_id  # the same command resumes the same eval run
    assert parse_eval_command([*argv, "--agent-max-turns", "8"]).args.run_id != first.args.run_id


async def test_an_eval_config_sets_own_sampling_reaches_the_environment_through_the_sdk(tmp_path, tiny_model_dir):
    train = write_jsonl(tmp_path / "train.jsonl", [{"input": "train 0", "label": "t"}])
    held = write_jsonl(tmp_path / "held.jsonl", [{"input": "held 0", "label": "h"}])
    (tmp_path / "eval.yaml").write_text(
        f"eval:\n  datasets:\n    - name: held\n      path: {held}\n      temperature: 0.5\n"
        "      n_samples_per_eval_prompt: 2\n")
    args = parse_args(["--hf-checkpoint", str(tiny_model_dir), "--run-dir", str(tmp_path / "run"),
                       "--prompt-data", train, "--eval-config", str(tmp_path / "eval.yaml"),
                       "--eval-temperature", "0.25"])
    inp = GroupInput("r", 0, 0, 0, evaluation=True, eval_set="held", n_samples_per_prompt=2)
    group = await prompt_group(args, inp)
    assert [s.rollout_id for s in group] == ["eval0-held-0", "eval0-held-1"]  # the set's own samples per prompt
    assert sampling_params(args, inp, group[0])["temperature"] == 0.5  # the set's, over --eval-temperature
    assert group_args(args, inp).eval_temperature == 0.5 and group_args(args, 0) is args
