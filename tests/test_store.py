"""The sample store (vime/store): what Temporal activities and the trainer may rely on.

Each test that is not about SQLite itself runs twice: on a SQLite file in a temporary run
directory and on a fresh database of a real PostgreSQL server (`store_location`, tests/conftest.py).
Other processes are real processes.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text

from vime.errors import ConfigError
from vime.store import AlreadyTrainedError, MissingSampleError, SampleStore, StoreError
from vime.store import codec
from vime.store.migrate import current_revision, head_revision, shipped_head
from vime.store.models import Base
from vime.testing.samples import random_rollouts
from vime.types import Sample, SampleError, SampleRef

REPO = Path(__file__).resolve().parents[1]
RUN = "run-0"


@pytest.fixture
def store(store_location: str) -> Iterator[SampleStore]:
    with SampleStore.open(store_location) as opened:
        opened.ensure_run(RUN, {"lr": 1e-6})
        yield opened


def random_sample(seed: int, *, length: int = 64, prompt_length: int = 16, rollout_id: str | None = None) -> Sample:
    """A sample whose token data comes from `seed` (same seed, same sample)."""
    rng = np.random.default_rng([7, seed])
    response_length = length - prompt_length
    return Sample(
        group_index=seed // 4,
        index=seed,
        rollout_id=rollout_id,
        prompt=f"prompt {seed}",
        tokens=rng.integers(0, 151_000, length, dtype=np.int32).tolist(),
        response=f"response {seed}",
        response_length=response_length,
        loss_mask=rng.integers(0, 2, response_length, dtype=np.uint8).tolist(),
        rollout_log_probs=(-rng.random(response_length, dtype=np.float32) * 5).tolist(),
        reward=float(seed % 3),
        status=Sample.Status.COMPLETED,
        weight_versions=[{"version": seed % 5, "start": 0, "end": response_length}],
        metadata={"seed": seed},
    )


RACE_START = """
import pathlib, sys, time
location, me, gate = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3])
(gate / f"ready-{me}").touch()
while not (gate / "go").exists():
    time.sleep(0.001)
"""


def race(body: str, location: str, count: int, gate: Path) -> list[str]:
    """Run `body` in `count` processes released at the same moment (each has the store
    `location` and its number `me`; `gate` is a directory for the start signal); returns their
    outputs in order."""
    procs = [run_python(RACE_START + textwrap.dedent(body), location, str(me), str(gate)) for me in range(count)]
    while not all((gate / f"ready-{me}").exists() for me in range(count)):
        time.sleep(0.01)
    (gate / "go").touch()
    return [finish(p) for p in procs]


def run_python(code: str, *args: str, **popen) -> subprocess.Popen:
    """Start `python -c code args...` in another process, with this checkout importable."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def finish(process: subprocess.Popen, timeout: float = 120) -> str:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return out


# ---- round trip ----------------------------------------------------------------------------


def test_agent_sized_samples_round_trip_exactly_in_batches(store_location: str) -> None:
    """2,000 samples x 4,096 tokens (4 siblings per rollout) come back field for field.

    Written and read in batches of 500, as a trainer would; each write is one transaction.
    Log-probs were float32 to begin with, so they come back exactly equal. How long 10,000 of
    them take on each backend: `python bench/store_bulk.py` (not a timed test)."""
    total, batch, shape = 2_000, 500, {"length": 4_096, "prompt_length": 512}
    with SampleStore.open(store_location) as store:
        store.ensure_run(RUN)
        for start in range(0, total, batch):
            store.write_rollouts(RUN, random_rollouts(start, batch, **shape))
        assert store.count_samples(RUN) == total

        for start in range(0, total, batch):
            expected = [s for siblings in random_rollouts(start, batch, **shape).values() for s in siblings]
            keys = [f"group-{i // 4}/{i % 4}" for i in range(start, start + batch)]
            assert store.read_samples(RUN, keys) == expected


