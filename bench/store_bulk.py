"""Bulk sample store throughput: agent-sized samples written and read back in trainer-sized
batches, on SQLite (a run directory) and on PostgreSQL side by side.

    python bench/store_bulk.py [--samples 10000] [--batch 1000] [--length 4096] [--prompt-length 512]
                               [--postgres-url URL]

PostgreSQL: `--postgres-url` (a server URL; a fresh database is created on it), else a
throwaway cluster from Debian's `postgresql` binaries when they are installed (tests/postgres.py),
else SQLite only. Every batch read back must equal what was written, field for field; a
mismatch fails the benchmark (exit 1) with no figures. Prints, per backend, the seconds to write
and to read every sample and the size stored, then PostgreSQL's time over SQLite's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vime.store import SampleStore  # noqa: E402
from vime.testing.samples import random_rollouts  # noqa: E402

RUN = "bench"


def round_trip(location: str, args) -> tuple[float, float, float]:
    """Write every sample, then read every batch back and compare: (write s, read s, MiB stored)."""
    shape = {"length": args.length, "prompt_length": args.prompt_length}
    write_s = read_s = 0.0
    with SampleStore.open(location) as store:
        store.ensure_run(RUN)
        for start in range(0, args.samples, args.batch):
            rollouts = random_rollouts(start, args.batch, **shape)
            began = time.perf_counter()
            store.write_rollouts(RUN, rollouts)
            write_s += time.perf_counter() - began
        for start in range(0, args.samples, args.batch):
            expected = [s for siblings in random_rollouts(start, args.batch, **shape).values() for s in siblings]
            keys = [f"group-{i // 4}/{i % 4}" for i in range(start, start + args.batch)]
            began = time.perf_counter()
            got = store.read_samples(RUN, keys)
            read_s += time.perf_counter() - began
            if got != expected:
                sys.exit(f"store_bulk: FAILED: batch at sample {start} on {store.engine.dialect.name} "
                         "came back different from what was written")
        return write_s, read_s, size_mib(store)


def size_mib(store: SampleStore) -> float:
    if store.engine.dialect.name == "sqlite":
        return Path(store.engine.url.database).stat().st_size / 2**20
    with store.engine.connect() as conn:
        return conn.exec_driver_sql("SELECT pg_database_size(current_database())").scalar() / 2**20


def postgres_database(url: str | None):
    """(a fresh database's URL, the server to stop afterwards); (None, None) without PostgreSQL."""
    import os

    from tests.postgres import PostgresServer

    if url:
        os.environ["VIME_TEST_POSTGRES_URL"] = url  # a server of the user's: a new database on it
    try:
        server = PostgresServer().start()
        return server.create_database(), server
    except Exception as exc:  # no binaries, no permission, no server: SQLite alone is still a figure
        print(f"store_bulk: no PostgreSQL ({exc}); SQLite only", file=sys.stderr)
        return None, None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=1_000)
    parser.add_argument("--length", type=int, default=4_096)
    parser.add_argument("--prompt-length", type=int, default=512)
    parser.add_argument("--postgres-url", default=None)
    args = parser.parse_args()
    if args.samples % args.batch or args.batch % 4:
        parser.error("--samples must be a multiple of --batch, and --batch of 4 (rollouts of 4 siblings)")
    figures = {}
    with tempfile.TemporaryDirectory(prefix="vime-store-bulk-") as tmp:
        figures["sqlite"] = round_trip(str(Path(tmp) / "run"), args)
    database, server = postgres_database(args.postgres_url)
    try:
        if database:
            figures["postgresql"] = round_trip(database, args)
    finally:
        if server:
            server.stop()
    print(f"{args.samples:,} samples x {args.length:,} tokens, batches of {args.batch:,}:")
    for backend, (write_s, read_s, mib) in figures.items():
        print(f"  {backend:<10} write {write_s:6.2f} s  read {read_s:6.2f} s  {mib:7.0f} MiB stored")
    if "postgresql" in figures:
        sqlite, pg = figures["sqlite"], figures["postgresql"]
        print(f"  postgresql / sqlite: write {pg[0] / sqlite[0]:.2f}x, read {pg[1] / sqlite[1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
