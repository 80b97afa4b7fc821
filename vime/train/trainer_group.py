"""A trainer process group as one object: rank 0 calls, every rank executes.

Rank 0 serves the trainer's Temporal task queue; ranks 1..N-1 run `follow()`, waiting for the
commands rank 0 broadcasts. Each command names a method of `TrainerGroup` and its (small,
picklable) arguments: run ids, step numbers, paths, versions. Every rank reads the samples it needs from
the store itself, so no token data crosses the broadcast.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from vime.errors import ConfigError
from vime.log import get_logger
from vime.rollout.policy_check import stale_report
from vime.store import SampleStore
from vime.train import distributed as dist_utils
from vime.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from vime.train.tenants import SharedBase, Tenant, base_key, shares_base, tenant_trainer
from vime.train.trainer import PART_APPLIED, Trainer
from vime.types import Sample

log = get_logger(__name__)

PROBE_TOKENS = 24


def sample_keys(samples: list[Sample]) -> list[str]:
    """Store keys (`<rollout id>/<sibling>`) of samples read rollout by rollout, siblings in order."""
    seen: dict[str, int] = {}
    keys = []
    for s in samples:
        i = seen.get(str(s.rollout_id), 0)
        seen[str(s.rollout_id)] = i + 1
        keys.append(f"{s.rollout_id}/{i}")
    return keys


def trainable(sample: Sample) -> bool:
    """Whether the loss uses `sample`: it has prompt and response tokens, did not fail and was not
    aborted (an aborted sample is unscored; runs recorded before the rollout activity regenerated
    such groups hold some in their manifests)."""
    failed = (sample.status in (Sample.Status.FAILED, Sample.Status.ABORTED)
              or (sample.metadata or {}).get("infra_failure"))
    return not failed and sample.response_length > 0 and sample.prompt_length > 0


class NotAttached(RuntimeError):
    """A command for a run this trainer does not hold (it was attached to another since)."""


class TrainerGroup:
    """The trainer state of this rank and the commands that change it (collective)."""

    def __init__(self, args: Any, runs: Callable[[SampleStore], Any]) -> None:
        """`args`: the worker's config; `runs(store)` gives what reads each run's config by run id
        (`vime.config.run_args.RunArgs`: the worker passes it in, the trainer does not parse flags)."""
        self.args = args
        self.store = SampleStore.open(args.store_url)
        self.runs = runs(self.store)
        # A trainer started with a run's flags (a model) loads it now; a long-lived one, on attach.
        self.preloaded: Trainer | None = Trainer(args) if args.hf_checkpoint else None
        # A long-lived trainer holds LoRA runs of one base side by side (`vime.train.tenants`).
        self.shared = not args.hf_checkpoint
        self.base: SharedBase | None = None
        self.tenants: dict[str, Tenant] = {}

    def args_of(self, run_id: str | None) -> Any:
        """The config of a held run (of the one held when `run_id` is None: an old workflow's call)."""
        if run_id is None or run_id in self.tenants:
            return self.tenant(run_id).args
        return self.runs.args(run_id)

    def step_of(self, run_id: str) -> int:
        held = self.tenants.get(run_id)
        return held.trainer.step if held is not None else 0

    def can_share(self, run_ids: list[str]) -> bool:
        """Whether these runs can be held side by side (LoRA runs of one base, `shares_base`)."""
        if not self.shared:
            return False
        configs = [self.runs.args(r) for r in run_ids]
        return all(shares_base(a) for a in configs) and len({base_key(a) for a in configs}) == 1

    # rank 0 entry point
    def call(self, name: str, *payload: Any) -> Any:
        dist_utils.broadcast_object((name, payload))
        return getattr(self, name)(*payload)

    def follow(self) -> None:
        """Ranks > 0: execute rank 0's commands until it sends `stop`."""
        while True:
            name, payload = dist_utils.broadcast_object(None)
            if name == "stop":
                dist_utils.shutdown()
                return
            getattr(self, name)(*payload)

    def stop(self) -> None:
        """Rank 0: release the followers, then leave the process group with them.

        Under torchrun a SIGTERM reaches every rank at once, and a follower waiting for a command
        ends there: rank 0 then has nobody to stop, which is one log line, not a traceback."""
        try:
            dist_utils.broadcast_object(("stop", ()))
        except RuntimeError as e:  # gloo: "Connection reset by peer"; NCCL: a failed collective
            log.warning("trainer.followers_gone", error=str(e).splitlines()[0][:200])
            return
        dist_utils.shutdown()

    # ---- commands ----------------------------------------------------------------------------

    def attach(self, run_id: str, step: int, checkpoint: str | None, current: int | None = None) -> int:
        """Bring the run's weights to `step` (a checkpoint's, or the initial ones at 0); return the step.

        A run already held at `step`, or at `current` (the steps the run has trained), keeps its
        state and that step is returned: the workflow re-attached after a transient error, or
        continued as new, and replays nothing (a 130-step run without a checkpoint stood 26 s at
        step 71 replaying 70 steps after a continue-as-new). Otherwise a LoRA run on a long-lived
        trainer becomes a tenant of the shared base (a fresh adapter, then its checkpoint); any
        other run gets the whole trainer: what was held is freed before its model loads (the
        worker's own run reuses the model loaded at start).
        """
        run_args = self.runs.args(run_id)
        held = self.tenants.get(run_id)
        if held is not None and held.args is run_args and held.trainer.step in (step, current):
            return held.trainer.step
        if not checkpoint and step != 0:
            raise ValueError(f"attach: step {step} without a checkpoint")
        if self.shared and shares_base(run_args):
            tenant = self._join(run_id, run_args)
        else:
            tenant = Tenant(run_id, run_args, self._whole_trainer(run_id, run_args, checkpoint))
        if checkpoint:
            with tenant.active() as trainer:
                load_checkpoint(trainer, checkpoint)
        self.tenants[run_id] = tenant
        return tenant.trainer.step

    def _join(self, run_id: str, run_args: Any) -> Tenant:
        """A fresh tenant for the run on the shared base, which is loaded first if it is not the run's."""
        if self.base is None or not self.base.fits(run_args) or any(t.trainer.base is None for t in self.tenants.values()):
            self.tenants.clear()
            self.base = None  # the old model is freed before the new one loads
            self.base = SharedBase(run_args)
        self.release(run_id)
        return tenant_trainer(run_args, run_id, self.base)

    def _whole_trainer(self, run_id: str, run_args: Any, checkpoint: str | None) -> Trainer:
        """The run's own trainer: the one it held (or the worker's, loaded at start) when it has
        the same config and is pristine or about to load a checkpoint, else a fresh one."""
        keep = None
        held = self.tenants.get(run_id)
        if held is not None and held.args is run_args and held.trainer.base is None:
            keep = held.trainer if checkpoint or held.trainer.step == 0 else None
        elif not self.tenants and self.preloaded is not None and run_args is self.args:
            keep = self.preloaded
        self.tenants.clear()
        self.base = self.preloaded = None  # the old model is freed before the new one loads
        return keep if keep is not None else Trainer(run_args)

    def release(self, run_id: str) -> None:
        """Free a tenant's adapter and optimizer state (its run ended); a whole trainer stays loaded."""
        held = self.tenants.get(run_id)
        if held is not None and held.trainer.base is not None:
            del self.tenants[run_id]
            held.trainer.base.remove(held.trainer.adapter)

    def tenant(self, run_id: str | None) -> Tenant:
        """The held run `run_id` (the one held when None: an old workflow's call); `NotAttached` otherwise."""
        if run_id is None and len(self.tenants) == 1:
            return next(iter(self.tenants.values()))
        held = self.tenants.get(run_id)
        if held is None:
            raise NotAttached(f"this trainer holds {sorted(self.tenants) or 'no run'}, not run {run_id!r}: attach again")
        return held

    def train_step(self, run_id: str, step: int) -> dict[str, float]:
        """Train rollout step `step` on its manifest; a repeat of the last step returns its metrics.

        Only the samples the loss uses are marked trained: a failed sample (an infrastructure
        failure, an error before the first token) is never marked, so the store's trained counts
        are what the model actually learned from.
        """
        tenant = self.tenant(run_id)
        with tenant.active() as trainer:
            if step + 1 == trainer.step and step in tenant.results:
                return tenant.results[step].metrics
            if step != trainer.step:
                raise RuntimeError(f"trainer is at step {trainer.step}, asked to train step {step}")
            t0 = time.monotonic()
            stored = self.store.read_step_samples(run_id, step)
            loaded = time.monotonic() - t0
            keyed = [(key, s) for key, s in zip(sample_keys(stored), stored) if trainable(s)]
            samples = [s for _, s in keyed]
            self._refuse_stale(run_id, step, samples)
            if not samples:
                raise ConfigError(f"step {step} of run {run_id!r} has no trainable sample (every one failed or is "
                                  f"empty); nothing to train on")
            try:
                result = trainer.train_step(samples)
            except BaseException:
                trainer.step = PART_APPLIED  # an optimizer step may have gone in: no re-attach keeps these weights
                raise
        if dist_utils.rank() == 0:
            t0 = time.monotonic()
            self.store.mark_trained(run_id, [key for key, _ in keyed], step)
            result.metrics.update({"perf/train_load_s": loaded, "perf/train_mark_trained_s": time.monotonic() - t0})
        tenant.results = {step: result}
        return result.metrics

    def _refuse_stale(self, run_id: str, step: int, samples: list) -> None:
        """The last line of the on-policy guarantee: a step never trains a sample sampled under
        weights older than the version its manifest records (the rollout activities re-sample
        such groups before storing them; see `vime.rollout.policy_check`)."""
        manifest = self.store.read_step_manifest(run_id, step)
        report = stale_report(samples, manifest.weight_version if manifest is not None else 0)
        if report:
            raise ConfigError(f"step {step} of run {run_id!r}: {report}; not training on them (a rollout "
                              "environment stored them without vime's version check)")

    def state_dict_and_probe(self, run_id: str | None = None) -> tuple[dict, list[int], list[float]]:
        """Full weights (rank 0) and the trainer's logprobs of a fixed probe sequence."""
        with self.tenant(run_id).active() as trainer:
            return (trainer.full_state_dict(), *self._probe(trainer))

    def adapter_and_probe(self, run_id: str | None = None) -> tuple[dict, dict, list[int], list[float], int]:
        """A LoRA run's sync: the adapter (rank 0) and its peft config, the trainer's probe
        logprobs (through the adapter), and the bytes of the full weights a full sync would move
        (counted from the parameters' shapes, nothing gathered)."""
        from vime.train.lora import adapter_config

        with self.tenant(run_id).active() as trainer:
            adapter = trainer.adapter_state_dict()
            config = adapter_config(trainer.lora, trainer.model_path)
            full_bytes = sum(p.numel() * p.element_size() for n, p in trainer.model.named_parameters()
                             if "lora_" not in n)
            return (adapter, config, *self._probe(trainer), int(full_bytes))

    @staticmethod
    def _probe(trainer: Trainer) -> tuple[list[int], list[float]]:
        import torch

        vocab = trainer.model.config.vocab_size
        probe = [(7919 * i + 13) % vocab for i in range(PROBE_TOKENS)]
        ids = torch.tensor([probe], device=trainer.device)
        with torch.no_grad():
            logits = trainer.model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        expected = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0].tolist()
        return probe, expected

    def save(self, root: str, state: dict) -> str | None:
        with self.tenant(state["run_id"]).active() as trainer:
            path = save_checkpoint(trainer, root, state)
        return str(path) if path else None

    def latest(self, root: str | None) -> str | None:
        path = latest_checkpoint(root)
        return str(path) if path else None
