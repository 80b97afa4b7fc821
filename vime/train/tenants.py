"""Several LoRA runs on one long-lived trainer: the base model is held once, each run trains its own adapter.

A long-lived trainer (`python -m workers.trainer` started with connections only) used to hold one
run at a time: a second run waited for the first to end. LoRA runs of the same base model need not
wait: the base is frozen, so the runs differ only in their adapters (a few megabytes each). Here
each run is a *tenant*: a peft adapter of its own on the one shared `SharedBase` model, with its own
`Trainer` (its flags, AdamW state over its adapter only, LR schedule, step count and last step's
result) and its own random-number stream.

A run's update does not depend on the others: before each of its commands the trainer makes its
adapter the active one (the others get no gradient and take no part in the forward pass) and puts
back its random-number state (LoRA dropout), and a reference pass switches every adapter off (the
frozen base). `tests/test_tenants.py` holds a run trained between two others to the same adapter,
to 1e-6, as the same run trained alone.

Which runs share (`shares_base`): LoRA runs that sync only their adapter, of one `--hf-checkpoint`
with the same gradient checkpointing and no separate `--ref-load`, on a single-rank trainer. Under FSDP2 (2+ ranks) the
adapters would have to exist before the model is sharded, so a multi-rank trainer still serves
one run at a time; so does every full fine-tune.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from vime.engine.weight_sync.lora_serving import adapter_sync
from vime.train import distributed as dist_utils
from vime.train.lora import LoraConfig, wrap
from vime.train.trainer import StepResult, Trainer, load_causal_lm, policy_dtype


def shares_base(args: Any) -> bool:
    """Whether a run's trainer state can be a tenant of a shared base (see the module's docstring).
    Only a run that syncs its adapter alone (`adapter_sync`) qualifies: one that pushed merged
    weights would change the base under every other run's rollouts."""
    return (adapter_sync(args) and dist_utils.world_size() == 1
            and args.ref_load in (None, "", args.hf_checkpoint))


def base_key(args: Any) -> tuple[str, bool]:
    """What two runs must agree on to share a base model."""
    return str(args.hf_checkpoint), bool(args.gradient_checkpointing)


def tenant_adapter(run_id: str) -> str:
    """The peft adapter name of a run: peft's module keys take no dots, so the run id is reduced to
    letters, digits and underscores, with a hash of the whole id to keep two runs apart."""
    digest = hashlib.sha1(run_id.encode()).hexdigest()[:8]
    return f"run_{re.sub(r'[^A-Za-z0-9_]', '_', run_id)[:48]}_{digest}"


class SharedBase:
    """One frozen base model, loaded once, that carries the adapters of every tenant."""

    def __init__(self, args: Any) -> None:
        self.key = base_key(args)
        self.device = dist_utils.init_distributed()
        self.dtype = policy_dtype(self.device)
        self.path = args.hf_checkpoint
        self._hf = load_causal_lm(self.path, self.device, self.dtype, trainable=True,
                                  gradient_checkpointing=args.gradient_checkpointing, shard=False)
        if args.gradient_checkpointing:
            self._hf.enable_input_require_grads()  # frozen embeddings: checkpointed layers still need a graph
        self.model: torch.nn.Module | None = None  # the peft model, made with the first adapter
        self.adapters: set[str] = set()

    def fits(self, args: Any) -> bool:
        return base_key(args) == self.key

    def add_adapter(self, name: str, config: LoraConfig, *, seed: int) -> torch.nn.Module:
        """A fresh adapter `name` (initialised from `seed` alone, whatever ran before) on the base;
        returns the peft model that carries every adapter."""
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            if self.model is None:
                self.model = wrap(self._hf, config, adapter=name)
            else:
                self.model.add_adapter(name, config.peft_config())
        self.model.to(self.device)
        self.adapters.add(name)
        self.activate(name)
        return self.model

    def activate(self, name: str) -> None:
        """Make `name` the adapter the forward passes use and the only one with gradients."""
        if self.model is not None and self.model.active_adapter != name:
            self.model.set_adapter(name)
        self.model.train(True)

    def remove(self, name: str) -> None:
        """Free a tenant's adapter (its run ended, or it is attached afresh)."""
        if self.model is not None and name in self.adapters:
            self.model.delete_adapter(name)
        self.adapters.discard(name)


@dataclass
class Tenant:
    """One run's trainer state on this trainer: its flags, `Trainer`, last step's result, RNG."""

    run_id: str
    args: Any
    trainer: Trainer
    results: dict[int, StepResult] = field(default_factory=dict)
    rng: torch.Tensor | None = None  # the CPU generator's state between this run's commands

    @contextlib.contextmanager
    def active(self) -> Iterator[Trainer]:
        """Within it, the trainer computes as this run: its adapter active, its random stream."""
        base = self.trainer.base
        if base is None:
            yield self.trainer
            return
        base.activate(self.trainer.adapter)
        if self.rng is not None:
            torch.set_rng_state(self.rng)
        try:
            yield self.trainer
        finally:
            self.rng = torch.get_rng_state()


def tenant_trainer(args: Any, run_id: str, base: SharedBase) -> Tenant:
    """A run's fresh tenant on `base`."""
    trainer = Trainer(args, base=base, adapter=tenant_adapter(run_id))
    return Tenant(run_id, args, trainer, rng=torch.Generator().manual_seed(args.seed).get_state())
