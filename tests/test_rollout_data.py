"""Prompt data: files to samples, positions to prompt groups, the data source's checkpoint state."""

from __future__ import annotations

import itertools
import json
import textwrap

import pytest

from vime.config.args import parse_args
from vime.errors import ConfigError
from vime.rollout.data_source import PromptDataset, RolloutDataSource, make_data_source
from vime.rollout.sampling import params_for_sample, sampling_params_from_args
from vime.types import Sample

RECORDS = [
    {"input": f"What is {i} + {i}?", "label": str(2 * i), "metadata": {"id": i}} for i in range(7)
]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_parquet(path, records):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(records), path)
    return path


def make_args(tmp_path, *extra):
    return parse_args(["--run-dir", str(tmp_path / "run"), *extra])


@pytest.fixture
def jsonl(tmp_path):
    return write_jsonl(tmp_path / "prompts.jsonl", RECORDS)


def test_positions_cover_every_prompt_once_per_epoch_in_a_seeded_order(tmp_path, jsonl):
    args = make_args(tmp_path, "--prompt-data", str(jsonl), "--label-key", "label", "--rollout-shuffle")
    source = RolloutDataSource(args)
    n = len(source)
    assert n == 7
    epochs = [[source.prompt_group(p)[0].prompt for p in range(e * n, (e + 1) * n)] for e in range(3)]
    for order in epochs:
        assert sorted(order) == sorted(r["input"] for r in RECORDS)
    assert epochs[0] != epochs[1] or epochs[1] != epochs[2], "each epoch has its own permutation"
    again = RolloutDataSource(make_args(tmp_path, "--prompt-data", str(jsonl), "--rollout-shuffle"))
    assert [again.prompt_group(p)[0].prompt for p in range(3 * n)] == sum(epochs, [])
    reseeded = RolloutDataSource(make_args(tmp_path, "--prompt-data", str(jsonl), "--rollout-shuffle",
                                           "--rollout-seed", "7"))
    assert [reseeded.prompt_group(p)[0].prompt for p in range(n)] != epochs[0]


def test_without_shuffle_positions_follow_the_file(tmp_path, jsonl):
    source = RolloutDataSource(make_args(tmp_path, "--prompt-data", str(jsonl)))
    assert [source.prompt_group(p)[0].prompt for p in range(9)] == [RECORDS[p % 7]["input"] for p in range(9)]
    assert source.locate(15) == (2, 1)


def test_a_prompt_group_is_n_fresh_copies_with_position_based_indices(tmp_path, jsonl):
    args = make_args(tmp_path, "--prompt-data", str(jsonl), "--label-key", "label", "--n-samples-per-prompt", "3")
    source = RolloutDataSource(args)
    group = source.prompt_group(4)
    assert [s.group_index for s in group] == [4, 4, 4]
    assert [s.index for s in group] == [12, 13, 14]
    assert all(s.label == "8" and s.metadata == {"id": 4} and s.status == Sample.Status.PENDING for s in group)
    group[0].metadata["touched"] = True
    assert "touched" not in group[1].metadata and "touched" not in source.prompt_group(4)[0].metadata


def test_get_samples_advances_a_cursor_that_the_checkpoint_restores(tmp_path, jsonl):
    args = make_args(tmp_path, "--prompt-data", str(jsonl), "--n-samples-per-prompt", "2", "--rollout-shuffle")
    source = RolloutDataSource(args)
    first = source.get_samples(3)
    assert [g[0].group_index for g in first] == [0, 1, 2]
    state = json.loads(json.dumps(source.state_dict()))  # JSON-able, as the workflow state needs
    later = source.get_samples(9)

    resumed = RolloutDataSource(args)
    resumed.load_state_dict(state)
    assert [[s.prompt for s in g] for g in resumed.get_samples(9)] == [[s.prompt for s in g] for g in later]
    assert resumed.position == 12


def test_handed_back_groups_come_first_and_survive_the_checkpoint(tmp_path, jsonl):
    args = make_args(tmp_path, "--prompt-data", str(jsonl), "--save", str(tmp_path / "ckpt"))
    source = RolloutDataSource(args)
    aborted = source.get_samples(2)
    aborted[0][0].status = Sample.Status.ABORTED
    source.add_samples(aborted)
    source.save(5)

    resumed = RolloutDataSource(args)
    resumed.load(5)
    assert resumed.get_buffer_length() == 2
    groups = resumed.get_samples(3)
    assert [g[0].group_index for g in groups] == [0, 1, 2]
    assert groups[0][0].status == Sample.Status.ABORTED
    with pytest.raises(ConfigError, match="add_samples expects"):
        resumed.add_samples([[1, 2]])


