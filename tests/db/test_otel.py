"""OpenTelemetry (miniqueue.tracing) against a real PostgreSQL: the enqueuing span's context is
stored with the job, each attempt runs in a consumer span that is its child and links to it,
with the attempt's outcome; nothing is stored, and no span made, when tracing is off or has
nowhere to go. Spans are collected by the SDK's in-memory exporter, from a tracer provider
given to :func:`miniqueue.tracing.enable` (the global provider can be set once per process:
the automatic, global path runs in a subprocess)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from miniqueue import App, Client, InvalidInput, JobSpec, PermanentError, Snooze
from miniqueue.core.db import Connection
from miniqueue.core.errors import ConfigError
from miniqueue.observability import tracing  # its internals: the fixture below puts them back
from miniqueue.tasks.job import Job
from miniqueue.testing import run_jobs

from ..helpers import row, wait_until
from ..running import StartWorker
from ..supervised import FAST, Supervised


class Spans:
    """The spans a test's tracer provider exported, and its tracer for the test's own spans."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("tests")

    def all(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.all() if span.name == name]

    def one(self, name: str) -> ReadableSpan:
        [span] = self.named(name)
        return span


@pytest.fixture
def tracing_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put miniqueue.tracing's setting back as it was after the test."""
    monkeypatch.setattr(tracing, "_current", tracing._current)
    monkeypatch.setattr(tracing, "_resolved", tracing._resolved)


@pytest.fixture
def spans(tracing_state: None) -> Iterator[Spans]:
    collected = Spans()
    tracing.enable(tracer_provider=collected.provider)
    yield collected
    collected.provider.shutdown()


@pytest.fixture
def traced_client(spans: Spans, dsn: str) -> Iterator[Client]:
    """A client created once tracing is enabled (a client takes the setting when created)."""
    with Client(dsn) as c:
        yield c


def stored_context(conn: Connection, job_id: int) -> dict[str, str] | None:
    value: dict[str, str] | None = row(conn, job_id)["trace_context"]
    return value


def traceparent(span: ReadableSpan) -> str:
    """The W3C traceparent a span's context propagates as."""
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.span_id


def trace_id(span: ReadableSpan) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.trace_id


def linked(span: ReadableSpan) -> list[int]:
    return [link.context.span_id for link in span.links]


def attr(span: ReadableSpan, name: str) -> Any:
    return (span.attributes or {})[name]


def attempts(spans: Spans, task: str) -> list[ReadableSpan]:
    """The consumer spans of ``task``'s attempts, in attempt order."""
    return sorted(spans.named(f"process {task}"), key=lambda span: int(attr(span, "miniqueue.attempt")))


# -- producing ---------------------------------------------------------------------------------


def test_an_enqueue_inside_a_span_stores_its_producer_spans_context(
    spans: Spans, traced_client: Client, conn: Connection
) -> None:
    with spans.tracer.start_as_current_span("POST /orders"):
        job_id = traced_client.enqueue("send_receipt", {"order": 8}, queue="mail").id
    request, send = spans.one("POST /orders"), spans.one("send send_receipt")
    assert send.kind == SpanKind.PRODUCER
    assert parent_id(send) == span_id(request) and trace_id(send) == trace_id(request)
    assert stored_context(conn, job_id) == {"traceparent": traceparent(send)}
    assert dict(send.attributes or {}) == {
        "messaging.system": "miniqueue",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "mail",
        "miniqueue.task": "send_receipt",
        "messaging.message.id": str(job_id),
        "miniqueue.job.id": job_id,
    }
    assert send.status.status_code == StatusCode.UNSET


def test_an_enqueue_outside_any_span_gets_a_root_producer_span(
    spans: Spans, traced_client: Client, conn: Connection
) -> None:
    job_id = traced_client.enqueue("t").id
    send = spans.one("send t")
    assert send.parent is None
    assert stored_context(conn, job_id) == {"traceparent": traceparent(send)}