def test_every_sample_field_round_trips(store: SampleStore) -> None:
    full = Sample(
        group_index=3,
        index=17,
        rollout_id="r-1",
        prompt=[{"role": "user", "content": "fix the bug"}],
        tokens=[5, 6, 7, 8, 9],
        response="done",
        response_length=3,
        label={"tests": ["test_a"]},
        reward={"score": 1.0, "format": 0.5},
        loss_mask=[1, 0, 1],
        rollout_log_probs=[-0.25, 0.0, -1.5],
        weight_versions=["3", {"version": 4, "start": 1, "end": 3}],
        status=Sample.Status.TRUNCATED,
        metadata={"turns": 2, "finish_reason": "length"},
        session_id="sess-1",
        remove_sample=True,
        train_metadata={"segment": 0},
    )
    bare = Sample(tokens=[1, 2], response_length=0, loss_mask=None, rollout_log_probs=None)
    empty_mask = Sample(tokens=[1, 2], response_length=0, loss_mask=[], rollout_log_probs=[])
    store.write_rollout(RUN, "r-1", [full])
    store.write_rollout(RUN, "r-2", [bare, empty_mask])

    assert store.read_samples(RUN, ["r-1/0"]) == [full]
    read_bare, read_empty = store.read_rollout(RUN, "r-2")
    assert read_bare.loss_mask is None and read_bare.rollout_log_probs is None, "None stays None"
    assert read_empty.loss_mask == [] and read_empty.rollout_log_probs == [], "[] stays []"
    assert read_bare.rollout_id == "r-2", "a sample comes back with the rollout id it was stored under"


def test_log_probs_come_back_rounded_to_float32(store: SampleStore) -> None:
    sample = Sample(tokens=[1, 2], response_length=2, rollout_log_probs=[-0.1, -1 / 3])
    store.write_rollout(RUN, "r", [sample])
    (got,) = store.read_samples(RUN, ["r/0"])
    assert got.rollout_log_probs == np.asarray([-0.1, -1 / 3], dtype=np.float32).tolist()


def test_refs_are_small_summaries_of_what_was_stored(store: SampleStore) -> None:
    a, b = random_sample(1), random_sample(2)
    refs = store.write_rollout(RUN, "r", [a, b])
    assert refs == [
        SampleRef(RUN, "r/0", "r", "completed", a.reward, a.response_length),
        SampleRef(RUN, "r/1", "r", "completed", b.reward, b.response_length),
    ]
    assert store.rollout_refs(RUN, "r") == refs
    assert store.rollout_refs(RUN, "not-written") == []
    assert store.read_samples(RUN, refs) == store.read_rollout(RUN, "r"), "refs work as keys"


def test_binary_columns_are_compact(store: SampleStore) -> None:
    """Per-token data is int32 / uint8 / float32 bytes, not JSON: 4 + 1 + 4 bytes a response token."""
    sample = random_sample(0, length=1000, prompt_length=200)
    store.write_rollout(RUN, "r", [sample])
    kind = "typeof(tokens)" if store.engine.dialect.name == "sqlite" else "pg_typeof(tokens)::text"
    with store.engine.connect() as conn:
        sizes = conn.execute(
            text(f"SELECT length(tokens), length(loss_mask), length(rollout_log_probs), {kind} FROM samples")
        ).one()
    assert tuple(sizes) == (4 * 1000, 800, 4 * 800, "blob" if store.engine.dialect.name == "sqlite" else "bytea")
    assert codec.encode_int32([1, 256]) == b"\x01\x00\x00\x00\x00\x01\x00\x00", "little-endian int32"


@given(
    tokens=st.lists(st.integers(0, 2**31 - 1), max_size=50),
    mask=st.lists(st.integers(0, 1), max_size=50),
    log_probs=st.lists(st.floats(width=32, allow_nan=False), max_size=50),
)
def test_codec_round_trips(tokens: list[int], mask: list[int], log_probs: list[float]) -> None:
    assert codec.decode_int32(codec.encode_int32(tokens)) == tokens
    assert codec.decode_uint8(codec.encode_uint8(mask)) == mask
    assert codec.decode_float32(codec.encode_float32(log_probs)) == log_probs


# ---- idempotence and validation --------------------------------------------------------------