@pytest.mark.parametrize("chat", [False, True])
def test_parquet_and_jsonl_give_the_same_samples(tmp_path, chat):
    records = [
        {**r, "input": [{"role": "user", "content": r["input"]}] if chat else r["input"]} for r in RECORDS
    ]
    jsonl = write_jsonl(tmp_path / "prompts.jsonl", records)
    parquet = write_parquet(tmp_path / "prompts.parquet", records)
    from_jsonl = PromptDataset(str(jsonl), label_key="label")
    from_parquet = PromptDataset(str(parquet), label_key="label")
    assert [s.to_dict() for s in from_jsonl.samples] == [s.to_dict() for s in from_parquet.samples]
    assert from_parquet[3].prompt == records[3]["input"] and from_parquet[3].metadata == {"id": 3}


def test_a_path_slice_takes_some_records(tmp_path, jsonl):
    dataset = PromptDataset(f"{jsonl}@[2:4]")
    assert [s.prompt for s in dataset.samples] == [RECORDS[2]["input"], RECORDS[3]["input"]]


@pytest.mark.parametrize(
    ("content", "flags", "match"),
    [
        ('{"input": "a"}\n{"input": \n', [], r"prompts.jsonl:2: not valid JSON"),
        ('{"input": "a"}\n\n{"question": "b"}\n', [],
         r"prompts.jsonl:3: no key 'input' \(the record has \['question'\]\); set --input-key"),
        ('{"input": "a"}\n', ["--label-key", "answer"], r"prompts.jsonl:1: no key 'answer'.*--label-key"),
        ("\n\n", [], r"prompts.jsonl': the file has no records"),
        ('[1, 2]\n', [], r"prompts.jsonl:1: expected a JSON object per line, got list"),
        ('{"input": 3}\n', [], r"prompts.jsonl:1: 'input' must be a string or a list of chat messages, got int"),
        ('{"input": "a", "metadata": [1]}\n', [], r"prompts.jsonl:1: 'metadata' must be an object, got list"),
        ('{"input": "a", "tools": "{oops"}\n', [], r"prompts.jsonl:1 key 'tools': tools are a string but not JSON"),
    ],
)
def test_bad_data_names_the_file_the_line_and_the_key(tmp_path, content, flags, match):
    path = tmp_path / "prompts.jsonl"
    path.write_text(content)
    with pytest.raises(ConfigError, match=match):
        RolloutDataSource(make_args(tmp_path, "--prompt-data", str(path), *flags))


def test_missing_and_unsupported_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"--prompt-data '.*nope.jsonl': no such file"):
        PromptDataset(str(tmp_path / "nope.jsonl"))
    (tmp_path / "p.csv").write_text("input\na\n")
    with pytest.raises(ConfigError, match=r"unsupported file type '.csv'; use .jsonl or .parquet"):
        PromptDataset(str(tmp_path / "p.csv"))
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(ConfigError, match=r"not a readable Parquet file"):
        PromptDataset(str(tmp_path / "bad.parquet"))


def test_chat_template_renders_messages_with_the_records_tools(tmp_path, tiny_model_dir):
    tools = [{"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                               "parameters": {"type": "object", "properties": {}}}}]
    path = write_jsonl(tmp_path / "chat.jsonl", [
        {"input": [{"role": "user", "content": "add 1 and 2"}], "tools": tools},
        {"input": "plain text becomes a user turn"},
    ])
    args = make_args(tmp_path, "--prompt-data", str(path), "--hf-checkpoint", str(tiny_model_dir),
                     "--apply-chat-template")
    first, second = RolloutDataSource(args).dataset.samples
    assert first.prompt.startswith("<|im_start|>system") and '"name": "add"' in first.prompt
    assert first.prompt.endswith("<|im_start|>assistant\n")
    assert first.metadata["tools"] == tools
    assert "<|im_start|>user\nplain text becomes a user turn<|im_end|>" in second.prompt


def test_metadata_key_and_tool_key_name_the_columns_that_become_metadata_and_tools(tmp_path):
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"input": "add 1 and 2", "extra": {"id": 7}, "functions": tools, "metadata": {"id": 0}, "tools": "not read"},
    ])
    renamed = RolloutDataSource(make_args(tmp_path, "--prompt-data", str(path), "--metadata-key", "extra",
                                          "--tool-key", "functions")).dataset[0]
    assert renamed.metadata == {"id": 7, "tools": tools}  # the tools travel in metadata, for a custom generate

    path = write_jsonl(tmp_path / "q.jsonl", [{"input": "hi", "metadata": {"id": 0}, "functions": tools}])
    default = RolloutDataSource(make_args(tmp_path, "--prompt-data", str(path))).dataset[0]
    assert default.metadata == {"id": 0}  # the default keys: 'metadata', and 'tools', which this record lacks