def test_tracestate_and_baggage_travel_with_the_job(spans: Spans, traced_client: Client, conn: Connection) -> None:
    from opentelemetry import baggage, context
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    remote = SpanContext(
        0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1), trace_state=TraceState([("vendor", "opaque")])
    )
    ctx = baggage.set_baggage("tenant", "acme", trace.set_span_in_context(NonRecordingSpan(remote)))
    token = context.attach(ctx)
    try:
        job_id = traced_client.enqueue("t").id
    finally:
        context.detach(token)
    stored = stored_context(conn, job_id)
    assert stored == {
        "traceparent": traceparent(spans.one("send t")),
        "tracestate": "vendor=opaque",
        "baggage": "tenant=acme",
    }
    seen: list[Any] = []
    app = App()
    app.task("t")(lambda job: seen.append(baggage.get_baggage("tenant")))
    run_jobs(app, traced_client)
    assert seen == ["acme"], "the producer's baggage is in the handler's context"


def test_app_enqueue_and_a_transactional_enqueue_are_traced(
    spans: Spans, traced_client: Client, conn: Connection
) -> None:
    app = App()
    app.task("t", queue="q")(lambda job: None)
    first = app.enqueue(traced_client, "t").id
    with traced_client.connection() as own, own.transaction():
        kept = traced_client.enqueue("t", conn=own).id
    with traced_client.connection() as own, own.transaction():
        dropped = traced_client.enqueue("t", conn=own).id
        raise psycopg.Rollback()  # the block ends rolled back
    sends = spans.named("send t")
    assert len(sends) == 3, "one producer span per enqueue call, committed or not"
    assert stored_context(conn, first) == {"traceparent": traceparent(sends[0])}
    assert stored_context(conn, kept) == {"traceparent": traceparent(sends[1])}
    assert conn.execute("SELECT count(*) FROM miniqueue_jobs WHERE id = %s", [dropped]).fetchone() == (0,)


@pytest.mark.parametrize("size", [3, 600], ids=["statement", "copy"])
def test_a_batch_gets_one_producer_span_whose_context_every_job_stores(
    spans: Spans, traced_client: Client, conn: Connection, size: int
) -> None:
    assert (size >= traced_client.store.copy_threshold) == (size == 600)
    with spans.tracer.start_as_current_span("import"):
        results = traced_client.enqueue_many([JobSpec("row", {"n": n}, queue="imports") for n in range(size)])
    send = spans.one("send row")
    assert parent_id(send) == span_id(spans.one("import"))
    assert send.attributes is not None and send.attributes["messaging.batch.message_count"] == size
    assert send.attributes["messaging.destination.name"] == "imports"
    contexts = conn.execute("SELECT DISTINCT trace_context FROM miniqueue_jobs").fetchall()
    assert contexts == [({"traceparent": traceparent(send)},)]
    assert len(results) == size


def test_a_chain_and_a_group_are_traced_as_an_enqueue_is(spans: Spans, traced_client: Client, conn: Connection) -> None:
    with spans.tracer.start_as_current_span("request"):
        chained = traced_client.chain([JobSpec("fetch", queue="etl"), JobSpec("load", queue="etl")])
    chain = spans.one("send")
    assert parent_id(chain) == span_id(spans.one("request"))
    assert chain.attributes is not None and chain.attributes["messaging.batch.message_count"] == 2
    stored = "SELECT DISTINCT trace_context FROM miniqueue_jobs WHERE id = ANY(%s)"
    assert conn.execute(stored, [[r.id for r in chained]]).fetchall() == [({"traceparent": traceparent(chain)},)]
    spans.exporter.clear()
    grouped = traced_client.group(
        [JobSpec("part", {"n": n}, queue="etl") for n in range(3)], then=JobSpec("sum", queue="etl")
    )
    group = spans.one("send")
    assert group.attributes is not None and group.attributes["messaging.batch.message_count"] == 4
    ids = [r.id for r in grouped.members] + [grouped.on_success.id if grouped.on_success else 0]
    assert conn.execute(stored, [ids]).fetchall() == [({"traceparent": traceparent(group)},)]


def test_a_mixed_batch_names_no_task_or_queue(spans: Spans, traced_client: Client) -> None:
    traced_client.enqueue_many([JobSpec("a", queue="x"), JobSpec("b", queue="y")])
    send = spans.one("send")
    assert send.attributes is not None
    assert "miniqueue.task" not in send.attributes and "messaging.destination.name" not in send.attributes


