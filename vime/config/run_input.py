"""`vime config [flags]`: the training workflow's whole input for a run, as one JSON document.

`temporal workflow start --type TrainingWorkflow --input-file run.json` and the Web UI's Start
Workflow form take it as it is, so a run started by hand gets exactly the numbers `vime train`
would give it (the group size, the batch sizes, the queues), not a hand-written subset.

The JSON is what Temporal's default data converter makes of `TrainingInput`, so the workflow
reads it back as the same dataclass. Nothing else goes to stdout: `vime config ... > run.json`.
`vime train` builds its workflow's input with the same two functions (`training_config`,
`initial_state`), which is why they live here, below the launcher.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

from temporalio.converter import default as default_converter

from vime.config.resolve import DEFAULT_ROLLOUT_FUNCTION
from vime.envs import load_environment
from vime.temporal.training_contract import (TrainingConfig, TrainingInput, TrainingState,
                                             training_config_from)
from vime.train.checkpoint import latest_checkpoint, read_state


SECRET_FLAGS = ("--wandb-key",)
"""Flags whose value is a credential: kept out of the run's recorded flags (the store, the
workflow's input that the Web UI and `temporal workflow show` print, `vime config`'s JSON).
`vime train` hands the W&B key to its own workers as WANDB_API_KEY instead (`secret_env`)."""


def without_secrets(argv: list[str]) -> list[str]:
    """`argv` less each `SECRET_FLAGS` flag and its value (`--flag VALUE` or `--flag=VALUE`)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in SECRET_FLAGS:
            skip = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in SECRET_FLAGS)):
            kept.append(arg)
    return kept


def secret_env(args) -> dict[str, str]:
    """The environment that carries the secret flags' values to workers `vime train` starts."""
    return {"WANDB_API_KEY": args.wandb_key} if args.wandb_key else {}


def initial_state(args) -> TrainingState:
    """Step 0, or the state of the newest checkpoint under --load."""
    path = latest_checkpoint(args.load)
    if path is None:
        return TrainingState()
    state = read_state(path)
    print(f"[vime] resuming from {path} (step {state['step']})", flush=True)
    return TrainingState(step=state["step"], data_position=state["data_position"],
                         weight_version=state["weight_version"], checkpoint_step=state["step"], checkpoint=str(path))


def training_config(args) -> TrainingConfig:
    """`TrainingConfig` from the parsed flags: the fields named like a flag by name, these by hand."""
    return training_config_from(
        vars(args), over_sampling_batch_size=args.over_sampling_batch_size or args.rollout_batch_size,
        save=str(Path(args.save).resolve()) if args.save else None,
        trainer_heartbeat_seconds=args.heartbeat_timeout, rollout_heartbeat_seconds=args.heartbeat_timeout,
        custom_rollout_function=args.rollout_function_path != DEFAULT_ROLLOUT_FUNCTION,
        rollout_workflow=load_environment(args.rollout_env).group_workflow,
        max_concurrent_rollouts=args.max_concurrent_rollouts or 0, run_argv=without_secrets(list(args.argv)),
        eval_interval=args.eval_interval or 0,
        eval_by_function=(args.eval_function_path or args.rollout_function_path) != DEFAULT_ROLLOUT_FUNCTION)


def workflow_input(args) -> TrainingInput:
    with contextlib.redirect_stdout(sys.stderr):  # "resuming from <checkpoint>" is a note, not the JSON
        return TrainingInput(training_config(args), initial_state(args))


def to_json(value: TrainingInput) -> str:
    (payload,) = default_converter().payload_converter.to_payloads([value])
    return json.dumps(json.loads(payload.data), indent=1)


def from_json(text: str) -> TrainingInput:
    """The input a workflow started with `text` receives (what Temporal's converter decodes)."""
    (payload,) = default_converter().payload_converter.to_payloads([json.loads(text)])
    return default_converter().payload_converter.from_payloads([payload], [TrainingInput])[0]


def main(args) -> int:
    print(to_json(workflow_input(args)))
    return 0
