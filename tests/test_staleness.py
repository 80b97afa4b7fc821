"""The fully async pool's staleness policy (`workflows.staleness`), as a specification: which
groups may still be trained at a policy version, and when pacing lets a new group start. Pure
functions: no Temporal, no servers."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from workflows.staleness import DISCARD, PACE, StalenessPolicy


@dataclass
class Group:
    name: str
    weight_version: int  # the policy version it started under


def test_a_groups_staleness_is_the_versions_between_its_policy_and_the_one_it_is_trained_on():
    policy = StalenessPolicy(max_staleness=2, batch_size=4)
    assert policy.staleness(started_under=3, version=3) == 0
    assert policy.staleness(started_under=3, version=5) == 2


@pytest.mark.parametrize("max_staleness", [0, 1, 3])
def test_a_group_is_admissible_up_to_the_bound_and_not_one_version_past_it(max_staleness):
    policy = StalenessPolicy(max_staleness=max_staleness, batch_size=4)
    started = 7
    assert policy.admissible(started, version=started)
    assert policy.admissible(started, version=started + max_staleness)
    assert not policy.admissible(started, version=started + max_staleness + 1)


def test_on_policy_training_admits_only_groups_of_the_current_version():
    policy = StalenessPolicy(max_staleness=0, batch_size=2)
    kept, dropped = policy.split([Group("old", 4), Group("new", 5)], version=5)
    assert [g.name for g in kept] == ["new"] and [g.name for g in dropped] == ["old"]


def test_split_keeps_the_admissible_groups_in_their_finish_order_and_drops_the_rest():
    policy = StalenessPolicy(max_staleness=1, batch_size=2)
    finished = [Group("a", 5), Group("b", 3), Group("c", 4), Group("d", 2), Group("e", 5)]
    kept, dropped = policy.split(finished, version=5)
    assert [g.name for g in kept] == ["a", "c", "e"]
    assert [g.name for g in dropped] == ["b", "d"]


def test_pacing_starts_groups_until_the_bound_times_the_batch_is_alive():
    """With max_staleness 1 the next step's groups sample while the current one trains: two
    steps' worth alive at most, so no finished group is ever more than one version old."""
    policy = StalenessPolicy(max_staleness=1, batch_size=4, control=PACE)
    assert policy.may_start(alive=0)
    assert policy.may_start(alive=7)
    assert not policy.may_start(alive=8)


def test_pacing_at_max_staleness_0_is_the_synchronous_schedule():
    policy = StalenessPolicy(max_staleness=0, batch_size=4, control=PACE)
    assert policy.may_start(alive=3) and not policy.may_start(alive=4)


def test_discard_does_not_pace_and_relies_on_dropping_alone():
    policy = StalenessPolicy(max_staleness=0, batch_size=4, control=DISCARD)
    assert policy.may_start(alive=1000)
    kept, dropped = policy.split([Group("late", 1)], version=2)
    assert not kept and [g.name for g in dropped] == ["late"]


def test_the_policy_module_does_not_import_temporal():
    import ast
    from pathlib import Path

    import workflows.staleness as module

    tree = ast.parse(Path(module.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(name.startswith("temporalio") for name in imported), imported


def test_staleness_control_picks_whether_the_runs_async_pool_paces_new_groups(tmp_path):
    """From the command line to the pool the training workflow builds (no Temporal needed to build it)."""
    from vime.config.args import parse_args
    from vime.config.run_input import training_config
    from vime.temporal.training_contract import TrainingState
    from workflows.step_collection import StepCollection

    def pool(*flags):
        args = parse_args(["--run-dir", str(tmp_path / "run"), "--fully-async", "--rollout-batch-size", "4",
                           "--max-staleness", "1", "--max-concurrent-rollouts", "64", *flags])
        collection = StepCollection()
        collection.begin(training_config(args), TrainingState())
        collection.start_pool()
        return collection.pool

    paced, discarding = pool(), pool("--staleness-control", "discard")
    assert paced.policy.may_start(alive=7) and not paced.policy.may_start(alive=8)  # (1 + 1) x 4 alive at most
    assert discarding.policy.may_start(alive=63)  # only --max-concurrent-rollouts bounds it
