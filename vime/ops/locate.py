"""Which store a command reads: `--store-url`, else `--fleet` (a `vime fleet` directory: every run
on the fleet), else `--run-dir`, else `runs/<RUN>` (where `vime train` puts a run by default); and
which Temporal: `--temporal-address`, else the fleet's while it serves, else the run's launch's."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vime.errors import ConfigError
from vime.store import SampleStore
from vime.store.database import DB_FILENAME


def add_location_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", help="the run's directory (default: runs/RUN)")
    parser.add_argument("--store-url", help="SQLAlchemy URL of the store, e.g. postgresql+psycopg://user@host/vime")
    parser.add_argument("--fleet", metavar="DIR", help="a `vime fleet` directory: the store of every run on the "
                        "fleet, and its Temporal while it serves")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run_dir_of(run_id: str | None, run_dir: str | None) -> Path:
    return Path(run_dir) if run_dir else Path("runs") / (run_id or "")


@contextmanager
def open_existing(location: str | Path) -> Iterator[SampleStore]:
    """The store at a run directory or URL; a directory without one is an error, not a new store."""
    text = str(location)
    if "://" not in text and not (Path(text) / DB_FILENAME).is_file():
        raise ConfigError(f"no vime store in {text!r} (no {DB_FILENAME}); pass the run's --run-dir, or --store-url")
    with SampleStore.open(text, lock_wait_s=30) as store:
        yield store


def store_for(args: argparse.Namespace) -> str:
    if not args.store_url and args.fleet:
        return f"sqlite:///{Path(args.fleet).resolve() / DB_FILENAME}"
    return args.store_url or str(run_dir_of(getattr(args, "run", None), args.run_dir))


def temporal_for(args: argparse.Namespace, launch: dict | None) -> str | None:
    """The Temporal a command asks: --temporal-address, else the fleet's (`--fleet`, while it
    serves), else the one of the run's running launch (`launch`: its launch.json)."""
    if args.temporal_address:
        return args.temporal_address
    if args.fleet:
        from vime.launcher.fleet_info import read_fleet

        try:
            return read_fleet(args.fleet).temporal_address
        except ConfigError:
            return None  # the fleet is down: what its store recorded
    return (launch or {}).get("temporal")
