"""LoRA (`--lora-rank`): only the adapter trains, checkpoints hold it in peft's format, and the
saved adapter (or the merged weights) computes the trainer's logprobs in transformers."""

from __future__ import annotations

import pytest
import torch

from tests.test_trainer import make_args, synthetic_batch
from vime.errors import ConfigError
from vime.train.checkpoint import load_checkpoint, save_checkpoint
from vime.train.lora import ADAPTER_DIR
from vime.train.trainer import Trainer

LORA = ["--lora-rank", "8", "--lora-alpha", "16", "--loss-type", "sft_loss", "--global-batch-size", "16"]


@pytest.mark.parametrize("flags, message", [
    (["--target-modules", "q_proj"], "--target-modules needs --lora-rank"),
    (["--lora-save-merged"], "--lora-save-merged needs --lora-rank"),
    (["--lora-rank", "-1"], "--lora-rank must be >= 0"),
    (["--lora-rank", "8", "--lora-alpha", "0"], "--lora-alpha must be > 0"),
    (["--lora-rank", "8", "--lora-dropout", "1"], "--lora-dropout must be in [0, 1)"),
    (["--lora-rank", "8", "--target-modules", "all-linear", "q_proj"], "all-linear stands alone"),
    (["--lora-rank", "16", "--vllm-enable-lora", "--vllm-max-lora-rank", "8"], "is above --vllm-max-lora-rank 8"),
])
def test_bad_lora_flags_are_refused_in_one_line_before_anything_starts(tmp_path, tiny_model_dir, flags, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(")", r"\)")):
        make_args(tmp_path, tiny_model_dir, flags)


def whole(param: torch.Tensor) -> torch.Tensor:
    """A parameter's full value: FSDP2's shard gathered on more than one rank, the tensor itself on one."""
    param = param.detach()
    return param.full_tensor() if hasattr(param, "full_tensor") else param


def logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]


def test_lora_trains_only_the_adapter_and_its_checkpoint_loads_in_transformers_and_peft(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    args = make_args(tmp_path, tiny_model_dir, LORA)
    trainer = Trainer(args)
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    in_optimizer = sum(p.numel() for g in trainer.optimizer.param_groups for p in g["params"])
    assert in_optimizer == sum(p.numel() for p in trainer.trainable_parameters())
    before = {n: whole(p).clone() for n, p in trainer.model.named_parameters()}

    batch = synthetic_batch(0)
    losses = [trainer.train_step(batch).metrics["loss"] for _ in range(4)]
    assert losses[-1] < losses[0], losses
    for n, p in trainer.model.named_parameters():
        changed = not torch.equal(before[n], whole(p))
        assert changed == (n in trainable), n  # the adapter moved, the base did not

    path = save_checkpoint(trainer, tmp_path / "ckpt", {"step": 4, "weight_version": 4, "data_position": 0})
    assert sorted(p.name for p in (path / ADAPTER_DIR).iterdir()) == ["adapter_config.json",
                                                                    "adapter_model.safetensors"]
    assert not (path / "model.safetensors").exists()  # merged weights only with --lora-save-merged

    ids = torch.tensor([batch[0].tokens + batch[5].tokens])
    expected = logprobs(trainer.model, ids)
    hf = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32),
                                   path / ADAPTER_DIR).eval()
    assert (logprobs(hf, ids) - expected).abs().max().item() < 1e-5
    assert (logprobs(hf.get_base_model(), ids) - expected).abs().max().item() < 1e-5  # peft applies it in place
    merged = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    merged.load_state_dict(trainer.full_state_dict(), strict=False)  # HF names, adapter folded in
    assert (logprobs(merged, ids) - expected).abs().max().item() < 1e-5

    after = trainer.train_step(synthetic_batch(1)).metrics
    resumed = Trainer(args)
    assert load_checkpoint(resumed, path)["step"] == 4 and resumed.step == 4
    again = resumed.train_step(synthetic_batch(1)).metrics
    assert again["loss"] == pytest.approx(after["loss"], abs=1e-6)
    assert again["grad_norm"] == pytest.approx(after["grad_norm"], rel=1e-4)


def test_lora_save_merged_writes_hf_weights_that_plain_transformers_loads(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    trainer = Trainer(make_args(tmp_path, tiny_model_dir, [*LORA, "--lora-save-merged", "--lr", "1e-2"]))
    batch = synthetic_batch(0)
    trainer.train_step(batch)
    path = save_checkpoint(trainer, tmp_path / "ckpt", {"step": 1, "weight_version": 1, "data_position": 0})
    assert (path / ADAPTER_DIR / "adapter_model.safetensors").exists()
    ids = torch.tensor([batch[0].tokens])
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    assert (logprobs(hf, ids) - logprobs(trainer.model, ids)).abs().max().item() < 1e-5
    assert (logprobs(hf, ids) - logprobs(base, ids)).abs().max().item() > 1e-4  # the adapter is in there


def test_target_modules_alpha_and_dropout_reach_the_adapter(tiny_model_dir, tmp_path):
    import json

    trainer = Trainer(make_args(tmp_path, tiny_model_dir, ["--lora-rank", "4", "--lora-alpha", "8", "--lora-dropout",
                                                           "0.25", "--target-modules", "q_proj", "v_proj"]))
    wrapped = {n.split(".")[-4] for n, _ in trainer.model.named_parameters() if ".lora_A." in n}
    assert wrapped == {"q_proj", "v_proj"}
    q = trainer.model.get_base_model().model.layers[0].self_attn.q_proj
    assert q.lora_dropout["default"].p == 0.25 and q.scaling["default"] == 8 / 4 == trainer.lora.scaling
    trainer.train_step(synthetic_batch(0))
    path = save_checkpoint(trainer, tmp_path / "ckpt", {"step": 1, "weight_version": 1, "data_position": 0})
    config = json.loads((path / ADAPTER_DIR / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (4, 8, 0.25)
    assert sorted(config["target_modules"]) == ["q_proj", "v_proj"]


def test_lora_with_gradient_checkpointing_takes_the_same_steps(tiny_model_dir, tmp_path):
    runs = []
    for extra in ([], ["--gradient-checkpointing"]):
        (tmp_path / str(len(runs))).mkdir()
        trainer = Trainer(make_args(tmp_path / str(len(runs)), tiny_model_dir, [*LORA, "--lr", "1e-2", *extra]))
        runs.append([trainer.train_step(synthetic_batch(0)).metrics for _ in range(2)])
    for plain, checkpointed in zip(*runs):
        assert checkpointed["loss"] == pytest.approx(plain["loss"], abs=1e-6)
        assert checkpointed["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5) and plain["grad_norm"] > 0
