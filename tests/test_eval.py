"""Evaluation without servers: the eval flags (parsed, checked, read), eval sets as prompt groups,
and the round's figures (pass@k by hand on a fixed set)."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest

from vime.config.args import parse_args
from vime.errors import ConfigError
from vime.rollout.eval_data import eval_prompt_group, eval_rollout_id, eval_sets
from vime.rollout.eval_metrics import (ScoredSample, failures_text, pass_at_k, reported_ks, round_metrics,
                                       set_metrics)
from vime.sample_summary import FAILURE_CLASSES, failure_class
from vime.rollout.sampling import sampling_params_from_args


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def make_args(tmp_path, *extra):
    return parse_args(["--run-dir", str(tmp_path / "run"), *extra])


# ---- pass@k ------------------------------------------------------------------------------------


def test_pass_at_k_is_the_unbiased_estimator_by_hand():
    # 1 - C(n-c, k) / C(n, k), by hand: n=4, c=1: pass@1 = 1/4, pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 4) == 1.0
    # n=5, c=2, k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)  # k beyond the samples per prompt: no unbiased estimate


def test_a_set_s_figures_match_a_hand_computation():
    """Three prompts with 4 samples each; rewards 0/1, one failed sample (reward None), one truncated."""
    rewards = {0: [1, 0, 0, 0], 1: [1, 1, 0, None], 2: [0, 0, 0, 0]}
    samples = [ScoredSample(p, r, "truncated" if (p, i) == (2, 0) else "failed" if r is None else "completed", 10 + i)
               for p, rs in rewards.items() for i, r in enumerate(rs)]
    m = set_metrics(samples)
    # pass@1: mean of c/n = (1/4 + 2/4 + 0) / 3; pass@2: (1 - C(3,2)/C(4,2) + 1 - C(2,2)/C(4,2) + 0) / 3
    assert m["pass@1"] == pytest.approx(float((Fraction(1, 4) + Fraction(2, 4)) / 3))
    assert m["pass@2"] == pytest.approx(float((Fraction(1, 2) + Fraction(5, 6)) / 3))
    assert m["pass@4"] == pytest.approx(2 / 3)
    assert m["reward_mean"] == pytest.approx(3 / 12)  # the failed sample counts as 0
    assert m["failed"] == 1 and m["samples"] == 12 and m["prompts"] == 3
    assert m["truncated_ratio"] == pytest.approx(1 / 12)
    assert m["response_length_mean"] == pytest.approx(11.5)
    flat = round_metrics({"heldout": samples})
    assert flat["eval/heldout/pass@2"] == m["pass@2"] and set(flat) == {f"eval/heldout/{k}" for k in m}


def test_failed_eval_samples_are_counted_by_their_failure_class():
    """The classes `vime samples --failed` shows, as metric keys; their counts add up to `failed`."""
    metas = {"infra": ("failed", {"infra_failure": "ConnectError: vLLM down", "error": "ConnectError"}),
             "timeout": ("failed", {"error": "HookTimeout: --custom-generate-function-path g timed out after 5 s",
                                    "error_source": "--custom-generate-function-path 'g'"}),
             "reward_timeout": ("failed", {"error": "--custom-rm-path rm.score timed out after 3 s on sample 2",
                                           "error_source": "--custom-rm-path 'rm.score'"}),
             "reward_error": ("failed", {"error": "--custom-rm-path 'rm.score' raised KeyError: 'answer'",
                                         "error_source": "--custom-rm-path 'rm.score'"}),
             "env_reward": ("failed", {"error": "environment reward score raised ValueError",
                                       "error_source": "environment reward score"}),
             "generate_error": ("failed", {"error": "ValueError: bad tool call",
                                           "error_source": "vime.rollout.generate.generate"}),
             "aborted": ("aborted", {}), "bare": ("failed", {})}
    classes = {name: failure_class(status, meta) for name, (status, meta) in metas.items()}
    assert classes == {"infra": "infra", "timeout": "timeout", "reward_timeout": "timeout",
                       "reward_error": "reward_error", "env_reward": "reward_error",
                       "generate_error": "generate_error", "aborted": "aborted", "bare": "error"}
    assert set(classes.values()) <= set(FAILURE_CLASSES)

    samples = [ScoredSample(i, None, status, 0, failure_class(status, meta))
               for i, (status, meta) in enumerate(metas.values())] + [ScoredSample(9, 1.0, "completed", 3)]
    m = round_metrics({"heldout": samples})
    assert m["eval/heldout/failed"] == 8
    assert {k: v for k, v in m.items() if "/failed/" in k} == {
        "eval/heldout/failed/infra": 1, "eval/heldout/failed/timeout": 2, "eval/heldout/failed/reward_error": 2,
        "eval/heldout/failed/generate_error": 1, "eval/heldout/failed/aborted": 1, "eval/heldout/failed/error": 1}
    assert failures_text(m, "heldout") == "8 (reward_error 2, timeout 2, aborted 1, error 1, generate_error 1, infra 1)"
    assert "eval/heldout/failed/infra" not in round_metrics({"heldout": samples[-1:]}), "only classes that occurred"


def test_a_sample_passes_at_full_marks_only():
    half = [ScoredSample(0, 0.5, "completed", 1), ScoredSample(0, -1.0, "completed", 1)]
    assert set_metrics(half)["pass@2"] == 0.0
    assert set_metrics([ScoredSample(0, 1.0, "completed", 1), ScoredSample(0, -1.0, "completed", 1)])["pass@1"] == 0.5


def test_pass_at_k_is_reported_for_powers_of_two_and_n():
    assert reported_ks(1) == [1]
    assert reported_ks(4) == [1, 2, 4]
    assert reported_ks(6) == [1, 2, 4, 6]
    assert all(math.log2(k).is_integer() or k == 6 for k in reported_ks(6))


# ---- flags -------------------------------------------------------------------------------------


def test_eval_flags_parse_as_slime_names_them_and_shape_eval_sampling(tmp_path):
    args = make_args(tmp_path, "--eval-prompt-data", "aime", "a.jsonl", "gsm", "g.jsonl", "--eval-interval", "5",
                     "--n-samples-per-eval-prompt", "4", "--eval-temperature", "0", "--eval-top-p", "0.9",
                     "--eval-top-k", "5", "--eval-max-response-len", "32", "--rollout-max-response-len", "8",
                     "--rollout-temperature", "0.7", "--skip-eval-before-train")
    assert eval_sets(args) == [("aime", "a.jsonl"), ("gsm", "g.jsonl")]
    assert args.skip_eval_before_train and args.eval_interval == 5
    params = sampling_params_from_args(args, evaluation=True)
    assert (params["temperature"], params["top_p"], params["top_k"], params["max_tokens"]) == (0.0, 0.9, 5, 32)
    train = sampling_params_from_args(args)
    assert (train["temperature"], train["top_p"], train["top_k"], train["max_tokens"]) == (0.7, 1.0, -1, 8)
    unset = sampling_params_from_args(make_args(tmp_path, "--rollout-temperature", "0.7"), evaluation=True)
    assert unset["temperature"] == 0.7  # no --eval-temperature: the rollout's


@pytest.mark.parametrize("argv, reason", [
    (["--eval-interval", "2"], "--eval-interval needs --eval-prompt-data"),
    (["--eval-prompt-data", "aime"], "--eval-prompt-data takes name path pairs"),
    (["--eval-prompt-data", "a/b", "x.jsonl"], "set name 'a/b' must be letters"),
    (["--eval-prompt-data", "a", "x.jsonl", "a", "y.jsonl"], "set name 'a' is given twice"),
    (["--eval-prompt-data", "a", "x.jsonl", "--eval-temperature", "-1"], "--eval-temperature must be >= 0"),
    (["--eval-prompt-data", "a", "x.jsonl", "--eval-top-p", "0"], "--eval-top-p must be in (0, 1]"),
    (["--eval-prompt-data", "a", "x.jsonl", "--eval-max-response-len", "0"], "--eval-max-response-len must be a"),
    (["--eval-prompt-data", "a", "x.jsonl", "--eval-interval", "0"], "--eval-interval must be a positive"),
])
def test_bad_eval_flags_are_one_line_before_anything_starts(tmp_path, argv, reason):
    with pytest.raises(ConfigError) as info:
        make_args(tmp_path, *argv)
    assert reason in str(info.value) and "\n" not in str(info.value)


def test_eval_sets_are_read_with_the_eval_keys(tmp_path):
    write_jsonl(tmp_path / "e.jsonl", [{"q": f"question {i}", "a": str(i), "input": "not this",
                                        "fns": [{"type": "function", "function": {"name": f"f{i}"}}]}
                                       for i in range(3)])
    args = make_args(tmp_path, "--eval-prompt-data", "heldout", str(tmp_path / "e.jsonl"), "--eval-input-key", "q",
                     "--eval-label-key", "a", "--eval-tool-key", "fns", "--n-samples-per-eval-prompt", "2",
                     "--label-key", "label")
    group = eval_prompt_group(args, "heldout", 2)
    assert [(s.prompt, s.label, s.group_index, s.index) for s in group] == [("question 2", "2", 2, 4),
                                                                            ("question 2", "2", 2, 5)]
    assert group[0].metadata["tools"][0]["function"]["name"] == "f2"
    assert all(s.metadata["eval_set"] == "heldout" for s in group)
    assert eval_rollout_id(4, "heldout", 5) == "eval4-heldout-5"
    with pytest.raises(ConfigError, match="eval set 'heldout' has 3 prompts, no prompt 3"):
        eval_prompt_group(args, "heldout", 3)


def test_eval_files_are_checked_with_the_eval_keys_before_start(tmp_path):
    from vime.config.preflight import check_prompt_data

    prompts = write_jsonl(tmp_path / "p.jsonl", [{"input": "x", "label": "1"}] * 4)
    evals = write_jsonl(tmp_path / "e.jsonl", [{"q": "x"}, {"input": "y"}])
    args = make_args(tmp_path, "--prompt-data", str(prompts), "--label-key", "label", "--eval-input-key", "q",
                     "--eval-label-key", "q", "--eval-prompt-data", "heldout", str(evals))
    with pytest.raises(ConfigError, match=r"e.jsonl:2: no key 'q'"):
        check_prompt_data(args)


# ---- rounds and the console --------------------------------------------------------------------


def test_rounds_are_due_at_the_baseline_every_n_steps_and_after_the_last():
    from vime.temporal.training_contract import TrainingConfig
    from workflows.eval_round import eval_due

    cfg = TrainingConfig("r", num_rollout=5, rollout_batch_size=1, over_sampling_batch_size=1, eval_interval=2)
    assert [s for s in range(6) if eval_due(cfg, s)] == [0, 2, 4, 5]
    cfg.skip_eval_before_train = True
    assert [s for s in range(6) if eval_due(cfg, s)] == [2, 4, 5]
    cfg.eval_interval = 0
    assert not any(eval_due(cfg, s) for s in range(6))


def test_the_progress_line_shows_the_round_before_the_step_and_a_line_for_the_last():
    from vime.launcher.follow import format_progress

    m = {"step": 1, "reward_mean": 0.25, "eval/heldout/reward_mean": 0.62, "eval/heldout/pass@1": 0.62,
         "eval/heldout/pass@4": 0.9, "eval_seconds": 3.0}
    assert "| eval heldout 0.620 pass@4 0.900 (3.0s)" in format_progress(m, 4)
    assert "eval" not in format_progress({"step": 1, "reward_mean": 0.25}, 4)
    last = format_progress({"step": 4, "eval_only": True, "eval/heldout/reward_mean": 0.7, "eval_seconds": 2.0}, 4)
    assert last == "[eval] after step 4/4 | eval heldout 0.700 | 2.0s"
