"""What OpenTelemetry tracing (miniqueue.tracing) costs on the hot path: a quick comparison.

Each run enqueues ``--jobs`` no-op jobs one by one (``Client.enqueue``, each its own
transaction: one producer span each when traced), then drains them with an in-process
:class:`~miniqueue.Worker` (defaults: one handler thread, adaptive prefetch; one consumer span
per job when traced), timed from the worker's start until no job is available or running
(polled every 5 ms with two index lookups). Every run is a fresh process and a fresh database,
so each mode gets the global tracer provider it asks for:

- ``absent``: ``opentelemetry`` cannot be imported (as without the ``otel`` extra);
- ``off``: installed, ``MINIQUEUE_TRACING=off``;
- ``no-provider``: installed, no tracer provider set (the default of an application that
  does not use OpenTelemetry);
- ``sdk-dropped``: the SDK's ``TracerProvider`` with no span processor: every span is made
  and recorded, then dropped;
- ``sdk-batch``: the SDK's provider with a ``BatchSpanProcessor`` to an exporter that discards
  what it is given (the export thread's work is in the figure, no network is).

Run ``python -m bench.otel [--database-url URL] [--jobs 5000] [--runs 3]``. It prints the
median of the runs per mode, and the ratio to ``absent``. The end-to-end figures move with
the machine's load (the database round trips dominate an enqueue); ``--micro`` measures only
the tracing code itself, without a database: the microseconds each mode adds to one enqueue
call and to one attempt (the same calls the client and the worker make, with tracer providers
given to :class:`miniqueue.tracing.Tracing`; ``absent`` and ``off`` add a None check, not
measured). A measurement, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MODES = ("absent", "off", "no-provider", "sdk-dropped", "sdk-batch")

_DRAINED = """
SELECT (SELECT id FROM miniqueue_jobs WHERE state = 'available' LIMIT 1) IS NULL
   AND (SELECT id FROM miniqueue_jobs WHERE state = 'running' AND lease_expires_at IS NOT NULL LIMIT 1) IS NULL
"""

_FAILED = """
SELECT count(*) FROM miniqueue_jobs
 WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(errors) e WHERE e->>'error' NOT LIKE 'handed back unstarted%')
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.otel", description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="server to measure on (default: an embedded PostgreSQL)")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, among " + ", ".join(MODES))
    parser.add_argument("--micro", action="store_true", help="time only the tracing code, without a database")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_run(args.child, args.dsn, args.jobs)))
        return 0
    if args.micro:
        return _micro(args.runs)
    return _compare(args.database_url, args.jobs, args.runs, args.modes.split(","))


def _compare(database_url: str | None, jobs: int, runs: int, modes: list[str]) -> int:
    from miniqueue.testing import database as testing_db

    with tempfile.TemporaryDirectory(prefix="miniqueue-bench-otel-") as tmp:
        server = database_url or testing_db.server_dsn(Path(tmp) / "pgdata")
        samples: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
        for run in range(runs):
            for mode in modes:  # interleaved, so that a noisy minute spreads over every mode
                dsn = testing_db.create_database(server, prefix="miniqueue_bench_otel")
                try:
                    done = subprocess.run(
                        [sys.executable, "-m", "bench.otel", "--child", mode, "--dsn", dsn, "--jobs", str(jobs)],
                        capture_output=True,
                        text=True,
                        check=False,
                        env={**os.environ, "PYTHONPATH": os.getcwd()},
                    )
                finally:
                    testing_db.drop_database(server, dsn)
                if done.returncode != 0:
                    raise SystemExit(f"run {run + 1} of {mode} failed:\n{done.stderr}")
                sample = json.loads(done.stdout.strip().splitlines()[-1])
                samples[mode].append(sample)
                print(f"run {run + 1}/{runs} {mode}: {sample}", file=sys.stderr)
    print(f"{jobs} no-op jobs, median of {runs} runs (load average {os.getloadavg()[0]:.1f} at the end)\n")
    print("| mode | enqueue one by one (time vs absent) | per enqueue | drain (time vs absent) | per job drained |")
    print("|---|---|---|---|---|")
    base: dict[str, float] = {}
    for mode in modes:
        enqueue = statistics.median(s["enqueue_seconds"] for s in samples[mode])
        drain = statistics.median(s["drain_seconds"] for s in samples[mode])
        base = base or {"enqueue": enqueue, "drain": drain}
        enqueued = f"{jobs / enqueue:,.0f} jobs/s ({enqueue / base['enqueue']:.2f}x) | {enqueue / jobs * 1e6:.0f} us"
        drained = f"{jobs / drain:,.0f} jobs/s ({drain / base['drain']:.2f}x) | {drain / jobs * 1e6:.1f} us"
        print(f"| {mode} | {enqueued} | {drained} |")
    return 0


