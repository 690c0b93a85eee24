"""Several databases (docs/guides/shards.md).

Each row runs on the run's database and a second scratch database of the same server, both
joined to one map (``migrate_shards``): the two share the server's cores, so spreading a queue
over them shows what the spreading costs, never what a second server would gain.

- ``enqueue-many-routed``: the cost of routing alone. ``ShardedClient.enqueue_many`` of --jobs
  jobs (10,000 by default) of a queue the map keeps on ONE database, against
  ``Client.enqueue_many`` of the same jobs into that database, alternately (plain first in one
  pair, routed first in the next, so that the table's growth weighs on both alike), four times
  each in one run. Target: the routed call keeps at least 0.95 x the plain call's jobs/s.
- ``enqueue-many-spread``: the same with the queue spread over the two databases (round-robin:
  no key), so the routed call stores half the jobs in each, one transaction per database on a
  thread of its own. Target: at least 0.85 x the plain call's jobs/s (it does the routed row's
  work plus a thread per database; on one server's cores the two COPYs do not add up).
- ``drain-2-spread``: ``drain-2-default``'s drain (5 x --jobs no-op jobs, the no-op app,
  ``miniqueue-supervise --workers 2`` with its defaults) with the queue spread over the two
  databases: ``miniqueue-supervise --shards <map> --workers 2``, so one worker per database (by
  weight), each claiming from its own database only. The jobs go in by one
  ``ShardedClient.enqueue_many`` (round-robin: one transaction per database, both on threads of
  the call), and the time runs from its return, when both have committed, to the last completion
  on either database, on the server's clock (the worker whose database committed first may
  start a moment before: the call's two commits are the only instants not on one clock).
  Target: at least 0.8 x ``drain-2-default``'s jobs/s in the same run (its baseline): each
  database's claims and completions are as cheap as on one, but both servers' worth of work
  lands on one server's CPU, so no speed-up is expected; the figure says what the spread costs.

In the enqueue rows jobs/s is the routed call's; p50 is the plain call and p99 the routed one
(ms, medians of the run's calls): the share their targets read is p50 / p99, run by run.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from psycopg.conninfo import make_conninfo

from miniqueue import Client, JobSpec
from miniqueue.client.sharded import ShardedClient, migrate_shards
from miniqueue.core.db import Connection
from miniqueue.core.shard_map import ShardMap

from .database import QUEUE, TASK, payload, scratch_database
from .drain import DRAIN_SCALE, NOOP_APP, database_clock, drain_databases
from .measure import Sample
from .registry import Benchmark, Context
from .report import RowResult
from .supervised import SuperviseOptions

DRAIN_BASELINE = "drain-2-default"
#: Rows set against a baseline row of the same run, as ``bench.durable.TARGETS``: the least
#: share of the baseline's jobs/s.
TARGETS: dict[str, tuple[str, float]] = {"drain-2-spread": (DRAIN_BASELINE, 0.8)}
#: Rows that time the routed call against the plain one in the same run: the least share of the
#: plain call's jobs/s the routed call keeps (see :func:`routed_share`).
ROUTING_TARGETS: dict[str, float] = {"enqueue-many-routed": 0.95, "enqueue-many-spread": 0.85}
REPEATS = 4
WARM_JOBS = 100
# The map's two databases: "a" is the run's own (the one the plain client writes to).
ONE_DATABASE = ("a",)
SPREAD = ("a", "b")


@contextlib.contextmanager
def two_databases(ctx: Context, queue_on: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    """A map (its JSON form) of the run's database ("a") and a second scratch database of the
    same server ("b"), with the queue on ``queue_on``; both migrated and joined to the map. The
    second is dropped on exit."""
    with scratch_database(make_conninfo(ctx.dsn, dbname="postgres"), "shard-b") as second:
        data: dict[str, Any] = {
            "databases": {"a": {"url": ctx.dsn, "index": 0}, "b": {"url": second, "index": 1}},
            "queues": {QUEUE: list(queue_on)},
        }
        migrate_shards(ShardMap.parse(data))
        yield data


def routed_share(row: RowResult) -> float | None:
    """An enqueue row's routed jobs/s as a share of the plain call's: p50 / p99 of each run
    (both timed in that run), the median over the runs."""
    shares = [s.p50_ms / s.p99_ms for s in row.samples if s.p50_ms and s.p99_ms]
    return statistics.median(shares) if shares else None


def routed_enqueue(ctx: Context) -> Sample:
    """The routed enqueue_many of a queue on one database against the plain one, in one run."""
    return _against_plain(ctx, ONE_DATABASE)


def spread_enqueue(ctx: Context) -> Sample:
    """The routed enqueue_many of a queue on two databases against the plain one, in one run."""
    return _against_plain(ctx, SPREAD)


def _against_plain(ctx: Context, queue_on: tuple[str, ...]) -> Sample:
    specs = [JobSpec(TASK, payload(n), queue=QUEUE) for n in range(ctx.jobs)]
    with (
        two_databases(ctx, queue_on) as data,
        Client(ctx.dsn) as client,
        ShardedClient(ShardMap.parse(data)) as sharded,
    ):
        calls: dict[str, Callable[[list[JobSpec]], object]] = {
            "plain": client.enqueue_many,
            "routed": sharded.enqueue_many,
        }
        for call in calls.values():  # warm: connections open, declarations read
            call(specs[:WARM_JOBS])
        timings: dict[str, list[float]] = {name: [] for name in calls}
        for repeat in range(ctx.sized(REPEATS, 2)):
            # Every call meets a larger table than the one before: alternating which goes first
            # spreads that growth evenly over the two.
            for name in ("plain", "routed") if repeat % 2 == 0 else ("routed", "plain"):
                began = time.perf_counter()
                calls[name](specs)
                timings[name].append(time.perf_counter() - began)
    plain, routed = statistics.median(timings["plain"]), statistics.median(timings["routed"])
    return Sample(jobs=len(specs), seconds=routed, p50_ms=plain * 1000, p99_ms=routed * 1000, rss_mb=None)


def spread_drain(ctx: Context) -> Sample:
    """``drain-2-default``'s drain with its queue spread over two databases, one supervisor each."""
    jobs = [JobSpec(TASK, payload(n), queue=QUEUE) for n in range(ctx.jobs * DRAIN_SCALE)]
    with two_databases(ctx, SPREAD) as data, tempfile.TemporaryDirectory(prefix="miniqueue-bench-") as folder:
        # A file, as an operator passes it: the databases' URLs stay off the command line.
        path = Path(folder) / "shards.json"
        path.write_text(json.dumps(data))
        options = SuperviseOptions(NOOP_APP, ctx.workers, shards=str(path))
        dsns = [database["url"] for database in data["databases"].values()]
        with ShardedClient(str(path)) as sharded:

            def enqueue(conn: Connection) -> dt.datetime:
                sharded.enqueue_many(jobs)  # returns once every database's transaction committed
                return database_clock(conn)

            return drain_databases(dsns, options, len(jobs), enqueue)


BENCHMARKS: list[Benchmark] = [
    Benchmark(
        "enqueue-many-routed",
        "ShardedClient.enqueue_many, queue on 1 of 2 databases: p50 = Client's, p99 = routed (ms)",
        1,
        routed_enqueue,
    ),
    Benchmark(
        "enqueue-many-spread",
        "ShardedClient.enqueue_many, queue spread on 2 databases: p50 = Client's, p99 = routed (ms)",
        1,
        spread_enqueue,
    ),
    Benchmark(
        "drain-2-spread",
        "supervise --shards drain, no-op, defaults, queue spread on 2 databases (1 worker each)",
        2,
        spread_drain,
        baselines=(DRAIN_BASELINE,),
    ),
]