def test_writing_the_same_rollout_twice_stores_it_once(store: SampleStore) -> None:
    """A retried activity may have generated different samples: the first write wins."""
    first = store.write_rollout(RUN, "r", [random_sample(1), random_sample(2)])
    retry = store.write_rollout(RUN, "r", [random_sample(3)])
    assert retry == first
    assert store.count_samples(RUN) == 2
    assert store.read_rollout(RUN, "r") == [random_sample(1, rollout_id="r"), random_sample(2, rollout_id="r")]


def test_a_batch_write_stores_only_the_rollouts_not_yet_stored(store: SampleStore) -> None:
    store.write_rollout(RUN, "a", [random_sample(1)])
    refs = store.write_rollouts(RUN, {"a": [random_sample(9)], "b": [random_sample(2), random_sample(3)]})
    assert [r.key for r in refs["a"]] == ["a/0"] and [r.key for r in refs["b"]] == ["b/0", "b/1"]
    assert store.count_samples(RUN) == 3
    assert store.read_samples(RUN, ["a/0"])[0].index == 1


def test_a_sample_with_inconsistent_lengths_is_rejected_and_nothing_of_its_rollout_is_stored(
    store: SampleStore,
) -> None:
    bad = random_sample(2)
    bad.loss_mask = bad.loss_mask[:-1]
    expected = r"rollout 'r' sample 1: Sample.loss_mask has 47 entries but response_length=48"
    with pytest.raises(SampleError, match=expected):
        store.write_rollout(RUN, "r", [random_sample(1), bad])
    with pytest.raises(SampleError, match="rollout 'bad'"):
        store.write_rollouts(RUN, {"good": [random_sample(1)], "bad": [bad]})
    assert store.count_samples(RUN) == 0
    assert store.rollout_refs(RUN, "r") == [] and store.rollout_refs(RUN, "good") == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: setattr(s, "metadata", {"obj": object()}), "Sample.metadata cannot be stored as JSON"),
        (lambda s: setattr(s, "reward", math.nan), "reward is NaN"),
        (lambda s: setattr(s, "status", "finished"), "Sample.status 'finished' is not one of"),
        (lambda s: setattr(s, "rollout_id", "other"), "Sample.rollout_id='other' differs"),
        (lambda s: s.tokens.__setitem__(0, 2**40), "cannot store as int32"),
        (lambda s: s.loss_mask.__setitem__(0, -1), "cannot store as uint8"),
    ],
)
def test_unstorable_samples_are_rejected_naming_the_field(store: SampleStore, change, message: str) -> None:
    sample = random_sample(1)
    change(sample)
    with pytest.raises(SampleError, match=message):
        store.write_rollout(RUN, "r", [sample])
    assert store.count_samples(RUN) == 0


def test_writes_need_an_existing_run(store: SampleStore) -> None:
    with pytest.raises(StoreError, match=r"run 'typo' is not in store .*ensure_run\('typo'\)"):
        store.write_rollout("typo", "r", [random_sample(1)])


def test_ensure_run_keeps_the_config_the_run_was_created_with(store: SampleStore) -> None:
    assert store.ensure_run(RUN, {"lr": 2e-6}) == {"lr": 1e-6}
    assert store.ensure_run("run-1") is None
    with pytest.raises(ConfigError, match="run config cannot be stored as JSON"):
        store.ensure_run("run-2", {"tokenizer": object()})


# ---- reading ---------------------------------------------------------------------------------


def test_read_samples_returns_the_order_asked_and_names_missing_keys(store: SampleStore) -> None:
    store.write_rollouts(RUN, {"a": [random_sample(1), random_sample(2)], "b": [random_sample(3)]})
    assert [s.index for s in store.read_samples(RUN, ["b/0", "a/1", "a/0", "b/0"])] == [3, 2, 1, 3]
    with pytest.raises(MissingSampleError, match="run 'run-0' has no sample 'a/7'"):
        store.read_samples(RUN, ["a/0", "a/7"])
    with pytest.raises(MissingSampleError, match="no rollout 'zzz'"):
        store.read_rollout(RUN, "zzz")
    with pytest.raises(ConfigError, match="belongs to run 'other'"):
        store.read_samples(RUN, [SampleRef("other", "a/0", "a", "completed")])


