"""`vime config [flags]`: the training workflow's whole input for a run, as one JSON document.

`temporal workflow start --type TrainingWorkflow --input-file run.json` and the Web UI's Start
Workflow form take it as it is, so a run started by hand gets exactly the numbers `vime train`
would give it (the group size, the batch sizes, the queues), not a hand-written subset.

The JSON is what Temporal's default data converter makes of `TrainingInput`, so the workflow
reads it back as the same dataclass. Nothing else goes to stdout: `vime config ... > run.json`.
"""

from __future__ import annotations

import contextlib
import json
import sys

from temporalio.converter import default as default_converter

from vime.temporal.training_contract import TrainingInput


def workflow_input(args) -> TrainingInput:
    from vime.launch import initial_state, training_config

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