def test_a_failed_enqueue_ends_its_span_in_error(spans: Spans, traced_client: Client) -> None:
    traced_client.enqueue("t", idempotency_key="k")
    duplicate = traced_client.enqueue("t", idempotency_key="k")
    assert duplicate.duplicate
    first, second = spans.named("send t")
    assert first.attributes is not None and "miniqueue.duplicate" not in first.attributes
    assert second.attributes is not None and second.attributes["miniqueue.duplicate"] is True
    assert second.attributes["miniqueue.job.id"] == duplicate.id
    with pytest.raises(InvalidInput):
        traced_client.enqueue_many([JobSpec("t"), JobSpec("t", payload=float("nan"))])
    failed = spans.named("send t")[2]
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.attributes is not None and failed.attributes["error.type"] == "miniqueue.InvalidInput"
    assert [event.name for event in failed.events] == ["exception"]


# -- consuming ---------------------------------------------------------------------------------


def test_an_attempt_runs_in_a_consumer_span_child_of_and_linked_to_the_producer(
    spans: Spans, traced_client: Client, conn: Connection
) -> None:
    app = App()
    seen: list[Any] = []

    @app.task("greet", queue="mail")
    def greet(job: Job) -> None:
        seen.append((job.trace_context, trace.get_current_span().get_span_context().span_id))
        with spans.tracer.start_as_current_span("render"):
            pass

    with spans.tracer.start_as_current_span("POST /signup"):
        job_id = app.enqueue(traced_client, "greet", {"name": "ada"}).id
    result = run_jobs(app, traced_client)
    assert [run.outcome for run in result.runs] == ["completed"]
    send, process, render = spans.one("send greet"), spans.one("process greet"), spans.one("render")
    assert process.kind == SpanKind.CONSUMER
    assert parent_id(process) == span_id(send) and trace_id(process) == trace_id(spans.one("POST /signup"))
    assert linked(process) == [span_id(send)]
    assert parent_id(render) == span_id(process), "the handler's own spans nest under its attempt's"
    assert seen == [({"traceparent": traceparent(send)}, span_id(process))]
    attributes = dict(process.attributes or {})
    assert str(attributes.pop("messaging.client.id")).startswith("miniqueue-testing:"), "the worker id"
    assert attributes == {
        "messaging.system": "miniqueue",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "mail",
        "messaging.message.id": str(job_id),
        "miniqueue.job.id": job_id,
        "miniqueue.task": "greet",
        "miniqueue.attempt": 1,
        "miniqueue.max_attempts": 5,
        "miniqueue.run": 1,
        "miniqueue.outcome": "completed",
    }
    assert process.status.status_code == StatusCode.UNSET
    assert process.start_time is not None and process.end_time is not None
    assert process.start_time <= process.end_time


def test_a_failed_attempt_then_its_retry_give_two_consumer_spans(
    spans: Spans, traced_client: Client, conn: Connection
) -> None:
    app = App()

    @app.task("flaky")
    def flaky(job: Job) -> None:
        if job.run == 1:
            raise ValueError("the API said 503")

    job_id = traced_client.enqueue("flaky").id
    run_jobs(app, traced_client)
    send = spans.one("send flaky")
    first, second = attempts(spans, "flaky")
    assert [parent_id(first), parent_id(second)] == [span_id(send), span_id(send)]
    assert linked(first) == linked(second) == [span_id(send)]
    assert first.attributes is not None and second.attributes is not None
    assert (first.attributes["miniqueue.attempt"], first.attributes["miniqueue.outcome"]) == (1, "retried")
    assert first.attributes["miniqueue.delay"] == 0.0  # run_jobs retries at once
    assert first.attributes["error.type"] == "ValueError"
    assert first.status.status_code == StatusCode.ERROR and first.status.description == "ValueError: the API said 503"
    [event] = first.events
    assert event.name == "exception" and event.attributes is not None
    assert event.attributes["exception.type"] == "ValueError"
    assert "the API said 503" in str(event.attributes["exception.stacktrace"])
    assert (second.attributes["miniqueue.attempt"], second.attributes["miniqueue.outcome"]) == (2, "completed")
    assert second.status.status_code == StatusCode.UNSET and "error.type" not in second.attributes
    assert row(conn, job_id)["state"] == "completed"