def test_iter_and_count_filter_by_status_training_and_rollout(store: SampleStore) -> None:
    aborted = random_sample(4)
    aborted.status = Sample.Status.ABORTED
    store.write_rollouts(RUN, {"a": [random_sample(1), random_sample(2)], "b": [random_sample(3), aborted]})
    store.mark_trained(RUN, ["a/0"], step=0)

    pairs = list(store.iter_samples(RUN, batch_size=1))
    assert [ref.key for ref, _ in pairs] == ["a/0", "a/1", "b/0", "b/1"], "write order, across batches"
    assert all(sample.index == idx for (_, sample), idx in zip(pairs, [1, 2, 3, 4], strict=True))
    assert [r.key for r, _ in store.iter_samples(RUN, untrained=True)] == ["a/1", "b/0", "b/1"]
    assert [r.key for r, _ in store.iter_samples(RUN, status="aborted")] == ["b/1"]
    assert [r.key for r, _ in store.iter_samples(RUN, rollout_id="b", status=[Sample.Status.COMPLETED])] == ["b/0"]
    assert store.count_samples(RUN) == 4
    assert store.count_samples(RUN, untrained=True, status="COMPLETED") == 2
    assert store.count_samples("run-without-samples") == 0
    with pytest.raises(ConfigError, match="status filter 'done' is not one of"):
        store.count_samples(RUN, status="done")


# ---- trained exactly once --------------------------------------------------------------------


def test_mark_trained_is_idempotent_for_a_step_and_refuses_a_second_step(store: SampleStore) -> None:
    store.write_rollouts(RUN, {"a": [random_sample(1), random_sample(2)], "b": [random_sample(3)]})
    assert store.mark_trained(RUN, ["a/0", "a/1"], step=5) == 2
    assert store.mark_trained(RUN, ["a/0", "a/1"], step=5) == 0, "a retried train step marks nothing new"

    with pytest.raises(AlreadyTrainedError, match="sample 'a/1' of run 'run-0' was trained at step 5"):
        store.mark_trained(RUN, ["b/0", "a/1"], step=6)
    assert store.count_samples(RUN, untrained=True) == 1, "a refused batch marks nothing"

    with pytest.raises(MissingSampleError, match="'c/0'"):
        store.mark_trained(RUN, ["b/0", "c/0"], step=6)
    assert store.mark_trained(RUN, store.rollout_refs(RUN, "b"), step=6) == 1
    with store.engine.connect() as conn:
        steps = {key: step for key, step in conn.execute(text("SELECT key, trained_step FROM samples"))}
    assert steps == {"a/0": 5, "a/1": 5, "b/0": 6}


def test_eval_samples_are_apart_from_training_and_never_trained(store: SampleStore) -> None:
    store.write_rollouts(RUN, {"a": [random_sample(1)]})
    store.write_rollouts(RUN, {"eval0-h-0": [random_sample(2)], "eval0-h-1": [random_sample(3)]}, eval_step=0)
    store.write_rollouts(RUN, {"eval2-h-0": [random_sample(4)]}, eval_step=2)
    assert [r.key for r, _ in store.iter_samples(RUN)] == ["a/0"], "training samples only, by default"
    assert store.count_samples(RUN, evaluation=True) == 3 and store.count_samples(RUN, evaluation=None) == 4
    assert [r.key for r, _ in store.iter_samples(RUN, eval_step=0)] == ["eval0-h-0/0", "eval0-h-1/0"]
    with pytest.raises(ConfigError, match="'eval0-h-0/0' .* is an eval sample .* never trained"):
        store.mark_trained(RUN, ["a/0", "eval0-h-0/0"], step=0)
    with pytest.raises(ConfigError, match="rollout 'eval2-h-0' .* is an eval rollout"):
        store.write_step_manifest(RUN, 0, ["a", "eval2-h-0"])
    assert store.count_samples(RUN, untrained=True, evaluation=None) == 4, "a refused batch marks nothing"