THINKING_TEMPLATE_TAIL = (
    "{%- if add_generation_prompt and enable_thinking is defined and not enable_thinking -%}"
    "{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}"
)


def thinking_tokenizer(tiny_model_dir, path):
    """The tiny model's tokenizer with a chat template that reads `enable_thinking`, as Qwen3's does."""
    from vime.testing.tiny_model import CHAT_TEMPLATE

    path.mkdir()
    template = CHAT_TEMPLATE + THINKING_TEMPLATE_TAIL
    for name in ("tokenizer.json", "config.json"):
        (path / name).write_bytes((tiny_model_dir / name).read_bytes())
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    (path / "chat_template.jinja").write_text(template)
    return path


def test_apply_chat_template_kwargs_reach_the_template_of_every_rendered_prompt(tmp_path, tiny_model_dir):
    from vime.rollout.generate import prompt_token_ids
    from vime.rollout.tokenization import encode, get_tokenizer

    model = thinking_tokenizer(tiny_model_dir, tmp_path / "model")
    messages = [{"role": "user", "content": "add 1 and 2"}]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"input": messages}])

    def rendered(*flags):
        args = make_args(tmp_path, "--prompt-data", str(path), "--hf-checkpoint", str(model), *flags)
        return RolloutDataSource(args).dataset[0].prompt

    kwargs = ["--apply-chat-template-kwargs", '{"enable_thinking": false}']
    assert rendered("--apply-chat-template").endswith("<|im_start|>assistant\n")
    assert rendered("--apply-chat-template", *kwargs).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")

    # chat messages kept as messages (no --apply-chat-template) are rendered at generation, with the same kwargs
    args = make_args(tmp_path, "--prompt-data", str(path), "--hf-checkpoint", str(model), *kwargs)
    ids = prompt_token_ids(args, Sample(prompt=messages))
    assert ids == encode(get_tokenizer(str(model)), rendered("--apply-chat-template", *kwargs))


def test_max_prompt_len_drops_long_prompts_and_refuses_to_drop_all(tmp_path, tiny_model_dir):
    records = [{"input": "a short one"}, {"input": "long " * 200}, {"input": "a tiny one"}]
    path = write_jsonl(tmp_path / "p.jsonl", records)
    args = make_args(tmp_path, "--prompt-data", str(path), "--hf-checkpoint", str(tiny_model_dir),
                     "--rollout-max-prompt-len", "50")
    dataset = RolloutDataSource(args).dataset
    assert [s.prompt for s in dataset.samples] == ["a short one", "a tiny one"] and dataset.num_filtered == 1
    args = make_args(tmp_path, "--prompt-data", str(path), "--hf-checkpoint", str(tiny_model_dir),
                     "--rollout-max-prompt-len", "1")
    with pytest.raises(ConfigError, match=r"all 3 prompts are longer than --rollout-max-prompt-len 1"):
        RolloutDataSource(args)
    with pytest.raises(ConfigError, match=r"--rollout-max-prompt-len needs the tokenizer: set --hf-checkpoint"):
        RolloutDataSource(make_args(tmp_path, "--prompt-data", str(path), "--rollout-max-prompt-len", "5"))


def test_without_prompt_data_groups_are_blank_samples(tmp_path):
    source = RolloutDataSource(make_args(tmp_path, "--n-samples-per-prompt", "2"))
    assert len(source) == 0
    assert [(s.prompt, s.index) for s in source.prompt_group(3)] == [("", 6), ("", 7)]


