"""Issue #25 item 3: at world size 1 the trainer runs without the FSDP2 wrapper, and nothing else
changes: the same update (to 1e-6), the same weights out, checkpoints that load either way."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from tests.test_trainer import make_args, synthetic_batch
from vime.train.checkpoint import load_checkpoint, save_checkpoint
from vime.train.trainer import Trainer

# Two optimizer steps per rollout step (old logprobs recomputed), a KL loss (the reference model),
# gradient clipping at the default 1.0: the paths of a step that touch the model.
FLAGS = ["--global-batch-size", "8", "--use-kl-loss", "--kl-loss-coef", "0.1"]


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_one_rank_trains_without_the_fsdp2_wrapper_to_the_same_weights(tiny_model_dir, tmp_path):
    args = make_args(tmp_path, tiny_model_dir, FLAGS)
    lean, wrapped = Trainer(args), Trainer(args, shard=True)
    assert (lean.sharded, wrapped.sharded) == (False, True)
    assert not any(isinstance(p, DTensor) for p in lean.model.parameters())
    assert not any(isinstance(p, DTensor) for p in lean.ref_model.parameters())
    assert all(isinstance(p, DTensor) for p in wrapped.model.parameters())
    assert max_difference(lean.full_state_dict(), wrapped.full_state_dict()) == 0.0

    for step in range(2):
        a, b = lean.train_step(synthetic_batch(step)).metrics, wrapped.train_step(synthetic_batch(step)).metrics
        assert a["optimizer_steps"] == b["optimizer_steps"] == 2
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["kl_loss"] == pytest.approx(b["kl_loss"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
        assert max_difference(lean.full_state_dict(), wrapped.full_state_dict()) <= 1e-6


def test_the_unwrapped_weights_out_are_a_copy_the_next_step_leaves_alone(tiny_model_dir, tmp_path):
    """Weight sync keeps the dict (a delta's base, a restarted server's weights); an unwrapped
    model's own state dict would be its live parameters."""
    trainer = Trainer(make_args(tmp_path, tiny_model_dir))
    before = trainer.full_state_dict()
    kept = {k: v.clone() for k, v in before.items()}
    trainer.train_step(synthetic_batch(0))
    assert max_difference(before, kept) == 0.0
    assert max_difference(trainer.full_state_dict(), kept) > 0.0


@pytest.mark.parametrize("writer_shards", [True, False], ids=["fsdp2-to-lean", "lean-to-fsdp2"])
def test_a_checkpoint_of_one_path_resumes_in_the_other_to_the_same_update(tiny_model_dir, tmp_path, writer_shards):
    """A checkpoint written by the FSDP2 path at world size 1 (every checkpoint before this change)
    resumes unwrapped, and the other way round: weights, AdamW's moments and the schedule."""
    args = make_args(tmp_path, tiny_model_dir, FLAGS)
    writer = Trainer(args, shard=writer_shards)
    writer.train_step(synthetic_batch(0))
    path = save_checkpoint(writer, tmp_path / "ckpt", {"step": 1, "weight_version": 1, "data_position": 4})

    reader = Trainer(args, shard=not writer_shards)
    assert load_checkpoint(reader, path)["step"] == 1 and reader.step == 1
    assert max_difference(reader.full_state_dict(), writer.full_state_dict()) == 0.0
    a, b = writer.train_step(synthetic_batch(1)).metrics, reader.train_step(synthetic_batch(1)).metrics
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    assert a["lr"] == b["lr"]
    assert max_difference(reader.full_state_dict(), writer.full_state_dict()) <= 1e-6
