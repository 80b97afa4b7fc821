"""A throwaway PostgreSQL server for the store tests: Debian's `postgresql` binaries, a fresh
cluster in a temporary directory, on a free loopback port, stopped with the test session.

Each test gets its own database (`create_database`), so tests never see each other's rows and
nothing is dropped between them. `VIME_TEST_POSTGRES_URL` (a server URL such as
`postgresql+psycopg://postgres@127.0.0.1:5432/postgres`) uses a running server instead.

PostgreSQL refuses to run as root; as root the cluster belongs to the `postgres` user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import sqlalchemy
from sqlalchemy.engine import URL, make_url

INSTALL_HINT = ("the store tests run on PostgreSQL too: install it (Debian: apt-get install postgresql; "
                "scripts/setup.sh does) or set VIME_TEST_POSTGRES_URL to a server's URL")


def _bin_dir() -> Path:
    """Where `initdb`, `pg_ctl` and `postgres` live (Debian keeps them out of PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    pg_ctl = shutil.which("pg_ctl")
    if pg_ctl:
        return Path(pg_ctl).parent
    raise RuntimeError(f"no PostgreSQL server binaries (pg_ctl) found; {INSTALL_HINT}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """One cluster; `url(database)` names a database on it, `create_database()` makes a fresh one."""

    def __init__(self) -> None:
        # not under pytest's tmp_path: /tmp/pytest-of-root is 0700, and the server runs as postgres
        self.root = Path(tempfile.mkdtemp(prefix="vime-postgres-"))
        self.server_url: URL | None = None
        self._owned = False
        self._user: str | None = None

    def start(self) -> PostgresServer:
        given = os.environ.get("VIME_TEST_POSTGRES_URL")
        if given:
            self.server_url = make_url(given)
            return self
        bin_dir = _bin_dir()
        data, sockets = self.root / "data", self.root / "sockets"
        data.mkdir()
        sockets.mkdir()
        self._user = "postgres" if os.geteuid() == 0 else None
        if self._user:
            entry = pwd.getpwnam(self._user)
            for path in (self.root, data, sockets):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        port = _free_port()
        self._run(bin_dir / "initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        # fsync off: a test cluster need not survive a power cut, and its writes are then as quick
        # as SQLite's WAL; max_connections covers the tests' parallel writer processes
        options = (f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run(bin_dir / "pg_ctl", "-D", data, "-l", self.root / "server.log", "-o", options, "-w", "-t", "60",
                  "start")
        self._owned = True
        self.server_url = URL.create("postgresql+psycopg", username="postgres", host="127.0.0.1", port=port,
                                     database="postgres")
        return self

    def stop(self) -> None:
        if self._owned:
            self._run(_bin_dir() / "pg_ctl", "-D", self.root / "data", "-m", "immediate", "-w", "stop",
                      check=False)
            self._owned = False
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str) -> str:
        assert self.server_url is not None, "start() first"
        return self.server_url.set(database=database).render_as_string(hide_password=False)

    def create_database(self) -> str:
        """A new empty database; its URL, ready for `SampleStore.open`."""
        name = f"vime_test_{uuid.uuid4().hex[:12]}"
        engine = sqlalchemy.create_engine(self.url(self.server_url.database or "postgres"),
                                          isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        finally:
            engine.dispose()
        return self.url(name)

    def _run(self, *cmd, check: bool = True) -> None:
        argv = [str(part) for part in cmd]
        if self._user:
            argv = ["runuser", "-u", self._user, "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, cwd="/")
        if check and done.returncode != 0:
            log = self.root / "server.log"
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}"
                               + (f"\n{log.read_text()[-2000:]}" if log.exists() else ""))
