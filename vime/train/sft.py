"""SFT warm start: learn the tokens that `loss_mask` marks, then save an HF model to `--save`.

Why: RL from a model that never emits the agent's tool-call format gets reward 0 on every
rollout, so there is nothing to reinforce. A short SFT on traces in that format gives RL a
starting policy that sometimes succeeds; `--hf-checkpoint <--save of the SFT>` starts from it.

The data are `Sample`s, one `Sample.to_dict()` per JSONL line: the type RL trains on, so traces
exported from a run or synthesised by a script train without conversion. `loss_mask` is 1 on the
tokens to learn (the assistant's turns) and 0 on tokens spliced into the response (tool output).
Rewards, advantages and rollout log-probs in the traces are ignored.

Training is the RL `Trainer` with `--loss-type sft_loss`: the loss of an optimizer step is the mean
over its rollouts of each rollout's masked token-mean negative log-likelihood, at temperature 1.
A rollout is a sample, or the siblings sharing its `rollout_id`; siblings stay in one step. Every
epoch shuffles the rollouts (`--seed`) and cuts them into steps of `--global-batch-size` rollouts
(the last step of an epoch may be short). `--sft-num-steps` counts optimizer steps across epochs;
without it the run is `--num-epoch` epochs (default 1). `--lr` and its schedule flags apply, with
the schedule's length the number of SFT steps. KL, entropy and TIS flags do not apply to SFT.

`--save` is written atomically: the model is built in a hidden sibling directory and renamed, so
`--save` either does not exist (or is empty) or holds a complete model that transformers and vLLM
load. It must not hold anything else beforehand: SFT never overwrites a model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vime.errors import ConfigError
from vime.log import get_logger
from vime.rollout.dataset import read_jsonl_objects
from vime.types import Sample

log = get_logger(__name__)

DEFAULT_GLOBAL_BATCH_SIZE = 32
"""Rollouts per step when `--global-batch-size` is unset (fewer when the data has fewer)."""

IGNORED_FLAGS = ("use_kl_loss", "kl_coef", "kl_loss_coef", "entropy_coef", "use_tis", "use_mis")


@dataclass
class SftResult:
    """What an SFT run did; `losses[i]` is the loss of optimizer step i + 1 (before its update)."""

    steps: int
    first_loss: float
    last_loss: float
    save_dir: Path
    seconds: float
    losses: list[float] = field(default_factory=list)


# ---- data ------------------------------------------------------------------------------------


def sample_problem(s: Sample) -> str | None:
    """Why `s` cannot be an SFT example, or None. Checked before any model is loaded."""
    if not isinstance(s.tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                 for t in s.tokens):
        return "tokens must be a list of non-negative token ids"
    if not isinstance(s.response_length, int) or isinstance(s.response_length, bool):
        return f"response_length must be an integer, got {s.response_length!r}"
    if s.loss_mask is not None and (not isinstance(s.loss_mask, list) or any(m not in (0, 1) for m in s.loss_mask)):
        return "loss_mask must be a list of 0/1 entries, one per response token"
    try:
        s.validate()
    except ConfigError as e:
        return str(e)
    if s.response_length == 0:
        return "response_length is 0: there is no response to learn"
    if s.prompt_length == 0:
        return "the prompt is empty (response_length == len(tokens)): the first response token needs a prompt token"
    if s.loss_mask is not None and not any(s.loss_mask):
        return "loss_mask is all 0: no token to learn; set 1 on the tokens the model should produce, or drop it"
    if isinstance(s.metadata, dict) and s.metadata.get("infra_failure"):
        return "metadata.infra_failure is set: a rollout cut short by infrastructure is not a demonstration"
    return None


def load_sft_samples(path: str | Path) -> list[Sample]:
    """Read SFT samples from JSONL (one `Sample.to_dict()` per line; blank lines are skipped).

    Fails on the first bad line with a `ConfigError` naming the file, the line and the problem,
    so a broken export is found before minutes of model loading and training.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--sft-data {p}: {'is a directory' if p.is_dir() else 'no such file'}; "
                          "pass a JSONL file with one Sample.to_dict() per line")
    samples: list[Sample] = []
    try:
        for where, data in read_jsonl_objects(p, "--sft-data"):
            where = f"--sft-data {where}"
            try:
                sample = Sample.from_dict(data)
            except (ConfigError, TypeError) as e:
                raise ConfigError(f"{where}: {e}") from None
            problem = sample_problem(sample)
            if problem:
                raise ConfigError(f"{where}: {problem}")
            samples.append(sample)
    except UnicodeDecodeError as e:
        raise ConfigError(f"--sft-data {p}: not UTF-8 text ({e.reason} at byte {e.start}); is it JSONL?") from None
    if not samples:
        raise ConfigError(f"--sft-data {p}: no samples (the file is empty); write one Sample.to_dict() per line")
    return samples


def epoch_batches(rollouts: Sequence[list[Sample]], batch_size: int, steps: int, seed: int) -> Iterator[list[Sample]]:
    """`steps` batches (flat sample lists): each epoch a fresh seeded shuffle cut into batches of
    `batch_size` rollouts, the last one possibly short, so no rollout appears twice in a step."""
    rng = random.Random(seed)
    done = 0
    while True:
        order = list(range(len(rollouts)))
        rng.shuffle(order)
        for i in range(0, len(order), batch_size):
            if done == steps:
                return
            yield [s for k in order[i : i + batch_size] for s in rollouts[k]]
            done += 1


# ---- flags and output directory --------------------------------------------------------------


