"""`vime train` refuses bad data, checkpoints and hooks before it starts any service, in one line
naming the flag, the file, the line (or Parquet row) and the key."""

from __future__ import annotations

import json

import pytest

from vime.config.args import parse_args
from vime.errors import ConfigError
from vime.config.preflight import check_checkpoint, check_prompt_data, preflight


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


def test_every_row_is_read_not_only_the_first(tmp_path, model_dir):
    """A bad row far into the file fails before anything starts, not at step 1."""
    records = [{"prompt": f"q{i}"} for i in range(150)] + [{"wrong": "key"}]
    path = write_jsonl(tmp_path / "big.jsonl", records)
    message = error_of(check_prompt_data, train_args(tmp_path, model_dir, path))
    assert message == (f"--prompt-data {path}:151: no key 'prompt' (the record has ['wrong']); "
                       "set --input-key to the key that holds the prompt")
    check_prompt_data(train_args(tmp_path, model_dir, f"{path}@[140:150]"))  # a slice is checked, not the file
    path.write_text(path.read_text() + "not json\n")
    assert "big.jsonl:151: no key 'prompt'" in error_of(check_prompt_data, train_args(tmp_path, model_dir, path)), \
        "the first bad row comes first"


def test_empty_prompts_are_counted_and_their_first_lines_named(tmp_path, model_dir):
    """An empty prompt is not an error anywhere later: generation drops it and the step trains on
    fewer samples, silently. Here it is refused, with how many there are and where."""
    empty = {2: "", 6: "   ", 8: "\n", 13: "", 20: "", 30: "", 31: "", 40: "", 41: "", 50: "", 60: "", 63: ""}
    path = write_jsonl(tmp_path / "prompts.jsonl",
                       [{"prompt": empty.get(i, f"q{i}"), "label": "1"} for i in range(64)])
    message = error_of(check_prompt_data, train_args(tmp_path, model_dir, path))
    assert message == (f"--prompt-data {path}: 12 rows have an empty 'prompt' (lines 3, 7, 9, 14, 21, ...); "
                       "remove them or fix --input-key")


@pytest.mark.parametrize("prompt", [
    [], [{"role": "user", "content": ""}], [{"role": "system", "content": "  "}, {"role": "user", "content": None}],
], ids=["no-messages", "empty-content", "blank-contents"])
def test_a_chat_prompt_without_content_is_empty_judged_before_any_template(tmp_path, model_dir, prompt):
    """With --apply-chat-template the rendered text of nothing is the template's markup, never
    empty: the raw messages are judged, and no tokenizer is loaded for it (model_dir has none)."""
    hello = [{"role": "user", "content": "hi"}]
    path = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": hello}, {"prompt": prompt}])
    for flags in ([], ["--apply-chat-template"]):
        message = error_of(check_prompt_data, train_args(tmp_path, model_dir, path, *flags))
        assert message.startswith(f"--prompt-data {path}:2: 'prompt' is empty ("), message
        assert message.endswith("; remove them or fix --input-key")
    good = [{"role": "user", "content": [{"type": "text", "text": "describe"}]}]  # content as parts
    check_prompt_data(train_args(tmp_path, model_dir, write_jsonl(path, [{"prompt": good}] * 2)))


def test_rows_with_several_problems_are_one_line_led_by_the_first(tmp_path, model_dir):
    lines = [json.dumps({"prompt": f"q{i}"}) for i in range(300)]
    for i in (10, 20, 250):
        lines[i] = json.dumps({"text": "a question"})
    lines[120] = '{"prompt": }'
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    message = error_of(check_prompt_data, train_args(tmp_path, model_dir, path))
    assert message == (f"--prompt-data {path}: 3 rows have no key 'prompt' (lines 11, 21, 251); set --input-key "
                       f"to the key that holds the prompt; 1 more row has other problems, the first: {path}:121: "
                       "not valid JSON (Expecting value at column 12); each line must be one JSON object")


def test_parquet_rows_are_all_read_and_named_by_row(tmp_path, model_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "prompts.parquet"
    rows = [{"prompt": "" if i in (1500, 2047, 2999) else f"q{i}"} for i in range(3000)]
    pq.write_table(pa.Table.from_pylist(rows), path)
    message = error_of(check_prompt_data, train_args(tmp_path, model_dir, path))
    assert message == (f"--prompt-data {path}: 3 rows have an empty 'prompt' (rows 1500, 2047, 2999); "
                       "remove them or fix --input-key")


def test_fewer_prompts_than_one_step_takes_are_refused_with_the_numbers(tmp_path, model_dir, prompts):
    message = error_of(check_prompt_data, train_args(tmp_path, model_dir, prompts, "--rollout-batch-size", "8"))
    assert message == (f"--prompt-data {prompts} has 3 prompts; one step takes --rollout-batch-size 8: "
                       "add prompts or lower it")
    message = error_of(check_prompt_data, train_args(tmp_path, model_dir, f"{prompts}@[2:]"))
    assert message == (f"--prompt-data {prompts}@[2:] has 1 prompt; one step takes --rollout-batch-size 2: "
                       "add prompts or lower it")


@pytest.mark.parametrize("shuffle", [[], ["--rollout-shuffle"]], ids=["in-order", "shuffled"])
def test_as_many_prompts_as_one_step_takes_train_over_epochs(tmp_path, model_dir, prompts, shuffle):
    """Steps go on past the end of the file (the next epoch; `--num-rollout` rules over
    `--num-epoch`), so one step's worth of prompts is enough, and each step has distinct prompts."""
    from vime.rollout.data_source import RolloutDataSource

    args = train_args(tmp_path, model_dir, prompts, "--rollout-batch-size", "3", "--num-rollout", "4", *shuffle)
    check_prompt_data(args)
    source = RolloutDataSource(args)
    for _ in range(args.num_rollout):
        step = [group[0].prompt for group in source.get_samples(args.rollout_batch_size)]
        assert sorted(step) == ["q0", "q1", "q2"]


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
