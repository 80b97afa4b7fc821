"""`vime train` refuses bad data, checkpoints and hooks before it starts any service, in one line
naming the flag, the file, the line (or Parquet row) and the key."""

from __future__ import annotations

import json

import pytest

from vime.args import parse_args
from vime.errors import ConfigError
from vime.preflight import check_checkpoint, check_prompt_data, preflight


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def model_dir(tmp_path):
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


@pytest.fixture
def prompts(tmp_path):
    return write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"q{i}", "label": str(i)} for i in range(3)])


def train_args(tmp_path, model_dir, prompt_data, *extra):
    return parse_args([
        "--hf-checkpoint", str(model_dir), "--prompt-data", str(prompt_data), "--input-key", "prompt",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "1",
        "--run-dir", str(tmp_path / "run"), *extra,
    ])


def error_of(check, args) -> str:
    with pytest.raises(ConfigError) as info:
        check(args)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_good_run_passes_every_check(tmp_path, model_dir, prompts):
    args = train_args(tmp_path, model_dir, prompts, "--label-key", "label", "--save", str(tmp_path / "ckpt"),
                      "--custom-rm-path", "examples.quickstart.reward.capitals")
    preflight(args)
    preflight(train_args(tmp_path, model_dir, f"{prompts}@[1:3]"))


# ---- prompt data -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "flags", "expected"),
    [
        ('{"prompt": "a"}\n{"prompt": \n', [], ":2: not valid JSON"),
        ("", [], ": the file has no records (the file is empty)"),
        ("\n  \n\n", [], ": the file has no records (every line is blank)"),
        ('{"prompt": "a"}\n\n{"text": "b"}\n', [],
         ":3: no key 'prompt' (the record has ['text']); set --input-key to the key that holds the prompt"),
        ('{"prompt": "a", "label": "1"}\n{"prompt": "b"}\n', ["--label-key", "label"],
         ":2: no key 'label' (the record has ['prompt']); set --label-key"),
        ('{"prompt": "a", "metadata": [1]}\n', [], ":1: 'metadata' must be an object, got list"),
        ('{"prompt": "a", "tools": {"name": "add"}}\n', [], ":1 key 'tools': tools must be a list of JSON objects"),
        ('["a"]\n', [], ":1: expected a JSON object per line, got list"),
    ],
    ids=["malformed-json", "empty-file", "blank-lines-only", "missing-input-key", "missing-label-key",
         "metadata-not-an-object", "tools-not-a-list", "line-not-an-object"],
)
def test_a_bad_prompt_file_is_named_with_its_line_and_key(tmp_path, model_dir, content, flags, expected):
    path = tmp_path / "prompts.jsonl"
    path.write_text(content)
    message = error_of(check_prompt_data, train_args(tmp_path, model_dir, path, *flags))
    assert message.startswith(f"--prompt-data {path}") or message.startswith(f"--prompt-data '{path}'")
    assert expected in message


def test_a_parquet_file_without_the_input_column_is_named_with_its_row(tmp_path, model_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "a", "label": "1"}]), path)
    message = error_of(check_prompt_data, train_args(tmp_path, model_dir, path))
    assert message.startswith(f"--prompt-data {path} row 0: no key 'prompt' (the record has ['label', 'question'])")
    assert "--input-key" in message


def test_an_empty_parquet_file_has_no_records(tmp_path, model_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist([], schema=pa.schema([("prompt", pa.string())])), path)
    assert "the file has no records (the Parquet file has no rows)" in error_of(
        check_prompt_data, train_args(tmp_path, model_dir, path))


@pytest.mark.parametrize(
    ("name", "expected"),
    [("missing.jsonl", "': no such file"), ("prompts.csv", "': unsupported file type '.csv'; use .jsonl or .parquet"),
     ("a_directory", "': is a directory")],
)
def test_a_missing_or_unsupported_prompt_file_is_named(tmp_path, model_dir, name, expected):
    (tmp_path / "prompts.csv").write_text("prompt\na\n")
    (tmp_path / "a_directory").mkdir()
    message = error_of(check_prompt_data, train_args(tmp_path, model_dir, tmp_path / name))
    assert message.startswith(f"--prompt-data '{tmp_path / name}") and expected in message


def test_only_the_first_rows_are_read(tmp_path, model_dir):
    records = [{"prompt": f"q{i}"} for i in range(150)] + [{"wrong": "key"}]
    path = write_jsonl(tmp_path / "big.jsonl", records)
    check_prompt_data(train_args(tmp_path, model_dir, path))
    check_prompt_data(train_args(tmp_path, model_dir, f"{path}@[140:]"), limit=5)
    message = error_of(check_prompt_data, train_args(tmp_path, model_dir, f"{path}@[148:]"))
    assert f"{path}:151: no key 'prompt'" in message


