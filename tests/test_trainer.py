"""The trainer agrees with vLLM at step 0, learns, checkpoints and resumes."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoConfig

from vime.config.args import parse_args
from vime.rollout.data_source import RolloutDataSource
from vime.rollout.group import run_group
from vime.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from vime.train.trainer import Trainer
from vime.types import Sample


def write_prompts(path, n: int = 4) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"Write line {i}."}], "label": "x"}) + "\n")


def make_args(tmp_path, model, extra=()):
    write_prompts(tmp_path / "prompts.jsonl")
    return parse_args([
        "--hf-checkpoint", str(model), "--prompt-data", str(tmp_path / "prompts.jsonl"), "--input-key", "prompt",
        "--apply-chat-template", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
        "--rollout-max-response-len", "12", "--rm-type", "exact_match", "--run-dir", str(tmp_path / "run"),
        "--lr", "1e-3", *extra,
    ])


@pytest.mark.vllm
async def test_step_0_trainer_logprobs_match_vllm_and_kl_to_the_reference_is_zero(vllm_server, tiny_model_dir, tmp_path):
    args = make_args(tmp_path, tiny_model_dir, ["--vllm-router-ip", vllm_server.host, "--vllm-router-port",
                                                str(vllm_server.port), "--use-kl-loss", "--kl-loss-coef", "0.1",
                                                "--rollout-temperature", "0.8"])
    source = RolloutDataSource(args)
    rollouts = [r for p in range(4) for r in await run_group(args, source.prompt_group(p))]
    samples = [s for r in rollouts for s in r]
    assert all(s.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED) for s in samples)

    trainer = Trainer(args)
    diffs = []
    for s in samples:  # direct check: one forward per sample, at the rollout temperature
        ids = torch.tensor([s.tokens])
        with torch.no_grad():
            logits = trainer.model(input_ids=ids, use_cache=False).logits[0, s.prompt_length - 1 : -1] / 0.8
        lp = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, s.prompt_length :, None])[:, 0]
        diffs.append((lp - torch.tensor(s.rollout_log_probs)).abs())
    assert torch.cat(diffs).mean().item() <= 1e-3

    metrics = trainer.train_step(samples).metrics
    assert metrics["train_rollout_logprob_abs_diff"] <= 1e-3
    assert metrics["kl_loss"] == 0.0  # the policy is the reference before its first update
    assert metrics["optimizer_steps"] == 1 and metrics["samples"] == 16


def synthetic_batch(seed: int, groups: int = 4, n: int = 4) -> list[Sample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for group in range(groups):
        for i in range(n):
            s = Sample(group_index=group, index=group * n + i, rollout_id=str(group * n + i),
                       tokens=torch.randint(3, 8000, (6,), generator=g).tolist())
            k = int(torch.randint(2, 9, (1,), generator=g))
            s.append_response_tokens(torch.randint(3, 8000, (k,), generator=g).tolist(), [-9.0] * k)
            s.reward = float(torch.rand(1, generator=g) > 0.5)
            out.append(s)
    return out


def test_a_checkpoint_is_an_hf_model_and_resumes_to_the_same_weights_and_optimizer(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    args = make_args(tmp_path, tiny_model_dir, ["--global-batch-size", "8"])
    trainer = Trainer(args)
    trainer.train_step(synthetic_batch(0))
    path = save_checkpoint(trainer, tmp_path / "ckpt", {"step": 1, "weight_version": 1, "data_position": 4})
    assert latest_checkpoint(tmp_path / "ckpt") == path
    after_one = trainer.train_step(synthetic_batch(1)).metrics

    hf = AutoModelForCausalLM.from_pretrained(path)  # plain transformers can load it
    assert hf.config.vocab_size == trainer.model.config.vocab_size

    resumed = Trainer(args)
    state = load_checkpoint(resumed, path)
    assert state == {"step": 1, "weight_version": 1, "data_position": 4} and resumed.step == 1
    again = resumed.train_step(synthetic_batch(1)).metrics
    assert again["loss"] == pytest.approx(after_one["loss"], abs=1e-6)
    assert again["grad_norm"] == pytest.approx(after_one["grad_norm"], rel=1e-4)


def test_an_incomplete_latest_checkpoint_is_refused_with_a_clear_message(tmp_path):
    (tmp_path / "step_000002").mkdir()
    (tmp_path / "latest").write_text("step_000002")
    from vime.errors import ConfigError

    with pytest.raises(ConfigError, match="incomplete"):
        latest_checkpoint(tmp_path)


def test_on_cpu_a_step_packs_rows_of_1024_tokens_by_default_and_the_budget_does_not_change_the_update(
        tiny_model_dir, tmp_path):
    """Issue #10: one long packed row costs the square of its length on CPU; shorter rows are
    cheaper and, being the same samples, give the same loss and gradients."""
    default = Trainer(make_args(tmp_path, tiny_model_dir))
    one_row = Trainer(make_args(tmp_path, tiny_model_dir, ["--max-tokens-per-gpu", "8192"]))
    assert (default.budget, one_row.budget) == (1024, 8192)
    batch = synthetic_batch(0, groups=16, n=8)
    assert sum(len(s.tokens) for s in batch) > 1024  # more than one row at the default
    a, b = default.train_step(batch).metrics, one_row.train_step(synthetic_batch(0, groups=16, n=8)).metrics
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)


def test_the_optimizer_is_adamw_with_the_betas_and_weight_decay_of_the_flags(tiny_model_dir, tmp_path):
    flags = ["--adam-beta1", "0.8", "--adam-beta2", "0.99", "--weight-decay", "0.1"]
    group = Trainer(make_args(tmp_path, tiny_model_dir, flags)).optimizer.param_groups[0]
    assert (group["betas"], group["weight_decay"]) == ((0.8, 0.99), 0.1)
    default = Trainer(make_args(tmp_path, tiny_model_dir)).optimizer.param_groups[0]
    assert (default["betas"], default["weight_decay"]) == ((0.9, 0.95), 0.0)


def record_applied_grad_norms(trainer: Trainer) -> list[float]:
    """The global norm of the gradients each optimizer step applies (after any clipping)."""
    applied: list[float] = []

    def record(optimizer, *_):
        grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                 for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        applied.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))

    trainer.optimizer.register_step_pre_hook(record)
    return applied


def test_a_gradient_whose_norm_exceeds_clip_grad_is_scaled_to_it_and_clip_grad_0_does_not_clip(
        tiny_model_dir, tmp_path):
    """The step's `grad_norm` metric is the norm before clipping; the optimizer applies at most
    --clip-grad. 0 turns clipping off, as in Megatron (slime's --clip-grad 0), rather than zeroing
    every gradient."""
    for flags, bound in ((["--clip-grad", "0.5"], 0.5), ([], 1.0), (["--clip-grad", "0"], None)):
        trainer = Trainer(make_args(tmp_path, tiny_model_dir, flags))
        applied = record_applied_grad_norms(trainer)
        norm = trainer.train_step(synthetic_batch(0)).metrics["grad_norm"]
        assert norm > 1.0, "the batch's gradient is larger than every bound tried here"
        assert applied == [pytest.approx(norm if bound is None else bound, rel=1e-4)], flags


def test_gradient_checkpointing_keeps_fewer_activations_for_backward_and_gives_the_same_update(
        tiny_model_dir, tmp_path):
    def step(*flags):
        trainer = Trainer(make_args(tmp_path, tiny_model_dir, list(flags)))
        saved: list[int] = []

        def keep(t: torch.Tensor) -> torch.Tensor:
            saved.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            metrics = trainer.train_step(synthetic_batch(0)).metrics
        return trainer.model.is_gradient_checkpointing, sum(saved), metrics

    plain, recomputed = step(), step("--gradient-checkpointing")
    assert (plain[0], recomputed[0]) == (False, True)
    assert recomputed[1] < 0.75 * plain[1], (recomputed[1], plain[1])  # the layers' activations are recomputed
    assert recomputed[2]["loss"] == pytest.approx(plain[2]["loss"], abs=1e-6)
    assert recomputed[2]["grad_norm"] == pytest.approx(plain[2]["grad_norm"], rel=1e-5)


def test_every_step_reports_the_policys_entropy_which_the_entropy_bonus_subtracts(tiny_model_dir, tmp_path):
    """`entropy` (the mean token entropy of the trained tokens, README's metrics) is in every step's
    metrics, also at --entropy-coef 0, where it is read off the logits without a gradient; with a
    bonus the same figure is what the loss subtracts."""
    plain = Trainer(make_args(tmp_path, tiny_model_dir)).train_step(synthetic_batch(0)).metrics
    bonus = Trainer(make_args(tmp_path, tiny_model_dir, ["--entropy-coef", "0.01"])).train_step(
        synthetic_batch(0)).metrics
    vocab = AutoConfig.from_pretrained(tiny_model_dir).vocab_size
    assert 0 < plain["entropy"] <= math.log(vocab)
    assert bonus["entropy"] == pytest.approx(plain["entropy"], rel=1e-5)
    assert bonus["loss"] == pytest.approx(plain["loss"] - 0.01 * plain["entropy"], abs=1e-5)
