"""A long transaction is reported (docs/operations/health.md).

- ``horizon-report``: 20 x --jobs no-op jobs (200,000 by default) drained by ``miniqueue-supervise
  --workers 2`` with its defaults and a metrics port; a second after the drain starts, another
  session opens a transaction, takes a transaction id and goes idle in it (the commonest cause:
  a session left idle in a transaction). Then, once a second, each of the four places an
  operator looks is read until it names that session's pid: the gauge
  (``miniqueue_horizon_held_seconds`` on ``/metrics``), the reaper's warning in the log, the
  dashboard's banner and ``miniqueue doctor`` (which must also exit 1). p50 is when the last of
  the four named it and p99 when the first did, in ms after the transaction began; a run fails
  unless all four did within 60 s (the threshold is the defaults' 30 s).
- ``drain-horizon-2``: ``drain-2-default``'s drain (its baseline, in the same run) while another
  session of the same database holds one snapshot throughout (``REPEATABLE READ``, opened before
  the enqueue, closed after the last completion): no row version the claims and completions leave
  behind can be vacuumed, so each claim walks past them (docs/figures.md, "Under a held horizon").
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable

from starlette.testclient import TestClient

from miniqueue import Client, JobSpec
from miniqueue.core.db import connect
from miniqueue.web.server import create_app

from .database import QUEUE, TASK, payload, settle
from .drain import NOOP_APP, drain_through_supervisor, enqueue_in_one_transaction, noop_jobs
from .measure import Sample
from .registry import Benchmark, Context
from .supervised import REPO_ROOT, SuperviseOptions, supervised

HORIZON_SCALE = 20
#: Every place must name the holder within this many seconds of its transaction's start.
REPORTED_WITHIN = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def horizon_report(ctx: Context) -> Sample:
    """How long until the gauge, the log, the dashboard and doctor name a session idle in a transaction."""
    count = ctx.jobs * HORIZON_SCALE
    port = _free_port()
    options = SuperviseOptions("bench.apps:noop_app", ctx.workers, extra=("--metrics-port", str(port)))
    settle(ctx.dsn)
    seen: dict[str, float] = {}
    with supervised(ctx.dsn, options) as supervisor, connect(ctx.dsn, purpose="bench") as conn:
        enqueue_in_one_transaction(ctx.dsn, conn, [JobSpec(TASK, payload(n), queue=QUEUE) for n in range(count)])
        time.sleep(ctx.sized(1.0, 0.0))  # the drain under way
        with connect(ctx.dsn, purpose="nightly-report", autocommit=False) as holder, Client(ctx.dsn) as client:
            pid = holder.info.backend_pid
            holder.execute("SELECT txid_current()")  # an xid taken, then idle in the transaction
            began = time.monotonic()
            named = f"pid {pid}"
            with TestClient(create_app(client), base_url="http://localhost") as web:
                looks: dict[str, Callable[[], bool]] = {
                    "gauge": lambda: f'pid="{pid}"' in _get(f"http://127.0.0.1:{port}/metrics"),
                    "log": lambda: f"held back by transaction {named}" in supervisor.output(),
                    "dashboard": lambda: _banner_names(web.get("/").text, named),
                    "doctor": lambda: _doctor_names(ctx.dsn, pid),
                }
                while len(seen) < len(looks) and time.monotonic() - began < ctx.sized(REPORTED_WITHIN + 5, 2.0):
                    for place, look in looks.items():
                        if place not in seen and look():
                            seen[place] = time.monotonic() - began
                    time.sleep(1.0)
            holder.rollback()
    late = [place for place in ("gauge", "log", "dashboard", "doctor") if seen.get(place, 1e9) > REPORTED_WITHIN]
    if late and not ctx.tiny:
        raise RuntimeError(f"horizon-report: not named within {REPORTED_WITHIN:g} s by {late}; seen {seen}")
    return Sample(
        jobs=count,
        seconds=max(seen.values(), default=0.0),
        p50_ms=max(seen.values(), default=0.0) * 1000,
        p99_ms=min(seen.values(), default=0.0) * 1000,
        rss_mb=None,
    )


def _banner_names(page: str, named: str) -> bool:
    return "MVCC horizon is held back" in page and named in page


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def _doctor_names(dsn: str, pid: int) -> bool:
    done = subprocess.run(
        [sys.executable, "-m", "miniqueue.cli", "doctor", "--json", "--database-url", dsn],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    if done.returncode != 1:
        return False
    report = json.loads(done.stdout)
    horizon = next(c for c in report["checks"] if c["name"] == "horizon")
    return not horizon["ok"] and any(h["pid"] == pid for h in report["horizon"])


def drain_beside_a_held_snapshot(ctx: Context) -> Sample:
    """``drain-2-default``'s drain while a session of the same database holds one snapshot."""
    with connect(ctx.dsn, purpose="bench-horizon", autocommit=False) as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM miniqueue_jobs")  # the snapshot, held until the rollback
        try:
            return drain_through_supervisor(ctx.dsn, SuperviseOptions(NOOP_APP, ctx.workers), noop_jobs(ctx))
        finally:
            holder.rollback()


BENCHMARKS: list[Benchmark] = [
    Benchmark(
        "drain-horizon-2",
        "supervise drain, no-op, defaults, a snapshot held in the same database throughout",
        2,
        drain_beside_a_held_snapshot,
        baselines=("drain-2-default",),
    ),
    Benchmark(
        "horizon-report",
        f"supervise drain of {HORIZON_SCALE} x --jobs, a session idle in a transaction meanwhile: p50 = named by "
        "all of gauge, log, dashboard and doctor, p99 = by the first (ms)",
        2,
        horizon_report,
        throughput=False,
    ),
]