def test_an_eval_round_is_recorded_once(store: SampleStore) -> None:
    assert store.read_eval_round(RUN, 2) is None
    first = store.write_eval_round(RUN, 2, 2, {"eval/h/pass@1": 0.5})
    again = store.write_eval_round(RUN, 2, 2, {"eval/h/pass@1": 0.9})  # a retry that graded otherwise
    assert again == first and store.read_eval_round(RUN, 2).metrics == {"eval/h/pass@1": 0.5}
    store.write_eval_round(RUN, 0, 0, {"eval/h/pass@1": 0.1})
    assert [r.step for r in store.eval_rounds(RUN)] == [0, 2]


# ---- trajectory turns ------------------------------------------------------------------------


def test_turns_append_in_order_and_a_retried_rollout_resumes_after_the_last(store_location: str) -> None:
    with SampleStore.open(store_location) as store:
        store.ensure_run(RUN)
        assert store.last_turn(RUN, "agent-1") is None, "nothing stored: start at turn 0"
        meta = {"finish_reason": "tool_calls"}
        assert store.append_turn(RUN, "agent-1", 0, [1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.25], meta)
        assert store.append_turn(RUN, "agent-1", 1, [4, 5], [0, 1], [0.0, -2.0], {"weight_version": 3})
        assert not store.append_turn(RUN, "agent-1", 1, [9], [1], [-1.0]), "a retried turn is stored once"
        with pytest.raises(StoreError, match="turn 3 of rollout 'agent-1'.*the next turn is 2"):
            store.append_turn(RUN, "agent-1", 3, [6], [1])
        with pytest.raises(SampleError, match="loss_mask has 1 entries for 2 token ids"):
            store.append_turn(RUN, "agent-1", 2, [6, 7], [1])

    with SampleStore.open(store_location) as resumed:  # the retry runs on another worker
        resume_at = resumed.last_turn(RUN, "agent-1") + 1
        assert resume_at == 2
        turns = resumed.read_turns(RUN, "agent-1")
        assert [(t.turn, t.token_ids, t.loss_mask, t.log_probs) for t in turns] == [
            (0, [1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.25]),
            (1, [4, 5], [0, 1], [0.0, -2.0]),
        ]
        assert turns[0].meta == {"finish_reason": "tool_calls"}
        assert resumed.append_turn(RUN, "agent-1", resume_at, [6], [0])
        assert resumed.read_turns(RUN, "agent-1", start=2)[0].log_probs is None
        assert resumed.read_turns(RUN, "agent-2") == []


# ---- several processes -----------------------------------------------------------------------


def test_a_sample_written_by_one_process_is_read_by_another(store_location: str) -> None:
    writer = run_python(
        """
        import sys
        from vime.store import SampleStore
        from vime.types import Sample
        with SampleStore.open(sys.argv[1]) as store:
            store.ensure_run("run-0")
            sample = Sample(prompt="p", tokens=[10, 11, 12], response_length=2, loss_mask=[1, 0],
                            rollout_log_probs=[-0.5, 0.0], reward=1.0, status=Sample.Status.COMPLETED)
            print(store.write_rollout("run-0", "from-child", [sample])[0].key)
        """,
        store_location,
    )
    key = finish(writer).strip()
    with SampleStore.open(store_location) as store:
        (sample,) = store.read_samples(RUN, [key])
    assert (sample.tokens, sample.loss_mask, sample.rollout_log_probs, sample.reward) == (
        [10, 11, 12],
        [1, 0],
        [-0.5, 0.0],
        1.0,
    )


def test_the_store_imports_no_torch_or_numpy() -> None:
    out = finish(run_python("import sys, vime.store; print(sorted({'torch', 'numpy'} & set(sys.modules)))"))
    assert out.strip() == "[]"