def check_sft_flags(args: Any) -> None:
    """The flag checks that need no data or model, so `vime sft` fails before any real work."""
    if not args.hf_checkpoint:
        raise ConfigError("vime sft needs --hf-checkpoint (the model to start from)")
    if not args.save:
        raise ConfigError("vime sft needs --save (the directory to write the trained model to)")
    out = Path(args.save)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--save {out} already exists and is not an empty directory; "
                          "SFT writes a new model directory: pick a new path or remove it")


def _trainer_args(args: Any, total_steps: int) -> Any:
    """A copy of `args` for `Trainer`: the SFT loss at temperature 1, one optimizer step per
    `train_step` call (the caller makes the batches), and a schedule `total_steps` long."""
    return args.replace(loss_type="sft_loss", use_kl_loss=False, kl_coef=0.0, kl_loss_coef=0.0, entropy_coef=0.0,
                        use_tis=False, use_mis=False, rollout_temperature=1.0, global_batch_size=None,
                        rollout_batch_size=None, num_rollout=total_steps)


def _sft_copy(s: Sample) -> Sample:
    """The sample as SFT trains it: without rollout log-probs (a step must be uniform in them)
    or rewards (SFT has none to read)."""
    return dataclasses.replace(s, rollout_log_probs=None, reward=None)


def _save_model(trainer: Any, out: Path, info: dict[str, Any]) -> None:
    """Collective: gather the weights; rank 0 writes an HF model directory to `out` atomically."""
    from torch import distributed as dist

    from vime.train import distributed as dist_utils
    from vime.train.checkpoint import save_hf_weights

    weights = trainer.full_state_dict()
    if dist_utils.rank() == 0:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        try:
            tmp.chmod(0o755)
            save_hf_weights(trainer.model.config, weights, tmp, source=trainer.model_path)
            if not (tmp / "tokenizer_config.json").exists():  # a hub id: nothing local to copy
                from transformers import AutoTokenizer

                AutoTokenizer.from_pretrained(trainer.model_path).save_pretrained(tmp)
            (tmp / "sft.json").write_text(json.dumps(info, indent=2) + "\n")
            os.replace(tmp, out)  # replaces an empty directory; fails on a non-empty one (it appeared meanwhile)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    if dist_utils.world_size() > 1:
        dist.barrier()


# ---- the run ---------------------------------------------------------------------------------


def run_sft(args: Any, samples: Sequence[Sample]) -> SftResult:
    """Train `args.hf_checkpoint` on `samples` and save the model to `args.save`.

    Collective under torchrun: every rank passes the same samples; rank 0 writes the model.
    Raises `ConfigError` (before loading the model where it can) for unusable flags or samples.
    """
    from vime.train.batching import group_rollouts
    from vime.train.trainer import Trainer

    t0 = time.monotonic()
    check_sft_flags(args)
    if not samples:
        raise ConfigError("vime sft: no samples to train on")
    for i, s in enumerate(samples):
        problem = sample_problem(s)
        if problem:
            raise ConfigError(f"vime sft: sample #{i}: {problem}")
    rollouts = group_rollouts([_sft_copy(s) for s in samples])
    if args.global_batch_size is not None and args.global_batch_size > len(rollouts):
        raise ConfigError(f"--global-batch-size {args.global_batch_size} is more than the {len(rollouts)} "
                          "rollouts in the SFT data; use at most that many")
    batch_size = args.global_batch_size or min(DEFAULT_GLOBAL_BATCH_SIZE, len(rollouts))
    per_epoch = math.ceil(len(rollouts) / batch_size)
    steps = args.sft_num_steps or (args.num_epoch or 1) * per_epoch
    ignored = [f"--{n.replace('_', '-')}" for n in IGNORED_FLAGS if getattr(args, n)]
    if ignored:
        log.warning("sft ignores these flags", flags=ignored)

    trainer = Trainer(_trainer_args(args, steps))
    vocab = trainer.model.config.vocab_size
    for i, s in enumerate(samples):
        if max(s.tokens) >= vocab:
            raise ConfigError(f"vime sft: sample #{i} has token id {max(s.tokens)}, but --hf-checkpoint "
                              f"{args.hf_checkpoint} has {vocab} ids; were the traces tokenized for another model?")
    log.info("sft start", model=str(args.hf_checkpoint), samples=len(samples), rollouts=len(rollouts),
             global_batch_size=batch_size, steps=steps, epochs=round(steps / per_epoch, 2), lr=args.lr)
    losses: list[float] = []
    for step, batch in enumerate(epoch_batches(rollouts, batch_size, steps, args.seed), 1):
        m = trainer.train_step(batch).metrics
        losses.append(float(m["loss"]))
        log.info("sft step", step=step, steps=steps, loss=round(losses[-1], 5), grad_norm=round(m["grad_norm"], 4),
                 lr=m["lr"], tokens_per_second=round(m["train_tokens_per_second"]))

    out = Path(args.save)
    info = {"base_model": str(args.hf_checkpoint), "sft_data": args.sft_data,
            "samples": len(samples), "rollouts": len(rollouts), "global_batch_size": batch_size, "steps": steps,
            "lr": args.lr, "seed": args.seed, "first_loss": losses[0], "last_loss": losses[-1]}
    _save_model(trainer, out, info)
    seconds = time.monotonic() - t0
    log.info("sft saved", path=str(out), steps=steps, first_loss=losses[0], last_loss=losses[-1],
             seconds=round(seconds, 1))
    return SftResult(steps, losses[0], losses[-1], out, seconds, losses)


def main(args: Any) -> int:
    """`vime sft`: check the flags, read `--sft-data`, train, print the saved model's directory."""
    check_sft_flags(args)
    if not args.sft_data:
        raise ConfigError("vime sft needs --sft-data (JSONL, one Sample.to_dict() per line)")
    result = run_sft(args, load_sft_samples(args.sft_data))
    print(result.save_dir)  # stdout is the model directory alone, for scripts; the log has the losses
    return 0
