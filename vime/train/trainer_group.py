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
from vime.train.trainer import StepResult, Trainer
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
        self.trainer: Trainer | None = Trainer(args) if args.hf_checkpoint else None
        self.run_id: str | None = None
        self.results: dict[int, StepResult] = {}

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
        """Rank 0: release the followers, then leave the process group with them."""
        dist_utils.broadcast_object(("stop", ()))
        dist_utils.shutdown()

    # ---- commands ----------------------------------------------------------------------------

    def attach(self, run_id: str, step: int, checkpoint: str | None) -> int:
        """Bring the weights to `step` (a checkpoint's, or the initial ones at 0); return the step.

        A trainer already at `step` of the same run keeps its state (the workflow re-attached
        after a transient error); anything else reloads, and another run (of a long-lived trainer)
        loads that run's model with that run's settings.
        """
        run_args = self.runs.args(run_id)
        if self.run_id == run_id and run_args is self.args and self.trainer is not None and self.trainer.step == step:
            return step
        fresh = self.trainer is None or run_args is not self.args  # another run's model and settings
        if fresh:
            self.args, self.trainer = run_args, None  # the old model is freed before the new one loads
            self.trainer = Trainer(run_args)
        if checkpoint:
            load_checkpoint(self.trainer, checkpoint)
        elif step != 0:
            raise ValueError(f"attach: step {step} without a checkpoint")
        elif not fresh and (self.trainer.step != 0 or self.run_id not in (None, run_id)):
            self.trainer = Trainer(self.args)
        self.run_id = run_id
        self.results.clear()
        return self.trainer.step

    def _check_attached(self, run_id: str) -> None:
        if self.trainer is None or self.run_id != run_id:
            raise NotAttached(f"this trainer holds run {self.run_id!r}, not {run_id!r}: attach again")

    def train_step(self, run_id: str, step: int) -> dict[str, float]:
        """Train rollout step `step` on its manifest; a repeat of the last step returns its metrics.

        Only the samples the loss uses are marked trained: a failed sample (an infrastructure
        failure, an error before the first token) is never marked, so the store's trained counts
        are what the model actually learned from.
        """
        self._check_attached(run_id)
        if step + 1 == self.trainer.step and step in self.results:
            return self.results[step].metrics
        if step != self.trainer.step:
            raise RuntimeError(f"trainer is at step {self.trainer.step}, asked to train step {step}")
        t0 = time.monotonic()
        stored = self.store.read_step_samples(run_id, step)
        loaded = time.monotonic() - t0
        keyed = [(key, s) for key, s in zip(sample_keys(stored), stored) if trainable(s)]
        samples = [s for _, s in keyed]
        self._refuse_stale(run_id, step, samples)
        if not samples:
            raise ConfigError(f"step {step} of run {run_id!r} has no trainable sample (every one failed or is "
                              f"empty); nothing to train on")
        result = self.trainer.train_step(samples)
        if dist_utils.rank() == 0:
            t0 = time.monotonic()
            self.store.mark_trained(run_id, [key for key, _ in keyed], step)
            result.metrics.update({"perf/train_load_s": loaded, "perf/train_mark_trained_s": time.monotonic() - t0})
        self.results = {step: result}
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

    def state_dict_and_probe(self) -> tuple[dict, list[int], list[float]]:
        """Full weights (rank 0) and the trainer's logprobs of a fixed probe sequence."""
        weights = self.trainer.full_state_dict()
        return (weights, *self._probe())

    def adapter_and_probe(self) -> tuple[dict, dict, list[int], list[float], int]:
        """A LoRA run's sync: the adapter (rank 0) and its peft config, the trainer's probe
        logprobs (through the adapter), and the bytes of the full weights a full sync would move
        (counted from the parameters' shapes, nothing gathered)."""
        from vime.train.lora import adapter_config

        adapter = self.trainer.adapter_state_dict()
        config = adapter_config(self.trainer.lora, self.trainer.model_path)
        full_bytes = sum(p.numel() * p.element_size() for n, p in self.trainer.model.named_parameters()
                         if "lora_" not in n)
        return (adapter, config, *self._probe(), int(full_bytes))

    def _probe(self) -> tuple[list[int], list[float]]:
        import torch

        vocab = self.trainer.model.config.vocab_size
        probe = [(7919 * i + 13) % vocab for i in range(PROBE_TOKENS)]
        ids = torch.tensor([probe], device=self.trainer.device)
        with torch.no_grad():
            logits = self.trainer.model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        expected = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0].tolist()
        return probe, expected

    def save(self, root: str, state: dict) -> str | None:
        self._check_attached(state["run_id"])
        path = save_checkpoint(self.trainer, root, state)
        return str(path) if path else None

    def latest(self, root: str | None) -> str | None:
        path = latest_checkpoint(root)
        return str(path) if path else None