def _run(mode: str, dsn: str, jobs: int) -> dict[str, float]:
    """One run in this (fresh) process: set the mode up, enqueue, drain."""
    provider = _set_up(mode)
    from miniqueue import App, Client, Worker, WorkerConfig, tracing
    from miniqueue.core.db import connect

    app = App()
    app.task("noop")(lambda job: None)
    with Client(dsn) as client:
        started = time.perf_counter()
        for n in range(jobs):
            client.enqueue("noop", {"n": n})
        enqueue_seconds = time.perf_counter() - started
    worker = Worker(app, dsn, WorkerConfig(), hooks=tracing.worker_hooks())  # as an in-process worker is traced
    with connect(dsn, purpose="bench-otel") as conn:
        thread = threading.Thread(target=worker.run, daemon=True)
        started = time.perf_counter()
        thread.start()
        while not _fetch(conn, _DRAINED):
            time.sleep(0.005)
        drain_seconds = time.perf_counter() - started
        completed = _fetch(conn, "SELECT count(*) FROM miniqueue_jobs WHERE state = 'completed'")
        # Jobs whose history holds anything but a hand-back of unstarted prefetched jobs (which a
        # loaded machine causes: every handler thread looks stuck past the prefetch budget).
        failed = _fetch(conn, _FAILED)
        handed_back = _fetch(conn, "SELECT count(*) FROM miniqueue_jobs WHERE attempt > 1")
        traced = _fetch(conn, "SELECT count(*) FROM miniqueue_jobs WHERE trace_context IS NOT NULL")
    worker.stop()
    thread.join(30)
    if provider is not None:
        provider.shutdown()
    if completed != jobs or failed:
        raise SystemExit(f"{mode}: {completed} of {jobs} jobs completed, {failed} had a failed attempt")
    if traced != (jobs if mode.startswith("sdk") else 0):
        raise SystemExit(f"{mode}: {traced} of {jobs} jobs stored a trace context")
    return {"enqueue_seconds": enqueue_seconds, "drain_seconds": drain_seconds, "handed_back": handed_back}


def _micro(runs: int, calls: int = 20_000) -> int:
    """Microseconds of tracing code per enqueue call and per attempt, median of ``runs``."""
    import datetime as dt
    import timeit

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from miniqueue.core.records import EnqueueResult, JobSpec, Lease
    from miniqueue.observability.tracing import Tracing
    from miniqueue.tasks.job import Job
    from miniqueue.worker.worker import Outcome, WorkerHooks

    batch = TracerProvider()
    batch.add_span_processor(BatchSpanProcessor(_discard()))
    modes = {"no-provider": Tracing(), "sdk-dropped": Tracing(TracerProvider()), "sdk-batch": Tracing(batch)}
    specs = (JobSpec("noop"),)
    now = dt.datetime.now(dt.timezone.utc)
    print(f"tracing code only, median of {runs} x {calls:,} calls\n")
    print("| mode | per enqueue call | per attempt |")
    print("|---|---|---|")
    for mode, tracing in modes.items():
        with tracing.sending(specs) as send:
            stored = json.loads(send.context) if send.context else None
        lease = Lease(1, "default", "noop", None, 0, 1, 5, now, now, now, stored)
        hooks = tracing.instrument(WorkerHooks()) if tracing.active() else None
        completed = Outcome("completed")

        def enqueue(tracing: Tracing = tracing) -> None:
            with tracing.sending(specs) as send:
                send.sent(EnqueueResult(1))

        def attempt(hooks: WorkerHooks | None = hooks, lease: Lease = lease, completed: Outcome = completed) -> None:
            job = Job(lease, worker_id="bench")
            if hooks is not None:  # no provider: the worker does not instrument its hooks at all
                hooks.on_handler_start(job)
                hooks.on_handler_end(job)
                hooks.on_job_end(job, completed)

        baseline = statistics.median(timeit.repeat(lambda: attempt(None), number=calls, repeat=runs))
        produced = statistics.median(timeit.repeat(enqueue, number=calls, repeat=runs))
        consumed = statistics.median(timeit.repeat(attempt, number=calls, repeat=runs)) - baseline
        print(f"| {mode} | {produced / calls * 1e6:.1f} us | {max(consumed, 0.0) / calls * 1e6:.1f} us |")
    batch.shutdown()
    return 0


def _discard() -> Any:
    """A span exporter that drops what it is given."""
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    return Discard()


def _fetch(conn: Any, query: str) -> Any:
    row = conn.execute(query).fetchone()
    return row[0]


def _set_up(mode: str) -> Any:
    """Make this process's OpenTelemetry what ``mode`` says; return the SDK provider, if any."""
    if mode == "absent":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # an import of it now fails
        return None
    if mode == "off":
        os.environ["MINIQUEUE_TRACING"] = "off"
        return None
    if mode == "no-provider":
        return None
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    if mode == "sdk-batch":
        provider.add_span_processor(BatchSpanProcessor(_discard()))
    trace.set_tracer_provider(provider)
    return provider


if __name__ == "__main__":
    raise SystemExit(main())
