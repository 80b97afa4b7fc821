"""`--eval-config FILE` without servers: slime's eval config read (YAML and JSON, a list or a
mapping of datasets, defaults under each), every problem of a bad file one line naming the file
and the key path, each set's own settings reaching its samples, sampling, generate and reward,
the content (not the path) travelling with the run and naming `vime eval`'s run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_eval import make_args, write_jsonl
from vime.config.args import parse_args
from vime.config.eval_config import DATASET_KEYS, SETTINGS, replaced_sets_note
from vime.config.preflight import check_prompt_data
from vime.errors import ConfigError
from vime.launcher.eval_command import EVAL_SET_FLAGS, eval_run_id, without_flags
from vime.rollout.eval_data import SET_FLAGS, eval_prompt_group, eval_set_args, eval_sets
from vime.rollout.sampling import sampling_params_from_args
from vime.temporal.eval_contract import EvalCheckpoint

CONFIG = """
eval:
  defaults:
    max_response_len: 16
    top_p: 0.7
    rm_type: exact_match
  datasets:
    - name: aime
      path: {aime}
      input_key: q
      label_key: a
      n_samples_per_eval_prompt: 4
      metadata_overrides: {{split: test}}
    - name: gpqa
      path: {gpqa}
      custom_rm_path: tests.test_eval_config.one
      custom_generate_function_path: tests.test_eval_config.one
      n_samples_per_eval_prompt: 2
      temperature: 0
      top_k: 5
      max_response_len: 4
      stop: ["\\n"]
      stop_token_ids: [7]
      skip_special_tokens: true
