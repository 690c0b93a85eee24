"""Scratch databases: one per benchmark run, created and migrated here, dropped afterwards."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg.errors
from psycopg import sql
from psycopg.conninfo import make_conninfo

from miniqueue import Client, JobSpec, State, run_migrations

QUEUE = "default"
TASK = "bench.noop"
SEED_BATCH = 1000  # small enough that each filling statement stays below the JIT cost threshold
#: The disk is quiet once it was busy for at most this share of a window of QUIET_WINDOW seconds.
QUIET_SHARE = 0.1
QUIET_WINDOW = 0.5
#: How long to wait for a quiet disk before going on all the same.
QUIET_TIMEOUT = 120.0


def payload(n: int) -> dict[str, Any]:
    """The payload every benchmark job carries: small, like a typical job's arguments."""
    return {"n": n, "to": "user@example.com"}


@contextlib.contextmanager
def scratch_database(server_dsn: str, label: str) -> Iterator[str]:
    """Create and migrate a database of its own on the server; yield its DSN; drop it afterwards."""
    slug = "".join(c if c.isalnum() else "_" for c in label.lower())[:30]
    name = f"miniqueue_bench_{slug}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        dsn = make_conninfo(server_dsn, dbname=name)
        run_migrations(dsn)
        yield dsn
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def seed_jobs(dsn: str, count: int) -> None:
    """Enqueue ``count`` available no-op jobs through the producer API (without NOTIFY)."""
    with Client(dsn, notify=False) as client:
        for start in range(0, count, SEED_BATCH):
            stop = min(start + SEED_BATCH, count)
            client.enqueue_many([JobSpec(TASK, payload(n), queue=QUEUE) for n in range(start, stop)])


def settle(dsn: str) -> None:
    """Bring every run to the same starting point: fresh planner statistics, then a checkpoint.

    ANALYZE stands in for the autovacuum the migration tunes the table for, so plans do not
    depend on when it happened to run; the checkpoint keeps the dirty pages of the filled queue
    from being flushed during the timed part.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE miniqueue_jobs_live")
        # CHECKPOINT needs superuser or pg_checkpoint; without it the runs are only noisier.
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("CHECKPOINT")
    quiet_disk()


def quiet_disk() -> None:
    """Wait until this host's disks are quiet: gigabytes written just before (a seeded history,
    the WAL a checkpoint removed) are written back and discarded for seconds after, and a run
    timed meanwhile measures that, not the queue (a drain beside 10,000,000 seeded jobs ran at
    0.79 x of the default drain straight after the seed, at 0.89 x once the disk was quiet). Reads /proc/diskstats;
    a host without it (or a server elsewhere) is taken as quiet."""
    os.sync()
    deadline = time.monotonic() + QUIET_TIMEOUT
    before = _busy_ms()
    while before and time.monotonic() < deadline:
        time.sleep(QUIET_WINDOW)
        after = _busy_ms()
        if max(after.get(disk, busy) - busy for disk, busy in before.items()) <= QUIET_SHARE * QUIET_WINDOW * 1000:
            return
        before = after


def _busy_ms() -> dict[str, int]:
    """Milliseconds each block device of this host has spent doing I/O (none known: {})."""
    try:
        with open("/proc/diskstats") as stats:
            fields = [line.split() for line in stats]
    except OSError:
        return {}
    # Field 13 is the time spent doing I/O; loop and RAM devices stand for no disk.
    return {f[2]: int(f[12]) for f in fields if len(f) > 12 and not f[2].startswith(("loop", "ram", "zram"))}


def count_in_state(dsn: str, state: State) -> int:
    """How many jobs are in ``state`` (all queues)."""
    with Client(dsn) as client:
        return sum(c.count for c in client.counts() if c.state == state)
