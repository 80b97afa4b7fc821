"""LoRA (`--lora-rank` > 0): the policy is the base checkpoint plus a peft adapter, and only the
adapter trains.

peft wraps the HF model before FSDP2 shards it (`wrap`): its `lora.Linear` modules sit inside the
decoder layers, so `fully_shard` on each layer shards base and adapter weights alike, the frozen
base weights simply get no gradient. The trainer's state dict then has peft's names
(`base_model.model.<hf name>` with `.base_layer.` and `.lora_A.default.`); the functions here turn
it into the two things the rest of vime reads:

- `adapter_weights`: the adapter in peft's file format (`adapter_model.safetensors` keys, the
  adapter name dropped), which `PeftModel.from_pretrained` and vLLM's `--enable-lora` load;
- `merged_weights`: plain HF weights with the adapter folded in (W + B A x alpha/r), so everything
  that moves or saves full weights (the full-weight sync, `verify_sync`, merged checkpoints) works
  unchanged on a LoRA run.

Invariant: every function is pure on CPU tensors; peft is imported only when LoRA is on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ADAPTER_NAME = "default"  # peft's name for the one adapter of a model
PEFT_PREFIX = "base_model.model."
ADAPTER_DIR = "adapter"  # a checkpoint's adapter, beside its state.json
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


@dataclass(frozen=True)
class LoraConfig:
    """`--lora-*` and `--target-modules`; `rank == 0` is LoRA off."""

    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("all-linear",)

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_args(cls, args: Any) -> LoraConfig:
        return cls(rank=int(args.lora_rank), alpha=float(args.lora_alpha), dropout=float(args.lora_dropout),
                   target_modules=tuple(args.target_modules or ["all-linear"]))

    def peft_config(self):
        from peft import LoraConfig as PeftLoraConfig

        targets: str | list[str] = (self.target_modules[0] if self.target_modules == ("all-linear",)
                                    else list(self.target_modules))
        return PeftLoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
                              target_modules=targets, bias="none", task_type="CAUSAL_LM")


def adapter_config(config: LoraConfig, base_model: str | Path) -> dict[str, Any]:
    """The adapter's `adapter_config.json`, as peft writes it."""
    peft_config = config.peft_config()
    peft_config.base_model_name_or_path = str(base_model)
    return peft_config.to_dict()


def wrap(model: torch.nn.Module, config: LoraConfig, adapter: str = ADAPTER_NAME) -> torch.nn.Module:
    """The HF model with a fresh adapter named `adapter` (lora_B zero: the policy starts as the
    base); only the adapter's parameters require grad."""
    from peft import get_peft_model

    return get_peft_model(model, config.peft_config(), adapter_name=adapter)


def decoder_layers(model: torch.nn.Module):
    """The decoder layers FSDP2 shards one by one, through a peft wrapper or not."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model.layers


def _lora_key(key: str, adapter: str = ADAPTER_NAME) -> tuple[str, str] | None:
    """('<module path>', 'A' or 'B') for a peft lora weight key of `adapter`."""
    for part in ("A", "B"):
        tail = f".lora_{part}.{adapter}.weight"
        if key.endswith(tail):
            return key[: -len(tail)], part
    return None


def is_adapter_key(key: str, adapter: str | None = None) -> bool:
    """Whether `key` is a LoRA weight (of `adapter`, or of any adapter when None)."""
    parts = key.split(".")
    lora = any(p.startswith("lora_") for p in parts)
    return lora and (adapter is None or adapter in parts)


def adapter_weights(state: dict[str, torch.Tensor], adapter: str = ADAPTER_NAME) -> dict[str, torch.Tensor]:
    """`adapter`'s tensors under the keys of peft's `adapter_model.safetensors`."""
    out = {}
    for key, value in state.items():
        hit = _lora_key(key, adapter)
        if hit is not None:
            out[f"{hit[0]}.lora_{hit[1]}.weight"] = value.detach().contiguous()
    return out


def trainer_adapter_keys(adapter: dict[str, torch.Tensor], name: str = ADAPTER_NAME) -> dict[str, torch.Tensor]:
    """`adapter_weights`' inverse: file keys back to the trainer's (the adapter's `name` put back)."""
    out = {}
    for key, value in adapter.items():
        for part in ("A", "B"):
            tail = f".lora_{part}.weight"
            if key.endswith(tail):
                out[f"{key[: -len(tail)]}.lora_{part}.{name}.weight"] = value
    return out


def merged_weights(state: dict[str, torch.Tensor], scaling: float,
                   adapter: str = ADAPTER_NAME) -> dict[str, torch.Tensor]:
    """HF weights with `adapter` folded in: W + (B @ A) * scaling, names without peft's (another
    adapter of a shared base is left out)."""
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    base: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        hit = _lora_key(key, adapter)
        if hit is not None:
            pairs.setdefault(hit[0], {})[hit[1]] = value
        elif not is_adapter_key(key):
            base[key] = value
    out = {}
    for key, value in base.items():
        name = key.removeprefix(PEFT_PREFIX)
        if ".base_layer." in name:
            module = key[: key.index(".base_layer.")]
            name = name.replace(".base_layer.", ".")
            ab = pairs.get(module)
            if ab is not None and name.endswith(".weight"):
                delta = (ab["B"].float() @ ab["A"].float()) * scaling
                value = (value.float() + delta).to(value.dtype)
        out[name] = value
    return out


def save_adapter(config: LoraConfig, adapter: dict[str, torch.Tensor], out: str | Path,
                 base_model: str | Path) -> Path:
    """Write `adapter_config.json` and `adapter_model.safetensors` (peft's format) into `out`."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    peft_config = config.peft_config()
    peft_config.base_model_name_or_path = str(base_model)
    peft_config.save_pretrained(str(out))
    save_file(adapter, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    return out


def load_adapter(path: str | Path) -> dict[str, torch.Tensor]:
    """An adapter directory's tensors, under the file's keys; names the missing file otherwise."""
    from safetensors.torch import load_file

    from vime.errors import ConfigError

    path = Path(path)
    if not (path / ADAPTER_WEIGHTS).exists():
        raise ConfigError(f"LoRA adapter {str(path)!r}: no {ADAPTER_WEIGHTS} there; "
                          "a LoRA run's checkpoint keeps its adapter in <step dir>/adapter")
    return load_file(str(path / ADAPTER_WEIGHTS))


def adapter_rank(path: str | Path) -> int:
    return int(json.loads((Path(path) / ADAPTER_CONFIG).read_text())["r"])
