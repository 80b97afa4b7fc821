"""`vime sft`: the tiny model learns an agent's tool-call answers from traces and saves an HF model.

The traces are what an RL run trains on: `Sample`s whose prompt is a chat-template rendering and
whose response (loss_mask 1) is a `<tool_call>` finish answer ending in `<|im_end|>`.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vime.config.args import parse_args
from vime.cli import main as vime_main
from vime.errors import ConfigError
from vime.train.sft import load_sft_samples, run_sft
from vime.types import Sample

TASKS = [("What is 2 + 3?", "5"), ("Capital of France?", "Paris"), ("Reverse 'abc'.", "cba"),
         ("Largest planet?", "Jupiter"), ("Spell 7 in words.", "seven"), ("Opposite of hot?", "cold"),
         ("Color of the sky?", "blue"), ("First letter of 'zebra'?", "z")]


def finish_call(answer: str) -> str:
    return '<tool_call>\n{"name": "finish", "arguments": {"answer": "%s"}}\n</tool_call><|im_end|>' % answer


def tool_call_traces(model_dir: Path) -> list[Sample]:
    """One trace per task: the chat prompt (not learned) and the finish call (learned)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    out = []
    for i, (question, answer) in enumerate(TASKS):
        messages = [{"role": "user", "content": question}]
        prompt = tok.encode(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                            add_special_tokens=False)
        response = tok.encode(finish_call(answer), add_special_tokens=False)
        out.append(Sample(index=i, rollout_id=f"trace-{i}", prompt=messages, tokens=prompt + response,
                          response=finish_call(answer), response_length=len(response),
                          loss_mask=[1] * len(response), status=Sample.Status.COMPLETED))
    return out


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture
def quiet_cli(monkeypatch):
    """`vime.cli.main` configures logging from the environment; keep the test session's settings."""
    monkeypatch.setenv("VIME_LOG_FORMAT", "console")
    monkeypatch.setenv("VIME_LOG_LEVEL", "WARNING")


def test_sft_teaches_the_tool_call_answers_and_the_saved_model_reproduces_each_one(
        tiny_model_dir, tmp_path, quiet_cli, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    traces = tool_call_traces(tiny_model_dir)
    data = write_jsonl(tmp_path / "traces.jsonl", [s.to_dict() for s in traces])
    out = tmp_path / "sft-model"
    rc = vime_main(["sft", "--hf-checkpoint", str(tiny_model_dir), "--sft-data", str(data), "--save", str(out),
                    "--lr", "3e-3", "--global-batch-size", "8", "--sft-num-steps", "80"])
    assert rc == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out)

    info = json.loads((out / "sft.json").read_text())
    assert info["steps"] == 80 and info["samples"] == 8
    assert info["first_loss"] == pytest.approx(math.log(8192), rel=0.1)  # random weights: ~uniform
    assert info["last_loss"] < info["first_loss"] / 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft-model", "traces.jsonl"]  # no temp dir left

    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.apply_chat_template(traces[0].prompt, tokenize=False, add_generation_prompt=True) == \
        AutoTokenizer.from_pretrained(tiny_model_dir).apply_chat_template(
            traces[0].prompt, tokenize=False, add_generation_prompt=True)
    for s in traces:
        prompt = torch.tensor([s.tokens[: s.prompt_length]])
        generated = model.generate(prompt, max_new_tokens=s.response_length + 8, do_sample=False)
        assert generated[0, s.prompt_length :].tolist() == s.response_tokens, tok.decode(generated[0])


def test_the_loss_is_the_masked_token_mean_nll_averaged_over_traces_and_ignores_rewards(tiny_model_dir, tmp_path):
    """With lr 0 the first step's loss is a pure function of the data, checked against plain
    transformers: per trace, the mean NLL of its loss_mask=1 tokens; then the mean over traces."""
    from transformers import AutoModelForCausalLM

    traces = tool_call_traces(tiny_model_dir)[:4]
    for i, s in enumerate(traces):  # a spliced-in stretch in the middle: not learned, not counted
        s.loss_mask = [0 if 3 <= t < 3 + 2 * i else 1 for t in range(s.response_length)]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    per_trace = []
    for s in traces:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([s.tokens])).logits[0, s.prompt_length - 1 : -1]
        nll = -torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(s.response_tokens)[:, None])[:, 0]
        mask = torch.tensor(s.loss_mask, dtype=torch.float32)
        per_trace.append(float((nll * mask).sum() / mask.sum()))
    expected = sum(per_trace) / len(per_trace)

    def first_loss(samples, name):
        args = parse_args(["--hf-checkpoint", str(tiny_model_dir), "--save", str(tmp_path / name), "--lr", "0",
                           "--global-batch-size", "4", "--sft-num-steps", "1", "--rollout-temperature", "0.5"])
        return run_sft(args, samples).first_loss

    assert first_loss(traces, "plain") == pytest.approx(expected, rel=1e-5)
    for i, s in enumerate(traces):  # what RL traces carry besides the tokens changes nothing
        s.reward = {"score": float(i)} if i % 2 else -3.0 * i
        s.group_index = 0
        s.rollout_log_probs = [-0.5] * s.response_length if i < 2 else None
    assert first_loss(traces, "with-rewards") == pytest.approx(expected, rel=1e-5)


