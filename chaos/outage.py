"""The outage of a run over several databases: one server stopped mid-run and started again,
the other databases' throughput meanwhile, and the drain of every database afterwards.

The rate is measured from each database's own records (the completions the transition trigger
stamped with the database's clock, on this host's clock after the offset measured at the start):
completions of the other databases per second in the window before the stop (from 1 s after the
enqueue, so that the workers' first claims are behind them) and in the window while the server
was down. Jobs are all due at once and the workload outlasts the outage, so both windows measure
what the workers can do, not how fast jobs arrive; the harness checks that last part (each other
database had jobs waiting at every sample through the outage), since a ratio over a queue that
ran dry would measure nothing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from miniqueue.core.shard_map import MODULUS

from .databases import Databases, Shard
from .evidence import Evidence
from .faults import Fault
from .fleet import Fleet
from .options import STOP_DATABASE, Options
from .rows import Row, info, rule
from .supervisors import SupervisorLog

TICK = 0.1
#: The rate before the stop is counted from this long after the enqueue.
WARMUP = 1.0
#: How often the other databases' waiting jobs are counted while the server is down.
SAMPLE_EVERY = 1.0
#: The other databases' throughput while one is down, as a share of theirs before, at least.
MIN_RATIO = 0.8


@dataclass
class Outage:
    """The stopped database and when each step happened (this host's epoch seconds)."""

    shard: Shard
    enqueued: float
    stopping: float = 0.0  # pg_ctl stop issued
    down: float = 0.0  # pg_ctl stop returned: the server is gone
    starting: float = 0.0  # pg_ctl start issued
    up: float = 0.0  # pg_ctl start returned: it accepts connections
    #: Each other database's jobs waiting for a worker, counted through the outage.
    backlog: dict[str, list[int]] = field(default_factory=dict)
    fault: Fault | None = None
    #: With --kill-in-outage: the SIGKILL of the stopped database's supervisor.
    kill: Fault | None = None

    @property
    def faults(self) -> list[Fault]:
        return [f for f in (self.fault, self.kill) if f is not None]


def run_outage(
    options: Options, fleet: Fleet, databases: Databases, outage: Outage, say: Callable[[str], None]
) -> None:
    """Let the jobs run ``outage_after`` seconds, stop the chosen server for ``outage`` seconds
    (counting the others' waiting jobs meanwhile), start it again."""
    _watch(fleet, outage.enqueued + options.outage_after)
    shard = outage.shard
    outage.stopping = time.time()
    shard.server.halt()
    outage.down = time.time()
    say(f"stopped the server of {shard.name} (pg_ctl stop -m fast, {outage.down - outage.stopping:.1f}s)")
    if options.kill_in_outage:
        _sample(fleet, databases, outage, until=outage.down + min(1.0, options.outage / 2))
        outage.kill = kill_supervisor(fleet, shard.name, say)
    _sample(fleet, databases, outage, until=outage.down + options.outage)
    outage.starting = time.time()
    shard.server.resume()
    outage.up = time.time()
    outage.fault = Fault(
        STOP_DATABASE,
        outage.stopping,
        outage.up,
        detail=f"{shard.name}'s server stopped (pg_ctl stop -m fast) for {outage.starting - outage.down:.1f}s",
        database=shard.index,
    )
    say(f"started the server of {shard.name} again ({outage.up - outage.starting:.1f}s)")


def _sample(fleet: Fleet, databases: Databases, outage: Outage, until: float) -> None:
    """Count the other databases' waiting jobs every SAMPLE_EVERY seconds, and once at ``until``."""
    others = [s for s in databases.shards if s is not outage.shard]
    while True:
        for name, count in databases.available(others).items():
            outage.backlog.setdefault(name, []).append(count)
        if time.time() >= until:
            return
        _watch(fleet, min(until, time.time() + SAMPLE_EVERY))


def kill_supervisor(fleet: Fleet, database: str, say: Callable[[str], None]) -> Fault | None:
    """SIGKILL ``database``'s supervisor (found in the log, the latest one started); its
    children must then exit by themselves, and the process above start it again."""
    pid = SupervisorLog.parse(fleet.supervisors[-1].output()).current(database)
    if pid is None:
        say(f"no supervisor of {database} found in the log: none killed")
        return None
    try:
        children = tuple(c.pid for c in psutil.Process(pid).children())
    except psutil.Error:
        children = ()
    at = time.time()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    say(f"killed {database}'s supervisor (pid {pid}) while its server is down")
    return Fault("kill-supervisor", at, at, pids=(pid, *children), detail=f"{database}'s supervisor, its server down")


def _watch(fleet: Fleet, until: float) -> None:
    """Follow the supervisors (and restart one that died) until ``until`` (epoch seconds)."""
    while time.time() < until:
        fleet.monitor()
        time.sleep(min(TICK, max(0.0, until - time.time())))


def drain_all(
    options: Options, fleet: Fleet, databases: Databases, say: Callable[[str], None]
) -> tuple[float | None, str | None]:
    """Wait until no database has a job available, running or waiting: the seconds it took, or
    what was left at ``--drain-timeout``."""
    started = time.monotonic()
    next_report = started + 10.0
    while True:
        fleet.monitor()
        left = {name: n for name, n in databases.unfinished().items() if n}
        now = time.monotonic()
        if not left:
            say(f"drained {now - started:.1f}s after the server was up again")
            return now - started, None
        if now > started + options.drain_timeout:
            problem = f"jobs still unfinished {options.drain_timeout:g}s after the outage: {left}"
            say(f"PROBLEM: {problem}")
            return None, problem
        if now >= next_report:
            say(f"draining: {left}")
            next_report = now + 10.0
        time.sleep(0.2)


# -- the checks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Throughput:
    """Each other database's completions per second before the stop and while it was down."""

    before: dict[str, float]
    during: dict[str, float]

    @property
    def ratio(self) -> float:
        total = sum(self.before.values())
        return sum(self.during.values()) / total if total else 0.0

    @classmethod
    def measure(cls, ev: Evidence, outage: Outage, shards: list[Shard]) -> Throughput:
        done = _completion_times(ev)
        before = (outage.enqueued + WARMUP, outage.stopping)
        during = (outage.down, outage.starting)
        others = [s for s in shards if s is not outage.shard]
        return cls(
            {s.name: _rate(done.get(s.index, []), before) for s in others},
            {s.name: _rate(done.get(s.index, []), during) for s in others},
        )


def outage_rows(ev: Evidence, outage: Outage, shards: list[Shard], data: dict[str, Any]) -> list[Row]:
    """The outage's figures and its two rules: the others' throughput held, and they had work."""
    name = outage.shard.name
    rate = Throughput.measure(ev, outage, shards)
    before, during = sum(rate.before.values()), sum(rate.during.values())
    starved = [
        f"{db}: no job waiting at sample {counts.index(0) + 1} of {len(counts)} (a longer workload is needed)"
        for db, counts in sorted(outage.backlog.items())
        if 0 in counts
    ]
    back = [t - outage.up for t in _completion_times(ev).get(outage.shard.index, []) if t >= outage.up]
    data["outage"] = _outage_data(outage, rate, min(back) if back else None)
    low = [] if rate.ratio >= MIN_RATIO else [f"{during:.1f}/s while down, {before:.1f}/s before"]
    window = outage.stopping - outage.enqueued - WARMUP
    return [
        info(
            f"outage: {name}'s server stopped {outage.stopping - outage.enqueued:.1f}s after the enqueue",
            f"down {outage.starting - outage.down:.1f}s (stop {outage.down - outage.stopping:.1f}s, "
            f"start {outage.up - outage.starting:.1f}s)",
        ),
        info(f"  the others' completions in the {window:.1f}s before it", f"{before:.1f}/s"),
        info("  the others' completions while it was down", f"{during:.1f}/s"),
        *[info(f"    {db}", f"{rate.during[db]:.1f}/s, {rate.before[db]:.1f}/s before") for db in rate.before],
        rule(
            f"  their throughput while it was down, of before (>= {MIN_RATIO:g}x)",
            low,
            "must hold",
            f"{rate.ratio:.2f}x",
        ),
        rule("  the others had jobs waiting all through the outage", starved, "must hold", "no" if starved else "yes"),
        info(f"  {name}: its first completion after the server was up", f"{min(back):.1f}s" if back else "-"),
    ]


def _outage_data(outage: Outage, rate: Throughput, first_back: float | None) -> dict[str, Any]:
    """The outage in the JSON result (seconds, completions per second)."""
    return {
        "database": outage.shard.name,
        "stop_seconds": round(outage.down - outage.stopping, 3),
        "down_seconds": round(outage.starting - outage.down, 3),
        "start_seconds": round(outage.up - outage.starting, 3),
        "rate_before": round(sum(rate.before.values()), 2),
        "rate_during": round(sum(rate.during.values()), 2),
        "ratio": round(rate.ratio, 3),
        "ratio_by_database": {db: round(rate.during[db] / b, 3) if b else None for db, b in rate.before.items()},
        "backlog": outage.backlog,
        "first_completion_after_start": round(first_back, 3) if first_back is not None else None,
    }


def _completion_times(ev: Evidence) -> dict[int, list[float]]:
    """Every completion's time, by the index of its job's database (its id's residue)."""
    found: dict[int, list[float]] = {}
    for job, attempts in ev.completions.items():
        found.setdefault(job % MODULUS, []).extend(a.ended for a in attempts if a.ended is not None)
    return found


def _rate(times: list[float], window: tuple[float, float]) -> float:
    """Events per second of ``times`` within ``window``."""
    lo, hi = window
    return sum(1 for t in times if lo <= t < hi) / (hi - lo) if hi > lo else 0.0