"""


def one(args, sample):
    return 1.0


@pytest.fixture
def sets(tmp_path):
    aime = write_jsonl(tmp_path / "aime.jsonl", [{"q": f"aime {i}", "a": str(i)} for i in range(3)])
    gpqa = write_jsonl(tmp_path / "gpqa.jsonl", [{"input": f"gpqa {i}", "metadata": {"rm_type": "f1"}}
                                                 for i in range(2)])
    return aime, gpqa


@pytest.fixture
def config(tmp_path, sets):
    path = tmp_path / "eval.yaml"
    path.write_text(CONFIG.format(aime=sets[0], gpqa=sets[1]))
    return path


def config_args(tmp_path, config, *extra):
    return make_args(tmp_path, "--eval-config", str(config), "--rm-type", "f1", "--eval-temperature", "0.5", *extra)


# ---- reading -----------------------------------------------------------------------------------


def test_an_eval_config_lists_slimes_datasets_each_taking_the_defaults_it_does_not_set(tmp_path, config, sets):
    args = config_args(tmp_path, config)
    assert eval_sets(args) == [("aime", str(sets[0])), ("gpqa", str(sets[1]))]
    aime, gpqa = args.eval_config_data["datasets"]
    assert aime == {"name": "aime", "path": str(sets[0]), "input_key": "q", "label_key": "a",
                    "n_samples_per_eval_prompt": 4, "metadata_overrides": {"split": "test"},
                    "max_response_len": 16, "top_p": 0.7, "rm_type": "exact_match"}
    # a dataset that names its own reward takes none of the defaults' (rm_type here)
    assert "rm_type" not in gpqa and gpqa["max_response_len"] == 4 and gpqa["top_p"] == 0.7
    assert args.eval_config_data["key_paths"] == ["eval.datasets[0]", "eval.datasets[1]"]


def test_json_and_a_mapping_of_name_to_settings_read_as_the_same_sets(tmp_path, sets):
    as_json = tmp_path / "eval.json"
    as_json.write_text(json.dumps({"datasets": {"aime": {"path": str(sets[0]), "input_key": "q"},
                                                "gpqa": {"path": str(sets[1])}},
                                   "defaults": {"n_samples_per_eval_prompt": 2}}))
    args = make_args(tmp_path, "--eval-config", str(as_json), "--rm-type", "f1")
    assert [d["name"] for d in args.eval_config_data["datasets"]] == ["aime", "gpqa"]
    assert all(d["n_samples_per_eval_prompt"] == 2 for d in args.eval_config_data["datasets"])
    assert args.eval_config_data["key_paths"] == ["datasets.aime", "datasets.gpqa"]


def test_the_setting_keys_are_the_flags_a_set_may_override():
    assert set(SETTINGS) == set(SET_FLAGS) | {"metadata_overrides"}
    assert DATASET_KEYS[:2] == ("name", "path")


BAD = [
    ("", "eval.yaml: the file is empty"),
    ("- a\n", "eval.yaml: expected a mapping at the top (`eval:` or `datasets:`), got list"),
    ("eval: {datasets: [{name: a, path: a.jsonl}]}\nextra: 1\n", "eval.yaml: extra: unknown key; allowed: eval"),
    ("eval: [1]\n", "eval.yaml: eval: must be a mapping with `datasets`"),
    ("eval: {datasets: [{name: a, path: a.jsonl}], default: {}}\n",
     "eval.yaml: eval.default: unknown key; allowed: defaults, datasets"),
    ("defaults: 3\ndatasets: [{name: a, path: a.jsonl}]\n",
     "eval.yaml: defaults: must be a mapping of dataset settings"),
    ("defaults: {stopp: x}\ndatasets: [{name: a, path: a.jsonl}]\n",
     "eval.yaml: defaults.stopp: unknown key; allowed: input_key, label_key"),
    ("defaults: {repetition_penalty: 1.1}\ndatasets: [{name: a, path: a.jsonl}]\n",
     "eval.yaml: defaults.repetition_penalty: a key of slime's eval config that vime does not take yet; allowed: "),
    ("defaults: {top_p: 0.5}\n", "eval.yaml: datasets: is missing: list the eval sets"),
    ("datasets: a.jsonl\n",
     "eval.yaml: datasets: must be a list of datasets (or a mapping of name to settings), got str"),
    ("datasets: []\n", "eval.yaml: datasets: is empty: list at least one eval set"),
    ("datasets: [a.jsonl]\n", "eval.yaml: datasets[0]: must be a mapping with a name and a path, got str"),
    ("datasets: [{name: a, path: a.jsonl, prompt_key: q}]\n",
     "eval.yaml: datasets[0].prompt_key: unknown key; allowed: name, path, input_key"),
    ("datasets: [{name: a, path: a.jsonl, rollout_env: tool_use}]\n",
     "eval.yaml: datasets[0].rollout_env: a set evaluated through its own --rollout-env is not supported yet"),
    ("datasets: [{path: a.jsonl}]\n", "eval.yaml: datasets[0].name: is missing"),
    ("datasets: [{name: a/b, path: a.jsonl}]\n", "eval.yaml: datasets[0].name: 'a/b' must be letters, digits"),
    ("datasets: [{name: a, path: a.jsonl}, {name: a, path: b.jsonl}]\n",
     "eval.yaml: datasets[1].name: 'a' is also datasets[0]'s name; each set needs its own"),
    ("datasets: {a: {name: b, path: a.jsonl}}\n", "eval.yaml: datasets.a.name: is 'b', but the entry is keyed 'a'"),
    ("datasets: [{name: a}]\n", "eval.yaml: datasets[0].path: is missing: the set's .jsonl or .parquet file"),
    ("datasets: [{name: a, path: 3}]\n", "eval.yaml: datasets[0].path: must be a non-empty string, got 3"),
    ("datasets: [{name: a, path: a.jsonl, input_key: 3}]\n",
     "eval.yaml: datasets[0].input_key: must be a non-empty string, got 3"),
    ("datasets: [{name: a, path: a.jsonl, apply_chat_template: yes please}]\n",
     "eval.yaml: datasets[0].apply_chat_template: must be true or false, got 'yes please'"),
    ("datasets: [{name: a, path: a.jsonl, apply_chat_template_kwargs: [1]}]\n",
     "eval.yaml: datasets[0].apply_chat_template_kwargs: must be a mapping, got [1]"),
    ("datasets: [{name: a, path: a.jsonl, n_samples_per_eval_prompt: 0}]\n",
     "eval.yaml: datasets[0].n_samples_per_eval_prompt: must be a positive integer, got 0"),
    ("datasets: [{name: a, path: a.jsonl, n_samples_per_eval_prompt: true}]\n",
     "eval.yaml: datasets[0].n_samples_per_eval_prompt: must be a positive integer, got True"),
    ("datasets: [{name: a, path: a.jsonl, temperature: -1}]\n",
     "eval.yaml: datasets[0].temperature: must be a number >= 0 (0: greedy), got -1"),
    ("datasets: [{name: a, path: a.jsonl, top_p: 0}]\n",
     "eval.yaml: datasets[0].top_p: must be a number in (0, 1], got 0"),
    ("datasets: [{name: a, path: a.jsonl, top_k: 0}]\n",
     "eval.yaml: datasets[0].top_k: must be an integer, -1 (off) or >= 1, got 0"),
    ("datasets: [{name: a, path: a.jsonl, max_response_len: 1.5}]\n",
     "eval.yaml: datasets[0].max_response_len: must be a positive integer, got 1.5"),
    ("datasets: [{name: a, path: a.jsonl, custom_rm_path: rewards}]\n",
     "eval.yaml: datasets[0].custom_rm_path: 'rewards' is not a dotted path to a function"),
    ("datasets: [{name: a, path: a.jsonl, custom_generate_function_path: 1}]\n",
     "eval.yaml: datasets[0].custom_generate_function_path: must be a dotted path to a function"),
    ("datasets: [{name: a, path: a.jsonl, rm_type: math, custom_rm_path: m.rm}]\n",
     "eval.yaml: datasets[0]: give one reward: rm_type (a built-in) or custom_rm_path (a function), not both"),
    ("datasets: [{name: a, path: a.jsonl, rm_type: math, group_rm: true}]\n",
     "eval.yaml: datasets[0].group_rm: batches the set's own custom_rm_path, which is not set for it"),
    ("datasets: [{name: a, path: a.jsonl, stop: x}]\n",
     "eval.yaml: datasets[0].stop: must be a list of non-empty strings, got 'x'"),
    ("datasets: [{name: a, path: a.jsonl, stop_token_ids: [-1]}]\n",
     "eval.yaml: datasets[0].stop_token_ids: must be a list of token ids (integers >= 0), got [-1]"),
    ("datasets: [{name: a, path: a.jsonl, skip_special_tokens: 1}]\n",
     "eval.yaml: datasets[0].skip_special_tokens: must be true or false, got 1"),
    ("datasets: [{name: a, path: a.jsonl, metadata_overrides: 3}]\n",
     "eval.yaml: datasets[0].metadata_overrides: must be a mapping, got 3"),
    ("datasets: [{name: a, path: a.jsonl\n", "--eval-config 'eval.yaml': not valid YAML (line 2, column 1:"),
]


@pytest.mark.parametrize("content, line", BAD)
def test_each_problem_of_an_eval_config_is_one_line_naming_the_file_and_the_key_path(tmp_path, monkeypatch,
                                                                                      content, line):
    monkeypatch.chdir(tmp_path)
    Path("eval.yaml").write_text(content)
    with pytest.raises(ConfigError) as info:
        parse_args(["--eval-config", "eval.yaml"])
    assert str(info.value).splitlines()[0].startswith(line), str(info.value)


def test_every_problem_of_the_file_is_reported_at_once_one_line_each(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("eval.yaml").write_text("eval:\n  defaults: {top_p: 2}\n  datasets:\n    - {name: a, path: a.jsonl, top_k: 0}\n"
                                 "    - {name: a, n_samples_per_eval_prompt: -1}\n")
    with pytest.raises(ConfigError) as info:
        parse_args(["--eval-config", "eval.yaml"])
    assert str(info.value).splitlines() == [
        "eval.yaml: eval.defaults.top_p: must be a number in (0, 1], got 2",
        "eval.yaml: eval.datasets[0].top_k: must be an integer, -1 (off) or >= 1, got 0",
        "eval.yaml: eval.datasets[1].name: 'a' is also eval.datasets[0]'s name; each set needs its own",
        "eval.yaml: eval.datasets[1].path: is missing: the set's .jsonl or .parquet file",
        "eval.yaml: eval.datasets[1].n_samples_per_eval_prompt: must be a positive integer, got -1",
    ]


@pytest.mark.parametrize("name, content, line", [
    ("gone.yaml", None, "--eval-config 'gone.yaml': cannot read it (No such file or directory)"),
    ("eval.json", '{"datasets": [}', "--eval-config 'eval.json': not valid JSON (line 1, column 15"),
])
def test_a_file_that_cannot_be_read_is_one_line(tmp_path, monkeypatch, name, content, line):
    monkeypatch.chdir(tmp_path)
    if content is not None:
        Path(name).write_text(content)
    with pytest.raises(ConfigError) as info:
        parse_args(["--eval-config", name])
    assert str(info.value).startswith(line) and "\n" not in str(info.value)


def test_eval_interval_is_satisfied_by_an_eval_config(tmp_path, config):
    assert config_args(tmp_path, config, "--eval-interval", "2").eval_interval == 2
    with pytest.raises(ConfigError, match=r"--eval-interval needs --eval-prompt-data \(name path pairs\) or "
                                          r"--eval-config FILE"):
        make_args(tmp_path, "--eval-interval", "2")


# ---- before start: each set's own files, rewards and hooks -------------------------------------


def test_each_sets_file_is_checked_with_its_own_keys_before_start(tmp_path, config, sets):
    write_jsonl(tmp_path / "p.jsonl", [{"input": "x"}] * 2)
    args = config_args(tmp_path, config, "--prompt-data", str(tmp_path / "p.jsonl"))
    check_prompt_data(args)  # aime read with q/a, gpqa with the training keys: both fine
    write_jsonl(sets[0], [{"input": "x", "a": "1"}])  # aime's records lack its input_key q
    with pytest.raises(ConfigError) as info:
        check_prompt_data(args)
    assert str(info.value).startswith(f"{config}: eval.datasets[0].path {sets[0]}:1: no key 'q'")
    assert str(info.value).endswith(f"set the set's input_key ({config}: eval.datasets[0]) to the key that holds "
                                    "the prompt")  # not --input-key: that would change the training data


def test_an_eval_prompt_data_file_without_its_key_names_the_eval_key_flag(tmp_path):
    write_jsonl(tmp_path / "p.jsonl", [{"input": "x"}] * 2)
    write_jsonl(tmp_path / "h.jsonl", [{"question": "x"}] * 2)
    args = make_args(tmp_path, "--prompt-data", str(tmp_path / "p.jsonl"),
                     "--eval-prompt-data", "heldout", str(tmp_path / "h.jsonl"))
    with pytest.raises(ConfigError) as info:
        check_prompt_data(args)
    assert str(info.value).endswith("set --eval-input-key to the key that holds the prompt")


@pytest.mark.parametrize("setting, line", [
    ("rm_type: mathh", "eval.datasets[0].rm_type: 'mathh' is not a built-in reward; use one of exact_match, f1"),
    ("rm_type: remote_rm", "eval.datasets[0].rm_type: remote_rm needs --rm-url"),
    ("custom_rm_path: tests.test_eval_config.nothing",
     "eval.datasets[0].custom_rm_path 'tests.test_eval_config.nothing': module 'tests.test_eval_config' has no "
     "attribute 'nothing'"),
    ("custom_generate_function_path: no_such_module_x.gen",
     "eval.datasets[0].custom_generate_function_path 'no_such_module_x.gen': cannot import module"),
])
def test_a_sets_own_reward_and_generate_function_are_checked_before_start(tmp_path, sets, setting, line):
    path = tmp_path / "eval.yaml"
    path.write_text(f"eval:\n  datasets:\n    - {{name: a, path: {sets[1]}, {setting}}}\n")
    write_jsonl(tmp_path / "p.jsonl", [{"input": "x"}] * 2)
    args = make_args(tmp_path, "--eval-config", str(path), "--prompt-data", str(tmp_path / "p.jsonl"))
    with pytest.raises(ConfigError) as info:
        check_prompt_data(args)
    assert str(info.value).startswith(f"{path}: {line}"), str(info.value)


# ---- a set's settings reach its samples ---------------------------------------------------------


def test_each_sets_samples_sampling_generate_and_reward_are_its_own(tmp_path, config):
    args = config_args(tmp_path, config)
    aime = eval_prompt_group(args, "aime", 1)
    assert [(s.prompt, s.label, s.index) for s in aime] == [("aime 1", "1", 4 + k) for k in range(4)]
    assert aime[0].metadata == {"split": "test", "rm_type": "exact_match", "eval_set": "aime"}
    gpqa = eval_prompt_group(args, "gpqa", 1)
    assert [s.index for s in gpqa] == [2, 3] and gpqa[0].metadata == {"rm_type": "f1", "eval_set": "gpqa"}

    aime_args, gpqa_args = eval_set_args(args, "aime"), eval_set_args(args, "gpqa")
    p = sampling_params_from_args(aime_args, evaluation=True)
    assert (p["temperature"], p["top_p"], p["top_k"], p["max_tokens"]) == (0.5, 0.7, -1, 16)  # flag, defaults
    assert "stop" not in p and not p["skip_special_tokens"]
    p = sampling_params_from_args(gpqa_args, evaluation=True)
    assert (p["temperature"], p["top_p"], p["top_k"], p["max_tokens"]) == (0.0, 0.7, 5, 4)
    assert (p["stop"], p["stop_token_ids"], p["skip_special_tokens"]) == (["\n"], [7], True)
    assert (aime_args.rm_type, aime_args.custom_rm_path) == ("exact_match", None)
    assert (gpqa_args.rm_type, gpqa_args.custom_rm_path) == (None, "tests.test_eval_config.one")
    assert gpqa_args.custom_generate_function_path == "tests.test_eval_config.one"
    assert aime_args.custom_generate_function_path is None and args.rm_type == "f1"  # the run's own is untouched
    assert eval_set_args(args, "gpqa") is gpqa_args  # one view per set and config, reused


def test_without_an_eval_config_a_set_is_evaluated_with_the_flags(tmp_path, sets):
    args = make_args(tmp_path, "--eval-prompt-data", "aime", str(sets[0]), "--eval-input-key", "q")
    assert eval_set_args(args, "aime") is args


# ---- the content travels with the run ----------------------------------------------------------


def test_the_content_read_at_launch_is_what_the_runs_flags_carry_not_the_file(tmp_path, config, sets):
    args = config_args(tmp_path, config)
    recorded = json.loads(args.argv[args.argv.index("--eval-config-data") + 1])
    assert recorded == args.eval_config_data and recorded["source"] == str(config)
    config.write_text("datasets: [{name: other, path: x.jsonl}]\n")  # edited after the launch read it
    worker = parse_args(args.argv)  # a worker, a Temporal restart of the workflow, `vime eval RUN`
    assert worker.eval_config_data == args.eval_config_data and [n for n, _ in eval_sets(worker)] == ["aime", "gpqa"]
    assert worker.argv.count("--eval-config-data") == 1
    config.unlink()
    assert parse_args(args.argv).eval_config_data == args.eval_config_data  # gone: nothing reads it


def test_a_long_lived_worker_reads_the_runs_recorded_content_by_run_id(tmp_path, config, sets):
    from vime.config.run_args import RunArgs

    args = config_args(tmp_path, config)
    config.unlink()
    worker = RunArgs(make_args(tmp_path / "worker"), {args.run_id: args.argv}.get)  # connections only
    assert [n for n, _ in eval_sets(worker.args(args.run_id))] == ["aime", "gpqa"]
    assert eval_set_args(worker.args(args.run_id), "aime").n_samples_per_eval_prompt == 4


def test_a_new_launch_reads_the_file_again(tmp_path, config, sets):
    args = config_args(tmp_path, config)
    config.write_text(f"datasets: [{{name: other, path: {sets[0]}}}]\n")
    again = config_args(tmp_path, config)
    assert [n for n, _ in eval_sets(again)] == ["other"]


def test_recorded_content_for_another_file_is_not_used(tmp_path, config, sets):
    args = config_args(tmp_path, config)
    other = tmp_path / "other.yaml"
    other.write_text(f"datasets: [{{name: other, path: {sets[0]}}}]\n")
    laid_over = parse_args([*args.argv, "--eval-config", str(other)])  # `vime eval RUN --eval-config other.yaml`
    assert [n for n, _ in eval_sets(laid_over)] == ["other"]
    assert json.loads(laid_over.argv[len(laid_over.argv) - laid_over.argv[::-1].index("--eval-config-data")]) \
        == laid_over.eval_config_data


def test_eval_config_data_is_vimes_record_not_a_flag_to_give_alone(tmp_path):
    with pytest.raises(ConfigError, match="--eval-config-data is vime's record of an --eval-config file's content; "
                                          "pass --eval-config FILE instead"):
        make_args(tmp_path, "--eval-config-data", '{"source": "x", "datasets": []}')


def test_as_in_slime_an_eval_config_replaces_eval_prompt_data_and_the_launch_says_so(tmp_path, config, sets):
    args = config_args(tmp_path, config, "--eval-prompt-data", "old", str(sets[0]))
    assert [n for n, _ in eval_sets(args)] == ["aime", "gpqa"]
    assert replaced_sets_note(args) == (f"--eval-config {config} replaces --eval-prompt-data, as in slime: the eval "
                                        "sets are aime, gpqa")
    assert replaced_sets_note(config_args(tmp_path, config)) is None


def test_sets_given_to_vime_eval_replace_the_runs_whichever_flag_named_them():
    stored = ["--hf-checkpoint", "m", "--eval-config", "e.yaml", "--eval-config-data", "{}", "--eval-prompt-data",
              "a", "a.jsonl", "--rm-type", "f1"]
    assert without_flags(stored, EVAL_SET_FLAGS) == ["--hf-checkpoint", "m", "--rm-type", "f1"]


def test_vime_evals_run_id_follows_the_configs_content_not_its_path(tmp_path, config, sets):
    (tmp_path / "m").mkdir()
    checkpoints = [EvalCheckpoint(0, "m", None, 0)]

    def run_id(path):
        return eval_run_id("m", config_args(tmp_path, path, "--hf-checkpoint", str(tmp_path / "m")), checkpoints)

    first = run_id(config)
    moved = tmp_path / "moved.yaml"
    moved.write_text(config.read_text())
    assert run_id(moved) == first  # the same content elsewhere: the same eval run
    config.write_text(config.read_text().replace("n_samples_per_eval_prompt: 4", "n_samples_per_eval_prompt: 8"))
    assert run_id(config) != first  # edited: a new eval run
