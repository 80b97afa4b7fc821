"""Checkpoints: HF-format weights (transformers and vLLM load them) + optimizer + run state.

Layout under `--save`:
    step_000012/   model.safetensors, config.json, tokenizer files   (an HF model directory)
                   trainer.pt      optimizer, LR schedule, RNG
                   state.json      {"step", "weight_version", "data_position", ...}
                   adapter/        with --lora-rank: the adapter in peft's format (adapter_config.json,
                                   adapter_model.safetensors); the HF weights above only with
                                   --lora-save-merged (base + adapter merged)
    latest         the name of the newest complete checkpoint

A checkpoint is written to a temporary directory and renamed into place, and `latest` is
replaced atomically afterwards, so a crash mid-save never leaves a half-written checkpoint
that `--load` would pick up.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vime.errors import ConfigError

if TYPE_CHECKING:
    import torch

# torch (and the trainer's modules that import it) are imported where weights move, not here:
# the launcher and the CLI read `latest` and state.json through this module, and a torch import
# costs them ~2 s of start-up.

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "generation_config.json")


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def latest_checkpoint(root: str | Path | None) -> Path | None:
    """The newest complete checkpoint under `root`, or None when there is none."""
    if not root:
        return None
    marker = Path(root) / "latest"
    if not marker.exists():
        return None
    path = Path(root) / marker.read_text().strip()
    if not (path / "state.json").exists():
        raise ConfigError(f"--load {root}: 'latest' names {path.name}, which is incomplete; "
                          "point 'latest' at a complete step_* directory or remove it")
    return path


def read_state(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / "state.json").read_text())


def save_checkpoint(trainer, root: str | Path, state: dict[str, Any]) -> Path | None:
    """Collective: gather weights and optimizer state; rank 0 writes `step_<state["step"]>`."""
    import torch
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from vime.train import distributed as dist_utils
    from vime.train.lora import ADAPTER_DIR, save_adapter

    lora = getattr(trainer, "lora", None)
    lora_on = lora is not None and lora.enabled
    merged = not lora_on or bool(trainer.args.lora_save_merged)
    weights = trainer.full_state_dict() if merged else {}
    adapter = trainer.adapter_state_dict() if lora_on else {}
    optim = get_optimizer_state_dict(trainer.model, trainer.optimizer,
                                     options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist_utils.rank() != 0:
        return None
    final = step_dir(root, int(state["step"]))
    if (final / "state.json").exists():
        return final  # idempotent: a retried save of the same step
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if merged:
        save_hf_weights(trainer.model.config, weights, tmp, source=trainer.model_path)
    if lora_on:
        save_adapter(lora, adapter, tmp / ADAPTER_DIR, base_model=trainer.model_path)
    torch.save({"optimizer": optim, "scheduler": trainer.scheduler.state_dict(),
                "rng": torch.get_rng_state(), "trainer_step": trainer.step}, tmp / "trainer.pt")
    (tmp / "state.json").write_text(json.dumps(state, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    marker_tmp = Path(root) / "latest.tmp"
    marker_tmp.write_text(final.name)
    os.replace(marker_tmp, Path(root) / "latest")
    return final


def save_hf_weights(config, weights: dict[str, torch.Tensor], out: Path, *, source: str | Path | None = None) -> None:
    """An HF model directory: config, safetensors weights, tokenizer files copied from `source`."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous() for k, v in weights.items()}
    if getattr(config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)  # the tie is in the config; the head is the embedding
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    if source:
        for name in TOKENIZER_FILES:
            if (Path(source) / name).exists():
                shutil.copy2(Path(source) / name, out / name)


def load_checkpoint(trainer, path: str | Path) -> dict[str, Any]:
    """Collective: load weights, optimizer and schedule from `path` into every rank; return state.json."""
    import torch
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    from vime.train.lora import ADAPTER_DIR, ADAPTER_NAME, adapter_rank, load_adapter, trainer_adapter_keys

    path = Path(path)
    if not (path / "state.json").exists():
        raise ConfigError(f"--load {path}: not a vime checkpoint (no state.json)")
    full = StateDictOptions(full_state_dict=True)
    lora = getattr(trainer, "lora", None)
    if lora is not None and lora.enabled:
        # The base stays the run's --hf-checkpoint, frozen; only the adapter resumes.
        adapter = trainer_adapter_keys(load_adapter(path / ADAPTER_DIR), getattr(trainer, "adapter", ADAPTER_NAME))
        set_model_state_dict(trainer.model, adapter, options=StateDictOptions(full_state_dict=True, strict=False))
    else:
        if not (path / "model.safetensors").exists() and (path / ADAPTER_DIR).exists():
            raise ConfigError(f"--load {path}: a LoRA checkpoint (adapter only); resume it with the run's "
                              f"--lora-rank {adapter_rank(path / ADAPTER_DIR)}")
        weights = load_file(str(path / "model.safetensors"))
        if "lm_head.weight" not in weights and getattr(trainer.model.config, "tie_word_embeddings", False):
            weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()  # two keys, two tensors
        set_model_state_dict(trainer.model, weights, options=full)
    extra = torch.load(path / "trainer.pt", weights_only=False)
    set_optimizer_state_dict(trainer.model, trainer.optimizer, extra["optimizer"], options=full)
    trainer.scheduler.load_state_dict(extra["scheduler"])
    torch.set_rng_state(extra["rng"])
    state = read_state(path)
    trainer.step = int(state["step"])
    return state