def test_a_slice_that_selects_nothing_says_so(tmp_path, model_dir, prompts):
    message = error_of(check_prompt_data, train_args(tmp_path, model_dir, f"{prompts}@[5:9]"))
    assert "the slice @[5:9] selects none of its records" in message


def test_eval_sets_are_checked_too(tmp_path, model_dir, prompts):
    bad = write_jsonl(tmp_path / "eval.jsonl", [{"question": "a"}])
    args = train_args(tmp_path, model_dir, prompts, "--eval-prompt-data", "aime", str(bad))
    message = error_of(check_prompt_data, args)
    assert message.startswith(f"--eval-prompt-data {bad}:1: no key 'prompt'")


def test_a_custom_data_source_reads_the_prompt_file_its_own_way(tmp_path, model_dir):
    path = tmp_path / "tasks.txt"
    path.write_text("one task per line\n")
    source = ["--data-source-path", "vime.rollout.data_source.RolloutDataSource"]
    check_prompt_data(train_args(tmp_path, model_dir, path, *source))


# ---- checkpoints -----------------------------------------------------------------------------


def test_a_missing_checkpoint_directory_is_named(tmp_path, prompts):
    missing = tmp_path / "no-model"
    message = error_of(check_checkpoint, train_args(tmp_path, missing, prompts))
    assert message == f"--hf-checkpoint '{missing}': no such directory; point it at a local HF checkpoint directory"


def test_a_hub_id_is_refused_saying_the_checkpoint_must_be_local(tmp_path, prompts):
    message = error_of(check_checkpoint, train_args(tmp_path, "Qwen/Qwen3-4B", prompts))
    assert message.startswith("--hf-checkpoint 'Qwen/Qwen3-4B': no such directory; it looks like a Hugging Face Hub id")
    assert "local directory" in message and "huggingface-cli download Qwen/Qwen3-4B" in message


def test_a_checkpoint_directory_without_config_json_is_named(tmp_path, prompts):
    empty = tmp_path / "empty"
    empty.mkdir()
    message = error_of(check_checkpoint, train_args(tmp_path, empty, prompts))
    assert message.startswith(f"--hf-checkpoint '{empty}': no config.json in this directory")


def test_a_checkpoint_that_is_a_file_is_named(tmp_path, prompts):
    message = error_of(check_checkpoint, train_args(tmp_path, prompts, prompts))
    assert message.startswith(f"--hf-checkpoint '{prompts}': not a directory")


def test_a_reference_model_is_checked_like_the_policy_when_a_kl_term_loads_it(tmp_path, model_dir, prompts):
    ref = ["--ref-load", str(tmp_path / "ref")]
    message = error_of(check_checkpoint, train_args(tmp_path, model_dir, prompts, *ref, "--use-kl-loss"))
    assert message.startswith(f"--ref-load '{tmp_path / 'ref'}': no such directory")
    check_checkpoint(train_args(tmp_path, model_dir, prompts, *ref))  # no KL term: no reference model is loaded


def test_load_may_be_missing_but_not_a_file(tmp_path, model_dir, prompts):
    check_checkpoint(train_args(tmp_path, model_dir, prompts, "--load", str(tmp_path / "new-run")))
    message = error_of(check_checkpoint, train_args(tmp_path, model_dir, prompts, "--load", str(prompts)))
    assert message.startswith(f"--load '{prompts}': not a directory")
    message = error_of(check_checkpoint, train_args(tmp_path, model_dir, prompts, "--save", str(prompts)))
    assert message.startswith(f"--save '{prompts}': not a directory"), "--load defaults to --save: name what was typed"


# ---- the whole preflight ---------------------------------------------------------------------


def test_required_flags_are_named_together(tmp_path):
    message = error_of(preflight, parse_args(["--run-dir", str(tmp_path / "run")]))
    assert message == "vime train needs --hf-checkpoint, --prompt-data, --rollout-batch-size, --num-rollout"


def test_a_hook_that_does_not_load_is_named(tmp_path, model_dir, prompts):
    args = train_args(tmp_path, model_dir, prompts, "--custom-rm-path", "no_such_pkg.rewards.score")
    message = error_of(preflight, args)
    assert message.startswith("--custom-rm-path 'no_such_pkg.rewards.score'") and "no_such_pkg" in message
