"""Each run's config, for workers that serve many runs.

A run's config is its flags parsed into `VimeArgs` (the typed config every hook receives as its
slime-style `args`). The training workflow carries the flags in its input (`vime config` writes
them) and records them in the store when it starts (`register_run`), so a worker reads the config
of any run by its id: one pool of long-lived workers serves any number of runs.

A worker started with a run's own flags (as `vime train` starts them) keeps using those for that
run: they hold where this launch's engines listen now, which a run's recorded flags from an
earlier launch may not; it also takes them for a run that nothing recorded (a benchmark's runs,
an older launcher's). Everything else a worker owns stays the worker's, whatever the run says:
its store, its Temporal address and namespace, and its task queues.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

from vime.config.args import VimeArgs, parse_args
from vime.errors import ConfigError
from vime.config.preflight import preflight

WORKER_FLAGS = {"store_url": "--store-url", "temporal_address": "--temporal-address",
                "temporal_namespace": "--temporal-namespace", "rollout_task_queue": "--rollout-task-queue",
                "trainer_task_queue": "--trainer-task-queue", "sandbox_task_queue": "--sandbox-task-queue"}
"""The flags that name what the worker itself is connected to (they override a run's)."""


def serves_own_run(args: VimeArgs) -> bool:
    """Whether a worker was started with a run's flags (a model), not only its connections."""
    return bool(args.hf_checkpoint)


def worker_overrides(args: VimeArgs) -> list[str]:
    """The worker's own connection flags, to append to a run's recorded flags."""
    out: list[str] = []
    for name, flag in WORKER_FLAGS.items():
        value = getattr(args, name)
        if value:
            out += [flag, str(value)]
    return out


def stored_config(args: VimeArgs) -> dict[str, Any]:
    """The config kept with a run in the store (everything but the inlined `--vllm-config` file)."""
    return {k: v for k, v in args.to_dict().items() if k != "vllm_config_data"}


def args_from_stored(config: dict[str, Any], **overrides: Any) -> VimeArgs:
    """`VimeArgs` from a run's stored config (`stored_config`) with `overrides`: a field the run's
    vime did not have yet takes its default; one it had and this vime dropped is left out."""
    known = {f.name for f in dataclasses.fields(VimeArgs)}
    return VimeArgs(**{k: v for k, v in {**config, **overrides}.items() if k in known}).read_only()


class RunArgs:
    """`args(run_id)`: the run's `VimeArgs` (cached per recorded flags) and what is built from them."""

    def __init__(self, worker_args: VimeArgs, read_argv: Callable[[str], list[str] | None]) -> None:
        self.worker_args = worker_args
        self._read_argv = read_argv
        self._cache: dict[str, tuple[list[str], VimeArgs]] = {}
        self._derived: dict[tuple[str, str], tuple[VimeArgs, Any]] = {}
        self._lock = threading.Lock()

    def _own(self, run_id: str) -> bool:
        return serves_own_run(self.worker_args) and run_id == self.worker_args.run_id

    def args(self, run_id: str) -> VimeArgs:
        """The config of run `run_id` (`ConfigError` if no workflow or launcher has recorded it)."""
        if self._own(run_id):
            return self.worker_args
        argv = self._read_argv(run_id)
        if not argv and serves_own_run(self.worker_args):  # a run started without its flags (a bench, a
            return self.worker_args  # test, an older launcher): the worker's flags are its config, as ever
        if not argv:
            raise ConfigError(
                f"run {run_id!r} is not recorded in this worker's store ({self.worker_args.store_url}): start it "
                "with the JSON of `vime config` (its workflow records it), or give the worker the run's flags")
        with self._lock:
            cached = self._cache.get(run_id)
            if cached is not None and cached[0] == argv:
                return cached[1]
        parsed = self._parse(run_id, argv)
        with self._lock:
            self._cache[run_id] = (argv, parsed)
        return parsed

    def checked(self, run_id: str, argv: list[str], evaluation: bool = False) -> VimeArgs:
        """A starting run's flags as this worker will read them, checked as `vime train` checks
        them before it starts anything (paths, data, hooks): one `ConfigError` line, before the
        run is recorded or a trainer is leased to it. The worker's own run was checked by its
        launcher, and so was a `vime eval` run (`evaluation`: parsed only; it has eval sets, no
        --prompt-data, and its launch holds its run directory)."""
        if self._own(run_id):
            return self.worker_args
        args = self._parse(run_id, argv)
        try:
            if not evaluation:
                preflight(args)
        except ConfigError as e:
            raise ConfigError(f"run {run_id!r}: {e}") from None
        return args

    def _parse(self, run_id: str, argv: list[str]) -> VimeArgs:
        try:
            return parse_args([*argv, *worker_overrides(self.worker_args)])
        except ConfigError as e:
            raise ConfigError(f"run {run_id!r}: its flags: {e}") from None

    def derived(self, run_id: str, name: str, build: Callable[[VimeArgs], Any]) -> Any:
        """`build(args)` for the run, kept until its config changes (a data source, a tokenizer)."""
        args = self.args(run_id)
        with self._lock:
            kept = self._derived.get((run_id, name))
            if kept is not None and kept[0] is args:
                return kept[1]
        value = build(args)
        with self._lock:
            self._derived[(run_id, name)] = (args, value)
        return value


def run_configs(worker_args: VimeArgs) -> Callable[[Any], RunArgs]:
    """For `TrainerGroup(args, run_configs(args))`: each run's config read by run id from the store
    the group opens (the trainer, below this layer, never parses flags itself)."""
    return lambda store: RunArgs(worker_args, store.run_argv)
