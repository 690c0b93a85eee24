"""A real PgBouncer in transaction mode in front of the test database, and the app the
supervised test runs through it.

Debian's ``pgbouncer`` package provides ``/usr/sbin/pgbouncer`` (``.ci/run`` installs it). It
refuses to run as root, so as root it is started with ``-u``, as the user that owns the
embedded server's socket folder (it must reach the socket), or ``nobody`` for a TCP server.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from miniqueue import App
from miniqueue.tasks.job import Job

from .helpers import wait_until
from .supervised import free_port

PGBOUNCER = Path("/usr/sbin/pgbouncer")
#: Server connections per database and user: fewer than the clients every test opens, so that
#: transactions of different clients really share server connections.
POOL_SIZE = 3

app = App()


@app.task("record")
def record(job: Job) -> None:
    """Insert a row per execution in the same transaction as the job's completion."""
    with job.transaction() as conn:
        conn.execute("INSERT INTO pooled_executions (job_id, attempt) VALUES (%s, %s)", [job.id, job.run])


class PgBouncer:
    """One pgbouncer process (``pool_mode = transaction``) in front of the server ``server_dsn``
    names; ``dsn(dbname)`` reaches a database through it, ``admin(command)`` asks its console."""

    def __init__(self, server_dsn: str) -> None:
        server = conninfo_to_dict(server_dsn)
        host = str(server.get("host") or "/var/run/postgresql")
        self.user = str(server.get("user") or "postgres")
        self.port = free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="miniqueue-pgbouncer-"))
        self.log = self.folder / "pgbouncer.log"
        target = {"host": host, "port": server.get("port") or "5432", "user": self.user}
        if server.get("password"):
            target["password"] = str(server["password"])
        config = self.folder / "pgbouncer.ini"
        config.write_text(_config(" ".join(f"{k}={v}" for k, v in target.items()), self.port, self.user))
        argv = [str(PGBOUNCER), str(config)]
        if os.geteuid() == 0:
            owner = _run_as(host)
            shutil.chown(self.folder, owner)
            shutil.chown(config, owner)
            argv[1:1] = ["-u", owner]
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=self.log.open("wb"), start_new_session=True
        )
        try:
            wait_until(self._answers, timeout=10, what=f"pgbouncer on port {self.port} (log: {self.log})")
        except BaseException:
            self.stop()
            raise

    def dsn(self, dbname: str) -> str:
        """A DSN for ``dbname`` through this pgbouncer (no password: it logs in for the client)."""
        return make_conninfo(host="127.0.0.1", port=self.port, dbname=dbname, user=self.user)

    def admin(self, command: str) -> list[dict[str, Any]]:
        """Rows of a console command (SHOW POOLS, SHOW STATS...), as dicts by column name."""
        with psycopg.connect(self.dsn("pgbouncer"), autocommit=True, prepare_threshold=None) as conn:
            cur = conn.execute(command)
            names = [col.name for col in cur.description or []]
            return [dict(zip(names, values, strict=True)) for values in cur.fetchall()]

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # pgbouncer's immediate shutdown (SIGINT waits for clients)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"pgbouncer exited with {self.proc.returncode}: {self.output()}")
        with contextlib.suppress(psycopg.OperationalError):
            self.admin("SHOW VERSION")
            return True
        return False


def _config(target: str, port: int, user: str) -> str:
    # auth_type any: pgbouncer logs in as the [databases] entry's user whatever the client says.
    # No ignore_startup_parameters: a client that sends `options` is refused, as by default.
    return f"""\
[databases]
* = {target}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
admin_users = {user}
pool_mode = transaction
default_pool_size = {POOL_SIZE}
max_client_conn = 200
server_reset_query =
"""


def _run_as(host: str) -> str:
    """The user a root-started pgbouncer switches to: one that can reach the server."""
    if host.startswith("/"):
        return pwd.getpwuid(os.stat(host).st_uid).pw_name
    return "nobody"