def test_failed_dead_and_snoozed_outcomes(spans: Spans, traced_client: Client) -> None:
    app = App()

    @app.task("refuse")
    def refuse(job: Job) -> None:
        raise PermanentError("no such account")

    @app.task("doomed", max_attempts=2)
    def doomed(job: Job) -> None:
        raise KeyError(job.run)

    @app.task("later")
    def later(job: Job) -> None:
        raise Snooze(60)

    for task in ("refuse", "doomed", "later"):
        traced_client.enqueue(task, max_attempts=app.tasks[task].max_attempts)
    run_jobs(app, traced_client, retries="immediate")
    [refused] = attempts(spans, "refuse")
    assert refused.attributes is not None and refused.attributes["miniqueue.outcome"] == "failed"
    assert refused.attributes["error.type"] == "miniqueue.PermanentError"
    assert refused.status.status_code == StatusCode.ERROR
    assert [attr(s, "miniqueue.outcome") for s in attempts(spans, "doomed")] == ["retried", "dead"]
    assert all(s.status.status_code == StatusCode.ERROR for s in attempts(spans, "doomed"))
    [snoozed] = attempts(spans, "later")
    assert snoozed.attributes is not None and snoozed.attributes["miniqueue.outcome"] == "snoozed"
    assert snoozed.attributes["miniqueue.delay"] == 60.0
    assert snoozed.status.status_code == StatusCode.UNSET and not snoozed.events


def test_an_async_handlers_attempts_run_in_consumer_spans(spans: Spans, traced_client: Client) -> None:
    app = App()
    seen: list[int] = []

    @app.task("fetch")
    async def fetch(job: Job) -> None:
        with spans.tracer.start_as_current_span("GET upstream"):
            await asyncio.sleep(0.01)
        seen.append(trace.get_current_span().get_span_context().span_id)
        if job.run == 1:
            raise ConnectionError("reset by peer")

    with spans.tracer.start_as_current_span("request"):
        traced_client.enqueue("fetch")
    run_jobs(app, traced_client)
    send = spans.one("send fetch")
    first, second = attempts(spans, "fetch")
    assert seen == [span_id(first), span_id(second)], "current in the handler's task"
    assert [parent_id(first), parent_id(second)] == [span_id(send), span_id(send)]
    assert linked(first) == [span_id(send)]
    assert first.attributes is not None and first.attributes["miniqueue.outcome"] == "retried"
    assert first.attributes["error.type"] == "ConnectionError"
    assert second.attributes is not None and second.attributes["miniqueue.outcome"] == "completed"
    upstream = sorted(spans.named("GET upstream"), key=lambda span: span.start_time or 0)
    assert [parent_id(span) for span in upstream] == [span_id(first), span_id(second)]


def test_concurrent_async_attempts_keep_their_own_spans(spans: Spans, traced_client: Client) -> None:
    app = App()
    seen: dict[int, int] = {}

    @app.task("wait")
    async def wait(job: Job) -> None:
        await asyncio.sleep(0.05)  # all of them in flight at once
        seen[job.id] = trace.get_current_span().get_span_context().span_id

    ids = [r.id for r in traced_client.enqueue_many([JobSpec("wait") for _ in range(10)])]
    run_jobs(app, traced_client, concurrency=10)
    by_job = {attr(span, "miniqueue.job.id"): span_id(span) for span in attempts(spans, "wait")}
    assert seen == by_job and sorted(by_job) == ids


def test_a_job_enqueued_untraced_gets_a_root_consumer_span(spans: Spans, dsn: str, conn: Connection) -> None:
    tracing.disable()
    with Client(dsn) as untraced:
        job_id = untraced.enqueue("t").id
    assert stored_context(conn, job_id) is None
    tracing.enable(tracer_provider=spans.provider)
    app = App()
    app.task("t")(lambda job: None)
    run_jobs(app, dsn)
    [process] = attempts(spans, "t")
    assert process.parent is None and process.links == ()
    assert spans.named("send t") == []


def test_a_task_the_worker_does_not_know_is_never_claimed_so_has_no_span(spans: Spans, traced_client: Client) -> None:
    app = App()
    app.task("known")(lambda job: None)
    unknown = traced_client.enqueue("unknown", queue="default", max_attempts=1).id
    result = run_jobs(app, traced_client, queues=["default"])
    assert result.stopped_by == "idle" and attempts(spans, "unknown") == []
    assert traced_client.get(unknown).attempt == 0, "another app's job: never claimed"


