"""A locked store waits instead of failing; reads never wait for a writer; async callers keep their loop
(`vime.temporal.store_calls.store_call` runs the store off the event loop).

The lock is what a chaos drill takes: another process runs `BEGIN EXCLUSIVE` on the run's
SQLite file and holds it. Busy timeouts are made small here so that the lock outlasts them.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing, contextmanager
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from vime.temporal.store_calls import store_call
from tests.test_store import RUN, random_sample, run_python
from vime.errors import ConfigError
from vime.store import (
    SampleStore,
    StepManifest,
    StoreLockedError,
)
from vime.store.database import retry_when_locked

HOLD_LOCK = """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=0)
    conn.execute("BEGIN EXCLUSIVE")
    conn.execute("INSERT INTO runs (run_id, created_at) VALUES ('uncommitted', '2025-01-01 00:00:00')")
    print("locked", flush=True)
    sys.stdin.readline()
    conn.execute("ROLLBACK")
"""


@contextmanager
def exclusive_lock(run_dir: Path) -> Iterator[Callable[[], None]]:
    """Another process holds `BEGIN EXCLUSIVE` on the store until `release()` (or the block ends)."""
    holder = run_python(HOLD_LOCK, str(run_dir / "vime.db"), stdin=subprocess.PIPE)
    assert holder.stdout.readline().strip() == "locked", holder.stderr.read()

    def release() -> None:
        if holder.poll() is None:
            holder.stdin.write("\n")
            holder.stdin.flush()
            assert holder.wait(10) == 0, holder.stderr.read()

    try:
        yield release
    finally:
        release()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A store with run-0 and rollouts 'a' (2 siblings) and 'b' (1)."""
    with SampleStore.open(tmp_path) as store:
        store.ensure_run(RUN)
        store.write_rollouts(RUN, {"a": [random_sample(1), random_sample(2)], "b": [random_sample(3)]})
    return tmp_path


def still_waiting(futures: list[Future]) -> bool:
    return not any(f.done() for f in futures)


def test_writes_wait_out_a_lock_held_longer_than_the_busy_timeout_and_store_once(run_dir: Path) -> None:
    """Each write is started twice (a retried activity beside the original): both finish, one is stored."""
    with SampleStore.open(run_dir, busy_timeout_s=0.2, lock_wait_s=60) as store, ThreadPoolExecutor(16) as pool:
        writes = {
            "rollout": lambda: store.write_rollouts(RUN, {"c": [random_sample(4), random_sample(5)]}),
            "trained": lambda: store.mark_trained(RUN, ["a/0", "a/1"], step=0),
            "manifest": lambda: store.write_step_manifest(RUN, 0, ["a", "b"], weight_version=2),
            "turn": lambda: store.append_turn(RUN, "agent", 0, [1, 2], [0, 1], [0.0, -0.5]),
            "run": lambda: store.ensure_run("run-1", {"lr": 1.0}),
        }
        with exclusive_lock(run_dir) as release:
            futures = {name: [pool.submit(write), pool.submit(write)] for name, write in writes.items()}
            time.sleep(2.0)  # ten busy timeouts
            assert still_waiting([f for pair in futures.values() for f in pair]), "nothing is written under the lock"
            released_at = time.monotonic()
            release()
            results = {name: [f.result(timeout=15) for f in pair] for name, pair in futures.items()}
            assert time.monotonic() - released_at < 10, "writes go ahead soon after the lock is released"

        rollout_refs, other_refs = results["rollout"]
        assert rollout_refs == other_refs and [r.key for r in rollout_refs["c"]] == ["c/0", "c/1"]
        assert sorted(results["trained"]) == [0, 2], "one call marked both samples, the other found them marked"
        assert results["manifest"][0] == results["manifest"][1] == StepManifest(RUN, 0, ["a", "b"], 2, {})
        assert sorted(results["turn"]) == [False, True], "the turn is stored by exactly one of the two"
        assert results["run"] == [{"lr": 1.0}, {"lr": 1.0}]

        assert store.count_samples(RUN) == 5
        assert store.trained_counts(RUN) == {0: 2}
        assert [t.turn for t in store.read_turns(RUN, "agent")] == [0]
        with store.engine.connect() as conn:
            runs = conn.exec_driver_sql("SELECT run_id FROM runs ORDER BY run_id").scalars().all()
        assert runs == ["run-0", "run-1"], "the lock holder's own write was rolled back, ours stayed"


def test_a_write_gives_up_with_a_clear_error_when_the_lock_outlasts_lock_wait_s(run_dir: Path) -> None:
    with SampleStore.open(run_dir, busy_timeout_s=0.2, lock_wait_s=1.0) as store:
        with exclusive_lock(run_dir):
            began = time.monotonic()
            expected = r"store 'sqlite:///.*vime.db' stayed locked for 1 s .*fuser .*lock_wait_s"
            with pytest.raises(StoreLockedError, match=expected):
                store.write_rollout(RUN, "c", [random_sample(4)])
            assert 1.0 <= time.monotonic() - began < 3.0
        assert store.rollout_refs(RUN, "c") == [], "a write that gave up stored nothing"


