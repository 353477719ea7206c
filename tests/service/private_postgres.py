"""A private PostgreSQL server for outage tests: initdb + pg_ctl in a directory of the test's
own, on a free port, run as the `postgres` user. Stopping it never touches the machine's own
server on 5432.

    with PrivatePostgres() as pg:                # started, database "gdn_sweep" created
        url = pg.url                              # postgresql+psycopg://postgres@127.0.0.1:PORT/gdn_sweep
        pg.stop()                                 # the database is unreachable (connections refused)
        pg.start()                                # back, same data
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from workers.process_probe import free_port

PG_BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def _pg_tool(name: str) -> str:
    for directory in PG_BIN_DIRS:
        if (directory / name).exists():
            return str(directory / name)
    found = shutil.which(name)
    if found is None:
        from .conftest import postgres_missing

        postgres_missing(f"{name} not found (PostgreSQL server binaries are needed for outage "
                         "tests)")
    return found


class PrivatePostgres:
    """One throw-away PostgreSQL cluster (data, socket and log in a fresh directory under
    /tmp: pytest's tmp_path lies under a root-only directory the postgres user cannot enter)."""

    def __init__(self, *, database: str = "gdn_sweep") -> None:
        self.base = Path(tempfile.mkdtemp(prefix="gdn-sweep-pg-"))
        self.data, self.sockets = self.base / "data", self.base / "sockets"
        self.log = self.base / "server.log"
        self.port = free_port()
        self.database = database
        self._as_postgres = [] if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--"]

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{self.database}"

    def _run(self, *argv: str, timeout: float = 60) -> None:
        subprocess.run([*self._as_postgres, *argv], check=True, timeout=timeout,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def init(self) -> None:
        self.sockets.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
            shutil.chown(self.sockets, "postgres")
        self._run(_pg_tool("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c max_connections=200")
        self._run(_pg_tool("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options,
                  "-w", "-t", "60", "start")

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (`immediate`: like a crash, every connection dropped at once)."""
        self._run(_pg_tool("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def create_database(self) -> None:
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True, connect_timeout=10) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')

    def __enter__(self) -> "PrivatePostgres":
        self.init()
        self.start()
        self.create_database()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass  # already stopped by the test
        shutil.rmtree(self.base, ignore_errors=True)
