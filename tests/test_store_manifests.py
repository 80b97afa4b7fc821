"""Step manifests: a train step's content is recorded once, so workflows pass only (run_id, step).

On a SQLite run directory and on a fresh PostgreSQL database each (`store_location`); other
processes are real processes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command

from tests.test_store import RUN, race, random_sample
from vime.errors import ConfigError
from vime.store import (
    AlreadyTrainedError,
    MissingManifestError,
    MissingSampleError,
    SampleStore,
    StepManifest,
    StoreError,
)
from vime.store.database import make_engine, resolve_url, write_transaction
from vime.store.migrate import alembic_config, current_revision, head_revision
from vime.store.models import SampleRow
from vime.store.rows import sample_row


@pytest.fixture
def store(store_location: str) -> Iterator[SampleStore]:
    """A run with rollouts 'a' (2 siblings), 'b' (1) and 'c' (3)."""
    with SampleStore.open(store_location) as opened:
        opened.ensure_run(RUN)
        opened.write_rollouts(
            RUN,
            {
                "a": [random_sample(1), random_sample(2)],
                "b": [random_sample(3)],
                "c": [random_sample(4), random_sample(5), random_sample(6)],
            },
        )
        yield opened


def test_a_manifest_records_the_steps_rollouts_and_gives_back_their_samples_in_order(store: SampleStore) -> None:
    manifest = store.write_step_manifest(RUN, 0, ["c", "a"], weight_version=3, meta={"groups": 2, "filtered": 1})
    assert manifest == StepManifest(RUN, 0, ["c", "a"], 3, {"groups": 2, "filtered": 1})
    assert store.read_step_manifest(RUN, 0) == manifest

    samples = store.read_step_samples(RUN, 0)
    assert [s.index for s in samples] == [4, 5, 6, 1, 2], "manifest order, siblings in order"
    assert [s.rollout_id for s in samples] == ["c", "c", "c", "a", "a"]
    assert samples == store.read_rollout(RUN, "c") + store.read_rollout(RUN, "a")


def test_the_first_manifest_written_for_a_step_wins(store: SampleStore) -> None:
    """A retried or duplicated write returns what is stored; the step then trains on that."""
    first = store.write_step_manifest(RUN, 7, ["a", "b"], weight_version=1, meta={"samples": 3})
    again = store.write_step_manifest(RUN, 7, ["c"], weight_version=2, meta={"samples": 3000})
    assert again == first == store.read_step_manifest(RUN, 7)
    assert store.write_step_manifest(RUN, 7, ["no-such-rollout"]) == first, "a stored step is not re-validated"
    assert [s.index for s in store.read_step_samples(RUN, 7)] == [1, 2, 3]


def test_rollout_ids_may_be_ints_and_come_back_as_the_stored_strings(store: SampleStore) -> None:
    store.write_rollout(RUN, 42, [random_sample(7)])
    assert store.write_step_manifest(RUN, 1, [42, "b"]).rollout_ids == ["42", "b"]
    assert [s.rollout_id for s in store.read_step_samples(RUN, 1)] == ["42", "b"]


def test_a_manifest_naming_a_rollout_that_is_not_stored_is_refused_and_nothing_is_recorded(
    store: SampleStore,
) -> None:
    with pytest.raises(MissingSampleError, match=r"run 'run-0' has no rollout 'x' \(and 1 more\) for step 2"):
        store.write_step_manifest(RUN, 2, ["a", "x", "b", "y"])
    assert store.read_step_manifest(RUN, 2) is None

    store.ensure_run("run-1")
    with pytest.raises(MissingSampleError, match="run 'run-1' has no rollout 'a'"):
        store.write_step_manifest("run-1", 0, ["a"])  # stored, but under another run


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (dict(step=0, rollout_ids=[]), ConfigError, "step 0 of run 'run-0' has no rollouts"),
        (dict(step=0, rollout_ids="ab"), ConfigError, "rollout_ids must be a list of rollout ids, got 'ab'"),
        (dict(step=-1, rollout_ids=["a"]), ConfigError, "step -1 must be an int >= 0"),
        (dict(step=True, rollout_ids=["a"]), ConfigError, "step True must be an int >= 0"),
        (dict(step=0, rollout_ids=["a", "b", "a"]), ConfigError, "rollout 'a' appears twice in step 0"),
        (dict(step=0, rollout_ids=["a", ""]), ConfigError, "rollout_id '' must be 1 to 255 characters"),
        (dict(step=0, rollout_ids=["a"], weight_version=-2), ConfigError, "weight_version -2 must be an int >= 0"),
        (dict(step=0, rollout_ids=["a"], meta={"f": object()}), ConfigError, "meta cannot be stored as JSON"),
        (dict(step=0, rollout_ids=["a"], meta=[1]), ConfigError, "meta must be a dict"),
        (dict(run_id="typo", step=0, rollout_ids=["a"]), StoreError, r"ensure_run\('typo'\)"),
    ],
)
def test_bad_manifests_are_rejected_naming_the_value(store: SampleStore, call: dict, error: type, message: str) -> None:
    call = {"run_id": RUN, **call}
    with pytest.raises(error, match=message):
        store.write_step_manifest(call.pop("run_id"), call.pop("step"), call.pop("rollout_ids"), **call)
    assert store.read_step_manifest(RUN, 0) is None


def test_a_step_without_a_manifest_has_none_and_its_samples_cannot_be_read(store: SampleStore) -> None:
    assert store.read_step_manifest(RUN, 3) is None
    with pytest.raises(MissingManifestError, match=r"run 'run-0' has no manifest for step 3 .*write_step_manifest"):
        store.read_step_samples(RUN, 3)
    with pytest.raises(MissingManifestError, match="no manifest for step 3"):
        store.mark_step_trained(RUN, 3)
    with pytest.raises(ConfigError, match="step -1 must be an int >= 0"):
        store.read_step_manifest(RUN, -1)


def test_a_step_marks_its_samples_trained_once_and_trained_counts_sums_them_per_step(store: SampleStore) -> None:
    assert store.trained_counts(RUN) == {}
    store.write_step_manifest(RUN, 0, ["a", "b"])
    store.write_step_manifest(RUN, 1, ["c"])
    store.write_step_manifest(RUN, 2, ["b"])  # a buggy batcher picked 'b' again

    assert store.mark_step_trained(RUN, 0) == 3
    assert store.mark_step_trained(RUN, 0) == 0, "a retried train step marks nothing new"
    assert store.mark_trained(RUN, ["c/0", "c/1"], step=1) == 2
    assert store.mark_step_trained(RUN, 1) == 1
    with pytest.raises(AlreadyTrainedError, match="sample 'b/0' of run 'run-0' was trained at step 0"):
        store.mark_step_trained(RUN, 2)

    assert store.trained_counts(RUN) == {0: 3, 1: 3}
    assert store.trained_counts("run-without-samples") == {}


def test_processes_recording_different_content_for_one_step_at_once_all_get_the_same(
        store_location: str, tmp_path: Path) -> None:
    """Duplicated train-step activities race to record step 0: one wins, every one trains on it."""
    writers = 4
    with SampleStore.open(store_location) as store:
        store.ensure_run(RUN)
        store.write_rollouts(RUN, {f"r{me}": [random_sample(me)] for me in range(writers)})
    answers = [json.loads(out) for out in race("""
        import json
        from vime.store import SampleStore
        with SampleStore.open(location) as store:
            manifest = store.write_step_manifest("run-0", 0, [f"r{me}"], weight_version=me, meta={"writer": me})
        print(json.dumps([manifest.rollout_ids, manifest.weight_version, manifest.meta]))
    """, store_location, writers, tmp_path)]

    assert all(answer == answers[0] for answer in answers)
    ids, version, meta = answers[0]
    assert ids == [f"r{version}"] and meta == {"writer": version}, "one writer's manifest, whole"
    with SampleStore.open(store_location) as store:
        assert store.read_step_manifest(RUN, 0) == StepManifest(RUN, 0, ids, version, meta)


def _store_at_revision(location: str, revision: str) -> None:
    """A store as an older vime left it: schema at `revision`, one run with one rollout."""
    engine = make_engine(resolve_url(location))
    try:
        with write_transaction(engine) as conn:
            command.upgrade(alembic_config(conn), revision)
        with engine.begin() as conn:
            assert current_revision(conn) == revision
            conn.exec_driver_sql("INSERT INTO runs (run_id, created_at) VALUES ('run-0', '2025-01-01 00:00:00')")
            # the sample as 0001's columns hold it (later revisions added teacher_log_probs)
            row = {k: v for k, v in sample_row(RUN, "old", 0, random_sample(1)).items() if k != "teacher_log_probs"}
            conn.execute(SampleRow.__table__.insert().values(**row))
    finally:
        engine.dispose()


def test_a_store_at_the_previous_schema_is_upgraded_on_open_and_keeps_its_data(store_location: str) -> None:
    assert head_revision() == "0006"
    _store_at_revision(store_location, "0001")
    with SampleStore.open(store_location) as store:
        with store.engine.connect() as conn:
            assert current_revision(conn) == "0006"
        assert store.read_rollout(RUN, "old") == [random_sample(1, rollout_id="old")]  # teacher_log_probs: None
        assert store.write_step_manifest(RUN, 0, ["old"]).rollout_ids == ["old"]


def test_processes_opening_a_store_at_the_previous_schema_at_once_upgrade_it_once(
        store_location: str, tmp_path: Path) -> None:
    """Workers restarted with a newer vime open the run's store together; all of them can use it."""
    openers = 4
    _store_at_revision(store_location, "0001")
    outputs = race("""
        from vime.store import SampleStore
        with SampleStore.open(location) as store:
            print(store.write_step_manifest("run-0", me, ["old"]).step)
    """, store_location, openers, tmp_path)
    assert sorted(int(out) for out in outputs) == list(range(openers))
    with SampleStore.open(store_location) as store:
        assert [store.read_step_manifest(RUN, step).rollout_ids for step in range(openers)] == [["old"]] * openers