def test_data_source_path_replaces_the_class(tmp_path, monkeypatch, jsonl):
    (tmp_path / "my_source_mod.py").write_text(textwrap.dedent("""
        from vime.rollout.data_source import RolloutDataSource

        class Reversed(RolloutDataSource):
            def prompt_group(self, position):
                group = super().prompt_group(position)
                for s in group:
                    s.prompt = s.prompt[::-1]
                return group
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    args = make_args(tmp_path, "--prompt-data", str(jsonl), "--data-source-path", "my_source_mod.Reversed")
    source = make_data_source(args)
    assert source.get_samples(1)[0][0].prompt == RECORDS[0]["input"][::-1]
    assert type(make_data_source(make_args(tmp_path, "--prompt-data", str(jsonl)))) is RolloutDataSource


def test_sampling_params_use_vllms_names_and_a_seed_per_sample(tmp_path):
    args = make_args(tmp_path, "--rollout-max-response-len", "64", "--rollout-temperature", "0.7",
                     "--rollout-top-p", "0.9", "--rollout-top-k", "20", "--rollout-stop", "</s>", "###",
                     "--rollout-stop-token-ids", "2", "--rollout-skip-special-tokens", "--rollout-seed", "10")
    params = sampling_params_from_args(args)
    assert params == {
        "temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_tokens": 64, "skip_special_tokens": True,
        "spaces_between_special_tokens": False, "stop": ["</s>", "###"], "include_stop_str_in_output": True,
        "stop_token_ids": [2],
    }
    assert params_for_sample(params, args, Sample(index=5))["seed"] == 15
    assert "seed" not in params
    assert params_for_sample({"seed": 3}, args, Sample(index=5))["seed"] == 3
    args = args.replace(eval_temperature=0.0)
    assert sampling_params_from_args(args, evaluation=True)["temperature"] == 0.0
    assert "max_tokens" not in sampling_params_from_args(make_args(tmp_path))


def test_records_are_read_as_they_are_consumed(tmp_path):
    """Taking the first records of a large file does not read the rest of it (nor trip on it)."""
    from vime.rollout.dataset import read_records

    path = tmp_path / "p.jsonl"
    path.write_text('{"input": "a"}\n{"input": "b"}\n{"input": "c"}\nnot json at all\n')
    assert [r["input"] for _, r in itertools.islice(read_records(str(path)), 2)] == ["a", "b"]
    assert [r["input"] for _, r in itertools.islice(read_records(f"{path}@[1:]"), 2)] == ["b", "c"]
    with pytest.raises(ConfigError, match=r"p.jsonl:4: not valid JSON"):
        next(read_records(f"{path}@[-3:]"))  # a bound from the end needs the whole file
    headed = tmp_path / "headed.jsonl"
    headed.write_text('a header, not JSON\n\n{"input": "x"}\n')
    assert [(where, r) for where, r in read_records(f"{headed}@[1:]")] == [(f"{headed}:3", {"input": "x"})]
    good = write_jsonl(tmp_path / "good.jsonl", [{"input": c} for c in "abcd"])
    assert [r["input"] for _, r in read_records(f"{good}@[-3:-1]")] == ["b", "c"]


def test_parquet_rows_stream_in_batches_with_file_row_numbers(tmp_path):
    from vime.rollout.dataset import _read_parquet

    path = write_parquet(tmp_path / "p.parquet", [{"input": str(i)} for i in range(5)])
    rows = list(_read_parquet(path, "--prompt-data", batch_rows=2))
    assert [(where.rsplit(" ", 1)[1], r["input"]) for where, r in rows] == [(str(i), str(i)) for i in range(5)]


async def test_each_eval_prompt_is_sampled_n_samples_per_eval_prompt_times(tmp_path, monkeypatch):
    from vime.rollout import vllm_rollout

    (tmp_path / "eval_gen_hooks.py").write_text(textwrap.dedent("""
        from vime.types import Sample

        async def fake(args, sample, sampling_params):
            sample.tokens = [1, 2, 3]
            sample.append_response_tokens([4], [-0.1], text="r")
            sample.status = Sample.Status.COMPLETED
            return sample
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    write_jsonl(tmp_path / "a.jsonl", [{"input": "q0", "label": "r"}, {"input": "q1", "label": "r"}])
    args = make_args(tmp_path, "--custom-generate-function-path", "eval_gen_hooks.fake", "--rm-type", "exact_match",
                     "--label-key", "label", "--eval-prompt-data", "a", str(tmp_path / "a.jsonl"),
                     "--n-samples-per-eval-prompt", "3")
    groups = await vllm_rollout.eval_rollout(args, 0)
    assert [len(g) for g in groups] == [3, 3]
    assert sorted(s.rollout_id for g in groups for s in g) == [f"eval-a-{i}" for i in range(6)]