def test_the_command_line_trains_saves_and_prints_the_model_directory(tiny_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "traces.jsonl", [s.to_dict() for s in tool_call_traces(tiny_model_dir)])
    out = tmp_path / "out" / "model"
    env = {**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "INFO"}
    result = subprocess.run([sys.executable, "-m", "vime.cli", "sft", "--hf-checkpoint", str(tiny_model_dir),
                             "--sft-data", str(data), "--save", str(out), "--lr", "1e-3",
                             "--global-batch-size", "4", "--num-epoch", "2"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(out)
    steps = [json.loads(line) for line in result.stderr.splitlines() if '"sft step"' in line]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]  # 2 epochs of 8 traces in steps of 4
    assert all(s["loss"] > 0 for s in steps)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
            "generation_config.json", "sft.json"} <= {p.name for p in out.iterdir()}


# ---- bad input: one line naming it, and nothing written to --save ------------------------------


def good_row(tiny_model_dir: Path) -> dict:
    return tool_call_traces(tiny_model_dir)[0].to_dict()


BAD_DATA = {
    "missing file": (None, "no such file"),
    "empty file": ([], "no samples"),
    "not JSON": (["GOOD", "{not json"], ":2: not valid JSON"),
    "not an object": (["[1, 2]"], ":1: expected a JSON object"),
    "unknown field": ([{"GOOD": {"rewardz": 1}}], ":1: Sample.from_dict: unknown fields ['rewardz']"),
    "mask length": ([{"GOOD": {"loss_mask": [1, 1, 1]}}], ":1: Sample.loss_mask has 3 entries"),
    "no loss tokens": (["GOOD", {"GOOD": {"loss_mask": "ZEROS"}}], ":2: loss_mask is all 0"),
    "no response": ([{"GOOD": {"response_length": 0, "loss_mask": []}}], ":1: response_length is 0"),
    "token ids": ([{"GOOD": {"tokens": "abc"}}], ":1: tokens must be a list"),
}


def materialize(rows, good: dict) -> list:
    out = []
    for row in rows:
        if row == "GOOD":
            out.append(good)
        elif isinstance(row, dict) and "GOOD" in row:
            patch = dict(row["GOOD"])
            if patch.get("loss_mask") == "ZEROS":
                patch["loss_mask"] = [0] * good["response_length"]
            out.append({**good, **patch})
        else:
            out.append(row)
    return out


@pytest.mark.parametrize("case", list(BAD_DATA))
def test_bad_sft_data_is_one_line_naming_file_line_and_problem(case, tiny_model_dir, tmp_path, quiet_cli, capsys):
    rows, message = BAD_DATA[case]
    data = tmp_path / "traces.jsonl"
    if rows is not None:
        write_jsonl(data, materialize(rows, good_row(tiny_model_dir)))
    out = tmp_path / "model"
    rc = vime_main(["sft", "--hf-checkpoint", str(tiny_model_dir), "--sft-data", str(data), "--save", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"vime sft: error: --sft-data {data}") and message in err[0]
    assert not out.exists()


def test_an_existing_model_directory_is_never_overwritten(tiny_model_dir, tmp_path, quiet_cli, capsys):
    data = write_jsonl(tmp_path / "traces.jsonl", [good_row(tiny_model_dir)])
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text("{}")
    rc = vime_main(["sft", "--hf-checkpoint", str(tiny_model_dir), "--sft-data", str(data), "--save", str(out)])
    assert rc == 2 and f"--save {out} already exists" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["config.json"]


def test_token_ids_beyond_the_models_vocabulary_are_refused_before_training(tiny_model_dir, tmp_path):
    row = good_row(tiny_model_dir)
    row["tokens"] = row["tokens"][:-1] + [100_000]
    samples = load_sft_samples(write_jsonl(tmp_path / "traces.jsonl", [row]))
    args = parse_args(["--hf-checkpoint", str(tiny_model_dir), "--save", str(tmp_path / "model")])
    with pytest.raises(ConfigError, match=r"sample #0 has token id 100000, but --hf-checkpoint .* has 8192 ids"):
        run_sft(args, samples)
    assert not (tmp_path / "model").exists()