def test_processes_writing_the_same_rollout_at_once_store_it_once(store_location: str, tmp_path: Path) -> None:
    """Four workers open a fresh store (migrating it) and write one rollout, all at the same moment."""
    writers = 4
    answers = [json.loads(out) for out in race("""
        import json
        from vime.store import SampleStore
        from vime.types import Sample
        with SampleStore.open(location) as store:
            store.ensure_run("run-0")
            samples = [Sample(tokens=[me, i], response_length=1, reward=float(me)) for i in range(3)]
            refs = store.write_rollout("run-0", "contested", samples)
        print(json.dumps([[r.key, r.reward] for r in refs]))
    """, store_location, writers, tmp_path)]

    assert all(answer == answers[0] for answer in answers), "every writer gets the refs of what is stored"
    winner = answers[0][0][1]
    with SampleStore.open(store_location) as store:
        assert store.count_samples(RUN) == 3
        assert [s.tokens for s in store.read_rollout(RUN, "contested")] == [[int(winner), i] for i in range(3)]


# ---- schema, engine, URLs --------------------------------------------------------------------


def test_the_migrations_build_exactly_the_models(store: SampleStore) -> None:
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
        assert diff == []
        assert current_revision(conn) == head_revision()


def test_a_store_at_head_opens_without_importing_alembic(tmp_path: Path) -> None:
    """The migration files' head, read without alembic, is alembic's; a store at it opens with no
    alembic import (what keeps `vime show` and `vime samples` quick)."""
    assert shipped_head() == head_revision()
    with SampleStore.open(str(tmp_path / "run")):
        pass
    script = ("import sys; from vime.store import SampleStore\n"
              f"SampleStore.open({str(tmp_path / 'run')!r}).close()\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_opening_again_is_idempotent_and_keeps_data(store_location: str) -> None:
    with SampleStore.open(store_location) as store:
        store.ensure_run(RUN)
        store.write_rollout(RUN, "r", [random_sample(1)])
    with SampleStore.open(store_location) as store, SampleStore.open(store_location) as same:
        assert store.count_samples(RUN) == same.count_samples(RUN) == 1


def test_a_run_directory_and_its_sqlite_url_are_one_store(tmp_path: Path) -> None:
    with SampleStore.open(tmp_path) as store:
        store.ensure_run(RUN)
        store.write_rollout(RUN, "r", [random_sample(1)])
    with SampleStore.open(f"sqlite:///{tmp_path}/vime.db") as same:
        assert same.count_samples(RUN) == 1


def test_a_store_from_a_newer_schema_is_refused_not_changed(store_location: str) -> None:
    with SampleStore.open(store_location) as store, store.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999_future'"))
    with pytest.raises(ConfigError, match="cannot be migrated .*upgrade vime"):
        SampleStore.open(store_location)


def test_every_sqlite_connection_uses_wal_and_waits_for_the_write_lock(tmp_path: Path) -> None:
    with SampleStore.open(tmp_path, busy_timeout_s=12.5) as store:
        conns = [store.engine.connect() for _ in range(2)]
        try:
            for conn in conns:
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
                assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 12_500
                assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        finally:
            for conn in conns:
                conn.close()
    assert (tmp_path / "vime.db").is_file()


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("nosuchdb://host/x", r"store URL 'nosuchdb://host/x': SQLAlchemy has no database dialect 'nosuchdb'; pass"),
        ("postgresql+nosuchdriver://u@h/db", r"store URL 'postgresql\+nosuchdriver://u@h/db'.*no database dialect"),
        ("mysql+pymysql://u:secret@localhost:1/db", r"'mysql\+pymysql://u:\*\*\*@localhost:1/db' needs"),
    ],
)
def test_a_bad_url_fails_with_a_config_error_naming_it(target: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        SampleStore.open(target)
    assert "secret" not in str(info.value), "passwords are never printed"


def test_a_file_is_not_a_run_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="is a file; pass its run directory"):
        SampleStore.open(tmp_path / "notes.txt")


def test_a_closed_store_says_so(tmp_path: Path) -> None:
    store = SampleStore.open(tmp_path)
    store.close()
    store.close()
    with pytest.raises(StoreError, match="is closed"):
        store.count_samples(RUN)
