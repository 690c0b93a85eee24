"""What a reading of the database's health means for the queue: each check, and whether it needs
a human (see docs/operations/health.md). Pure functions of the reading: the store reads, the
reaper and ``miniqueue doctor`` judge with these, so they never disagree.
"""

from __future__ import annotations

from typing import NamedTuple

from .records import HorizonHolder, Partition, TableHealth

#: A snapshot held longer than this (seconds) is reported: by the reaper's log, the gauge's
#: reader, the dashboard and ``miniqueue doctor``.
HORIZON_WARN_SECONDS = 30.0
#: Dead rows in the hot table past this many (and past its live rows) are reported.
DEAD_ROWS_WARN = 100_000
#: The share of the server's connections in use past which headroom is reported.
CONNECTIONS_WARN_SHARE = 0.8
#: A host clock this many seconds away from the database's is reported (leases and schedules
#: count on the database clock; a host's deadlines on its own).
CLOCK_SKEW_WARN_SECONDS = 2.0


class Check(NamedTuple):
    """One line of the diagnosis: its name, whether it is fine, and what it found."""

    name: str
    ok: bool
    detail: str


class Reading(NamedTuple):
    """Everything ``miniqueue doctor`` reads, once."""

    horizon: list[HorizonHolder]
    table: TableHealth
    #: ``(max_connections, superuser_reserved_connections, client connections in use)``.
    connections: tuple[int, int, int]
    schema_version: int
    latest_version: int
    #: This host's clock when the database's was read (seconds since the epoch).
    host_clock: float
    #: The history's partitions, and whether finished jobs from before the history still move.
    history: tuple[Partition, ...] = ()
    legacy: bool = False


def held_too_long(holder: HorizonHolder, seconds: float = HORIZON_WARN_SECONDS) -> bool:
    """Whether ``holder`` has held the horizon back longer than ``seconds`` (a slot, whose start
    the server does not know, always counts)."""
    return holder.seconds is None or holder.seconds > seconds


def check_horizon(holders: list[HorizonHolder], seconds: float = HORIZON_WARN_SECONDS) -> Check:
    """The oldest snapshot, and whether it is held too long."""
    late = [h for h in holders if held_too_long(h, seconds)]
    if late:
        return Check(
            "horizon",
            False,
            f"vacuum cannot remove rows dead since {late[0].describe()}: end it (or drop the slot); "
            f"{len(late)} held over {seconds:g}s",
        )
    oldest = f"oldest snapshot: {holders[0].describe()}" if holders else "no snapshot is held"
    return Check("horizon", True, oldest)


def diagnose(reading: Reading, *, horizon_seconds: float = HORIZON_WARN_SECONDS) -> list[Check]:
    """Every check of ``reading``, in the order ``miniqueue doctor`` prints them."""
    table = reading.table
    limit, reserved, in_use = reading.connections
    usable = max(1, limit - reserved)
    dead = table.dead_rows > DEAD_ROWS_WARN and table.dead_rows > table.live_rows
    skew = reading.host_clock - table.database_clock
    version = reading.schema_version
    return [
        check_horizon(reading.horizon, horizon_seconds),
        Check(
            "dead rows",
            not dead,
            f"{table.dead_rows:,} dead and {table.live_rows:,} live rows in the hot table"
            + (" (vacuum is behind: see the horizon, and autovacuum below)" if dead else ""),
        ),
        Check(
            "sizes",
            True,
            f"table {_size(table.table_bytes)}, indexes {_size(table.index_bytes)}"
            + (f" (claim index {_size(table.claim_index_bytes)})" if table.claim_index_bytes is not None else ""),
        ),
        check_history(reading.history, reading.legacy, table.database_clock),
        Check(
            "autovacuum",
            table.autovacuum,
            f"{'on' if table.autovacuum else 'OFF for the server'}: a vacuum when {table.vacuum_threshold} + "
            f"{table.vacuum_scale_factor:g} x rows are dead; last vacuum "
            + (f"{table.last_vacuum:%Y-%m-%d %H:%M:%S%z}" if table.last_vacuum else "never"),
        ),
        Check(
            "connections",
            in_use <= CONNECTIONS_WARN_SHARE * usable,
            f"{in_use} of {usable} in use ({limit} max_connections, {reserved} reserved)",
        ),
        Check(
            "schema",
            version == reading.latest_version,
            f"version {version}, this miniqueue's is {reading.latest_version}"
            + (": run `miniqueue migrate`" if version < reading.latest_version else "")
            + (": this miniqueue is older than the schema; upgrade it" if version > reading.latest_version else ""),
        ),
        Check(
            "clock",
            abs(skew) <= CLOCK_SKEW_WARN_SECONDS,
            f"this host's clock is {skew:+.3f}s from the database's",
        ),
    ]


def check_history(partitions: tuple[Partition, ...], legacy: bool, now: float) -> Check:
    """The history's partitions, and whether one covers this hour and this day: none does when
    no reaper has run for a while (finished jobs then land in the default partitions)."""
    kinds = {p.kind for p in partitions if p.starts_at.timestamp() <= now < p.ends_at.timestamp()}
    missing = sorted({"done", "failed"} - kinds)
    detail = (
        f"{len(partitions)} partitions, {_size(sum(p.bytes for p in partitions))}, about "
        f"{sum(p.rows for p in partitions):,} finished jobs"
        + (f"; none covers now for {', '.join(missing)} jobs: is a reaper running?" if missing else "")
        + ("; finished jobs from before the upgrade are still moving (the reaper moves them)" if legacy else "")
    )
    return Check("history", not missing, detail)


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    size = n / 1024
    for unit in ("kB", "MB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"