def test_reads_do_not_wait_for_a_writer_holding_the_lock(run_dir: Path) -> None:
    """WAL: readers see the last commit while another process holds the write lock, even with
    more writers waiting on that lock than the connection pool's usual size."""
    with SampleStore.open(run_dir) as store, ThreadPoolExecutor(20) as pool:
        store.write_step_manifest(RUN, 0, ["a", "b"])
        store.append_turn(RUN, "agent", 0, [1], [1])
        with exclusive_lock(run_dir):
            waiting = [pool.submit(store.write_rollout, RUN, f"w{i}", [random_sample(i)]) for i in range(20)]
            time.sleep(0.5)
            reads = {
                "read_samples": lambda: [s.index for s in store.read_samples(RUN, ["b/0", "a/1"])],
                "read_rollout": lambda: len(store.read_rollout(RUN, "a")),
                "rollout_refs": lambda: len(store.rollout_refs(RUN, "a")),
                "count_samples": lambda: store.count_samples(RUN),
                "iter_samples": lambda: [ref.key for ref, _ in store.iter_samples(RUN, batch_size=2)],
                "read_step_manifest": lambda: store.read_step_manifest(RUN, 0).rollout_ids,
                "read_step_samples": lambda: len(store.read_step_samples(RUN, 0)),
                "trained_counts": lambda: store.trained_counts(RUN),
                "read_turns": lambda: len(store.read_turns(RUN, "agent")),
                "last_turn": lambda: store.last_turn(RUN, "agent"),
            }
            answers, slowest = {}, 0.0
            for name, read in reads.items():
                began = time.monotonic()
                answers[name] = read()
                slowest = max(slowest, time.monotonic() - began)
            assert still_waiting(waiting)
        assert [len(f.result(timeout=30)) for f in waiting] == [1] * 20

    assert slowest < 1.0, f"a read took {slowest:.1f} s under the lock"
    assert answers == {
        "read_samples": [3, 2],
        "read_rollout": 2,
        "rollout_refs": 2,
        "count_samples": 3,
        "iter_samples": ["a/0", "a/1", "b/0"],
        "read_step_manifest": ["a", "b"],
        "read_step_samples": 3,
        "trained_counts": {},
        "read_turns": 1,
        "last_turn": 0,
    }


def test_busy_errors_sqlite_reports_without_waiting_are_retried(run_dir: Path) -> None:
    """A deferred transaction that read, then writes after another connection committed, gets
    SQLITE_BUSY_SNAPSHOT at once (the busy handler cannot help: its snapshot is stale)."""
    insert_run = "INSERT INTO runs (run_id, created_at) VALUES (?, '2025-01-01')"
    with SampleStore.open(run_dir) as store, closing(sqlite3.connect(run_dir / "vime.db")) as other:
        tries: list[float] = []

        def read_then_write() -> None:
            tries.append(time.monotonic())
            with store.engine.connect() as conn:  # BEGIN DEFERRED
                conn.exec_driver_sql("SELECT count(*) FROM runs").all()
                if len(tries) == 1:  # another process commits between our read and our write
                    other.execute(insert_run, (f"other-{tries[0]}",))
                    other.commit()
                conn.exec_driver_sql(insert_run, ("ours",))
                conn.commit()

        with pytest.raises(OperationalError) as info:
            read_then_write()
        assert info.value.orig.sqlite_errorname == "SQLITE_BUSY_SNAPSHOT"
        assert time.monotonic() - tries[0] < 1.0, "reported at once, not after the 300 s busy timeout"

        tries.clear()
        retry_when_locked(store.engine, read_then_write, lock_wait_s=10)
        assert len(tries) == 2, "retried once, then stored"

        def no_such_table() -> None:
            with store.engine.connect() as conn:
                conn.exec_driver_sql("SELECT * FROM nope")

        with pytest.raises(OperationalError, match="no such table"):
            retry_when_locked(store.engine, no_such_table)


def test_the_default_busy_timeout_outlasts_a_lock_held_for_minutes(tmp_path: Path) -> None:
    with SampleStore.open(tmp_path) as store, store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 300_000
    with pytest.raises(ConfigError, match="lock_wait_s -1 must be a number of seconds >= 0"):
        SampleStore.open(tmp_path, lock_wait_s=-1)
    with pytest.raises(ConfigError, match="busy_timeout_s 'long' must be a number of seconds"):
        SampleStore.open(tmp_path, busy_timeout_s="long")


# ---- async callers ---------------------------------------------------------------------------


async def test_the_event_loop_keeps_running_while_a_write_waits_for_the_lock(run_dir: Path) -> None:
    with SampleStore.open(run_dir, busy_timeout_s=0.2, lock_wait_s=60) as store:
        with exclusive_lock(run_dir) as release:
            write = asyncio.create_task(store_call(store.write_rollout, RUN, "c", [random_sample(4)]))
            ticks, began = 0, time.monotonic()
            while time.monotonic() - began < 1.5:  # stands for heartbeats and workflow tasks
                await asyncio.sleep(0.01)
                ticks += 1
            assert ticks > 50, f"the loop ran only {ticks} times in 1.5 s"
            assert not write.done()
            rollout = await store_call(store.read_rollout, RUN, "a")
            assert [s.index for s in rollout] == [1, 2], "reads go on meanwhile"
            release()
            refs = await asyncio.wait_for(write, 15)
        assert [r.key for r in refs] == ["c/0"]
        assert await store_call(store.write_rollout, RUN, "c", [random_sample(9)]) == refs
