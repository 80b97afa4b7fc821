"""Workflow code stays replayable: histories recorded from real runs (a quickstart-shaped run that
continued as new with prefetched steps, a run whose trainer was killed, an agent rollout, a
finished run started again, which trains nothing) are
replayed by Temporal's `Replayer` against the current workflow definitions. A change that makes
a workflow take another path on the same history — non-determinism, which would break every run
in flight — fails here. Recorded by `python -m tests.record_histories` (see there)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from vime.envs.coding_agent.workflow import CodingAgentGroupWorkflow, CodingAgentRolloutWorkflow
from workflows.rollout import RolloutWorkflow
from workflows.training import TrainingWorkflow

HISTORIES = sorted((Path(__file__).parent / "data" / "histories").glob("*.json"))


def test_there_is_a_recorded_history_of_each_kind():
    names = {p.name.split("-")[0] for p in HISTORIES}
    assert {"quickstart", "restarted", "agent"} <= names, names
    kinds = {p.stem.rsplit("-", 1)[0] for p in HISTORIES}
    assert any(k.endswith("TrainingWorkflow") for k in kinds) and any(k.endswith("-RolloutWorkflow") for k in kinds)
    assert any(k.endswith("CodingAgentRolloutWorkflow") for k in kinds)
    assert any(k.endswith("CodingAgentGroupWorkflow") for k in kinds)


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_a_recorded_history_replays_against_the_current_workflows(path):
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(workflows=[TrainingWorkflow, RolloutWorkflow, CodingAgentGroupWorkflow,
                                   CodingAgentRolloutWorkflow])
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure}"