def test_as_child_false_starts_a_trace_per_attempt_linked_to_the_producer(
    spans: Spans, tracing_state: None, dsn: str
) -> None:
    tracing.enable(tracer_provider=spans.provider, as_child=False)
    with Client(dsn) as client:
        client.enqueue("t")
        app = App()
        app.task("t")(lambda job: None)
        run_jobs(app, client)
    send, [process] = spans.one("send t"), attempts(spans, "t")
    assert process.parent is None and trace_id(process) != trace_id(send)
    assert linked(process) == [span_id(send)]


def test_a_cancelled_job_is_not_an_error(
    spans: Spans, traced_client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()
    running = threading.Event()

    @app.task("long")
    def long(job: Job) -> None:
        running.set()
        job.wait(30)

    job_id = traced_client.enqueue("long").id
    worker = start_worker(app, heartbeat_seconds=0.2)
    assert running.wait(10)
    traced_client.cancel([job_id])
    wait_until(lambda: spans.named("process long"), what="the attempt's span ended")
    worker.stop()
    [process] = spans.named("process long")
    assert process.attributes is not None and process.attributes["miniqueue.outcome"] == "cancelled"
    assert process.attributes["miniqueue.stop_reason"] == "cancelled"
    assert process.status.status_code == StatusCode.UNSET


# -- off, and nowhere to go --------------------------------------------------------------------


def test_nothing_is_stored_and_no_span_made_when_tracing_is_disabled(spans: Spans, dsn: str, conn: Connection) -> None:
    tracing.disable()
    assert tracing.current() is None and tracing.for_worker() is None
    with Client(dsn) as client:
        with spans.tracer.start_as_current_span("request"):
            one = client.enqueue("t").id
            many = [r.id for r in client.enqueue_many([JobSpec("t") for _ in range(600)])]
        app = App()
        app.task("t")(lambda job: None)
        assert len(run_jobs(app, client, timeout=60).runs) == 601  # a deadline, on a loaded machine too
    assert conn.execute("SELECT count(*) FROM miniqueue_jobs WHERE trace_context IS NOT NULL").fetchone() == (0,)
    assert [span.name for span in spans.all()] == ["request"]
    assert {one, *many} == {r[0] for r in conn.execute("SELECT id FROM miniqueue_jobs")}


def test_nothing_is_stored_without_a_tracer_provider(tracing_state: None, dsn: str, conn: Connection) -> None:
    tracing.enable()  # the global provider, which this process never sets
    active = tracing.current()
    assert active is not None and not active.active()
    assert tracing.for_worker() is None, "a worker starting without a provider does not trace"
    seen: list[Any] = []
    with Client(dsn) as client:
        job_id = client.enqueue("t").id
        client.enqueue_many([JobSpec("t"), JobSpec("t")])
        app = App()
        app.task("t")(lambda job: seen.append((job.trace_context, trace.get_current_span().is_recording())))
        run_jobs(app, client)
    assert stored_context(conn, job_id) is None
    assert conn.execute("SELECT count(*) FROM miniqueue_jobs WHERE trace_context IS NOT NULL").fetchone() == (0,)
    assert seen == [(None, False)] * 3


@pytest.mark.parametrize("value", ["off", "0", "FALSE", "no"])
def test_the_environment_turns_tracing_off(tracing_state: None, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(tracing.ENV, value)
    monkeypatch.setattr(tracing, "_resolved", False)
    assert tracing.current() is None


def test_a_bad_environment_value_is_a_config_error(tracing_state: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tracing.ENV, "of")
    monkeypatch.setattr(tracing, "_resolved", False)
    with pytest.raises(ConfigError, match="MINIQUEUE_TRACING='of' is invalid"):
        tracing.current()
    monkeypatch.setenv(tracing.ENV, "on")
    assert tracing.current() is not None


# -- in a process of its own: the global provider, and no opentelemetry at all ---------------------


def run_script(script: str, dsn: str, repo_root: Path) -> Any:
    env = {**os.environ, "DSN": dsn, "PYTHONPATH": str(repo_root)}
    env.pop(tracing.ENV, None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_tracing_is_automatic_with_a_global_tracer_provider(dsn: str, repo_root: Path) -> None:
    """What docs/guides/opentelemetry.md shows: set the SDK's provider, enqueue under a span, run the job."""
    got = run_script(
        """
        import json, os
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)

        import miniqueue
        from miniqueue.testing import run_jobs

        app = miniqueue.App()
        app.task("greet")(lambda job: None)
        with miniqueue.Client(os.environ["DSN"]) as client:
            with trace.get_tracer("app").start_as_current_span("request"):
                app.enqueue(client, "greet")
            run_jobs(app, client)
        spans = {s.name: s for s in exporter.get_finished_spans()}
        ids = {name: s.context.span_id for name, s in spans.items()}
        print(json.dumps({
            "names": sorted(spans),
            "send_parent": spans["send greet"].parent.span_id == ids["request"],
            "process_parent": spans["process greet"].parent.span_id == ids["send greet"],
            "outcome": spans["process greet"].attributes["miniqueue.outcome"],
        }))
        """,
        dsn,
        repo_root,
    )
    assert got == {
        "names": ["process greet", "request", "send greet"],
        "send_parent": True,
        "process_parent": True,
        "outcome": "completed",
    }


def test_without_opentelemetry_installed_nothing_is_traced(dsn: str, repo_root: Path) -> None:
    got = run_script(
        """
        import json, os, sys
        sys.modules["opentelemetry"] = None  # as if the package were not installed

        import miniqueue
        from miniqueue import tracing
        from miniqueue.core.errors import ConfigError
        from miniqueue.testing import run_jobs

        app = miniqueue.App()
        app.task("greet")(lambda job: None)
        with miniqueue.Client(os.environ["DSN"]) as client:
            job_id = client.enqueue("greet").id
            client.enqueue_many([miniqueue.JobSpec("greet")] * 3)
            runs = run_jobs(app, client).runs
            with client.connection() as conn:
                stored = conn.execute("SELECT count(*) FROM miniqueue_jobs WHERE trace_context IS NOT NULL")
                traced = stored.fetchone()[0]
        try:
            tracing.enable()
            refused = None
        except ConfigError as exc:
            refused = str(exc)
        print(json.dumps({"api": tracing.HAVE_API, "current": tracing.current() is None, "runs": len(runs),
                          "traced": traced, "refused": refused,
                          "otel_loaded": any(m.startswith("opentelemetry.") for m in sys.modules)}))
        """,
        dsn,
        repo_root,
    )
    assert got == {
        "api": False,
        "current": True,
        "runs": 4,
        "traced": 0,
        "otel_loaded": False,
        "refused": "tracing needs opentelemetry-api: pip install 'miniqueue[otel]'",
    }


def test_supervised_workers_export_their_spans_when_they_stop(
    spans: Spans, traced_client: Client, conn: Connection, dsn: str, tmp_path: Path, repo_root: Path
) -> None:
    """Under a real miniqueue-supervise, with the provider set up in the app's module: each
    attempt's span is the child of its enqueue's, and reaches the exporter at a graceful stop."""
    out = tmp_path / "spans.jsonl"
    with spans.tracer.start_as_current_span("request"):
        ids = [traced_client.enqueue("greet", {"n": n}).id for n in range(4)]
    env = {**os.environ, "MINIQUEUE_TEST_SPANS": str(out)}
    env.pop(tracing.ENV, None)
    supervisor = Supervised(dsn, ["--app", "tests.apps.traced:app", "--workers", "2", *FAST], tmp_path, repo_root, env)
    try:
        supervisor.wait_ready(2)
        wait_until(lambda: all(row(conn, job_id)["state"] == "completed" for job_id in ids), what="jobs completed")
    finally:
        supervisor.harness.stop(grace=20)  # SIGTERM: the workers drain and stop
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    sends = {attr(span, "miniqueue.job.id"): span_id(span) for span in spans.named("send greet")}
    processes = [span for span in exported if span["name"] == "process greet"]
    assert {span["attributes"]["miniqueue.job.id"]: span["parent_id"] for span in processes} == sends
    assert {span["attributes"]["miniqueue.outcome"] for span in processes} == {"completed"}
    renders = [span["parent_id"] for span in exported if span["name"] == "render"]
    assert sorted(renders) == sorted(span["span_id"] for span in processes)
