"""What a rollout environment declares, and what the training workflow gets back from it.

An environment is one importable module (or package) with a module-level `ENVIRONMENT`:

    ENVIRONMENT = Environment(
        name="my_env",
        group_workflow="MyGroupWorkflow",             # started once per prompt group
        workflows=("my_pkg.workflow:MyGroupWorkflow",),  # registered on the rollout queue
        activities="my_pkg.activities:start",         # EnvContext -> EnvWorkers
        flags=MyFlags,                                # a dataclass of env_flag() fields
    )

`vime train --rollout-env my_pkg.env` (or a built-in's name) makes the rollout workers register
the workflows and activities, and the training workflow start `group_workflow` by its registered
name with a `GroupInput` for every prompt group it wants; the group workflow returns a
`GroupOutput` (its rollout ids and a summary). The training workflow knows nothing else of the
environment: the samples travel through the store, like every other rollout's.

Dotted strings (`module:attr`) are allowed wherever a workflow class or a function goes, so the
module named by `--rollout-env` stays light: the flag parser imports it to learn its flags, and
heavy imports (torch, sandboxes, SDKs) wait for the worker that registers the activities.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vime.envs.contract import GroupInput, GroupOutput

__all__ = ["EnvContext", "EnvWorkers", "Environment", "GroupInput", "GroupOutput", "env_flag"]


def env_flag(default: Any, help: str, **argparse_kwargs: Any) -> Any:
    """A field of an environment's flags dataclass that is also a command-line flag
    (`--field-name`, or `flag="--other"`). Shown under the environment's own `--help` group."""
    meta = {"help": help, "group": "environment", **argparse_kwargs}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class EnvContext:
    """What an environment's `activities` factory gets in a rollout worker.

    One worker serves many runs, so an activity reads the config of the run it works for, by the
    run id its input carries: `args = await ctx.run_args(inp.run_id)` (the environment's own
    flags are `args.env_args`). `ctx.args` is the worker's: its connections and queues."""

    args: Any  # the worker's VimeArgs (its store, Temporal address, task queues)
    store: Any  # the worker's SampleStore
    client: Any  # the Temporal client (for extra workers on the environment's own queues)
    runs: Any = None  # vime.config.run_args.RunArgs: each run's config by run id (None: the worker's flags are the run's)

    async def run_args(self, run_id: str) -> Any:
        """Run `run_id`'s `VimeArgs`, as its workflow recorded them (cached per worker until they
        change); read in a store thread. A `ConfigError` names a run nobody recorded."""
        if self.runs is None:
            return self.args
        from vime.temporal.store_calls import store_call

        return await store_call(self.runs.args, run_id)


@dataclass
class EnvWorkers:
    """What an environment runs in a rollout worker: activities on the rollout queue, workers of
    its own (a sandbox queue, a per-host queue), and what to close when the worker stops."""

    activities: list[Callable] = field(default_factory=list)
    workers: list[Any] = field(default_factory=list)  # temporalio.worker.Worker
    close: Callable[[], Awaitable[None]] | None = None  # bounded by the worker (60 s)


@dataclass(frozen=True)
class Environment:
    """A rollout environment: see the module docstring."""

    name: str
    group_workflow: str  # the registered workflow name the training workflow starts per group
    workflows: Sequence[type | str] = ()  # workflow classes (or "module:Class") for the rollout queue
    activities: Callable[[EnvContext], EnvWorkers] | str | None = None
    flags: type | None = None  # a dataclass whose fields are env_flag()s; parsed into args.env_args
    check: Callable[[Any], None] | str | None = None  # raise ConfigError on bad flags, before anything starts
    description: str = ""

    def __post_init__(self) -> None:
        if self.flags is not None and not dataclasses.is_dataclass(self.flags):
            raise TypeError(f"environment {self.name!r}: flags must be a dataclass, got {self.flags!r}")
