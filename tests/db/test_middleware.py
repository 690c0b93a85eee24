"""Middleware (miniqueue.tasks.middleware) against a real PostgreSQL: the enqueue hooks on every
path through the app, in the caller's transaction; the run hooks around ``def`` and ``async def``
handlers in in-process workers, the testing kit and a real ``miniqueue-supervise``; their order,
errors and swallowed exceptions as the job's row records them; the attempt's span around them;
and the encrypted payloads example, whose stored payload is not plaintext."""

from __future__ import annotations

import asyncio
import datetime as dt
import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
import pytest
from opentelemetry import trace

from miniqueue import (
    App,
    AsyncClient,
    Batch,
    Client,
    ConfigError,
    EnqueueHook,
    InvalidInput,
    Job,
    JobSpec,
    Middleware,
    RunHook,
    Snooze,
)
from miniqueue.core.db import Connection
from miniqueue.testing import run_jobs

from ..helpers import count, row, wait_until
from ..running import StartWorker
from ..supervised import Fleet, StartSupervisor
from .test_otel import Spans, span_id, spans, traced_client, tracing_state
from .test_periodic import hourly_due, recorded, report_app, scheduler, set_last_slot

__all__ = ["spans", "traced_client", "tracing_state"]  # the tracing fixtures, used by name


class Stamp(Middleware):
    """Appends its name to the payload's ``seen`` list on enqueue, and records each step in ``events``."""

    def __init__(self, name: str, events: list[str]) -> None:
        self.name, self.events = name, events

    def enqueue(self, spec: JobSpec) -> EnqueueHook:
        self.events.append(f"{self.name} enqueues")
        try:
            result = yield spec._replace(payload={**spec.payload, "seen": [*spec.payload["seen"], self.name]})
        except Exception as exc:
            self.events.append(f"{self.name} saw {exc}")
            raise
        self.events.append(f"{self.name} saw job {result.id}")

    def run(self, job: Job) -> RunHook:
        self.events.append(f"{self.name} before")
        try:
            result = yield
        except Exception as exc:
            self.events.append(f"{self.name} saw {exc}")
            raise
        self.events.append(f"{self.name} after {result}")
        return result


def stamped_app(events: list[str], *names: str) -> App:
    app = App()
    for name in names:
        app.middleware(Stamp(name, events))
    return app


def payload(conn: Connection, job_id: int) -> Any:
    return row(conn, job_id)["payload"]


def finished(conn: Connection, job_id: int) -> dict[str, Any]:
    """The job's row once it ended completed, dead or failed."""
    return wait_until(lambda: _ended(row(conn, job_id)), what=f"job {job_id} finished")


def _ended(found: dict[str, Any]) -> dict[str, Any] | None:
    return found if found["state"] in ("completed", "dead", "failed") else None


# -- around an enqueue ---------------------------------------------------------------------------


def test_enqueue_hooks_run_from_the_last_registered_to_the_first_then_see_the_result(
    client: Client, conn: Connection
) -> None:
    events: list[str] = []
    app = stamped_app(events, "m1", "m2")
    app.task("t")(lambda job: None)
    job_id = app.enqueue(client, "t", {"seen": []}).id
    assert payload(conn, job_id) == {"seen": ["m2", "m1"]}  # the first registered is nearest the database
    assert events == ["m2 enqueues", "m1 enqueues", f"m1 saw job {job_id}", f"m2 saw job {job_id}"]


def test_an_enqueue_hook_that_raises_stores_nothing_and_the_outer_hooks_see_its_error(
    client: Client, conn: Connection
) -> None:
    events: list[str] = []

    class Refuse(Middleware):
        def enqueue(self, spec: JobSpec) -> EnqueueHook:
            raise PermissionError("tenant acme may not enqueue")
            yield spec  # a generator: the hook raises when it is entered

    app = App()
    app.middleware(Refuse())
    app.middleware(Stamp("outer", events))
    app.task("t")(lambda job: None)
    with pytest.raises(PermissionError, match="tenant acme may not enqueue"):
        app.enqueue(client, "t", {"seen": []})
    assert count(conn) == 0
    assert events == ["outer enqueues", "outer saw tenant acme may not enqueue"]


def test_an_error_storing_the_job_reaches_the_hooks_and_the_caller(client: Client, conn: Connection) -> None:
    events: list[str] = []
    app = stamped_app(events, "m1")
    app.task("t")(lambda job: None)
    with pytest.raises(InvalidInput, match="max_attempts"):
        app.enqueue(client, "t", {"seen": []}, max_attempts=0)
    assert count(conn) == 0
    assert events[0] == "m1 enqueues" and events[1].startswith("m1 saw max_attempts")


def test_enqueue_hooks_run_inside_the_callers_transaction(client: Client, conn: Connection, dsn: str) -> None:
    events: list[str] = []
    app = stamped_app(events, "m1")
    app.task("t")(lambda job: None)
    with conn.transaction():
        job_id = app.enqueue(client, "t", {"seen": []}, conn=conn).id
        assert payload(conn, job_id) == {"seen": ["m1"]}
        assert events == ["m1 enqueues", f"m1 saw job {job_id}"]
        with psycopg.connect(dsn) as other:  # nothing is committed before the caller commits
            assert other.execute("SELECT count(*) FROM miniqueue_jobs").fetchone() == (0,)
        raise psycopg.Rollback()
    assert count(conn) == 0


def test_a_hook_that_raises_in_the_callers_transaction_leaves_it_usable(client: Client, conn: Connection) -> None:
    class Refuse(Middleware):
        def enqueue(self, spec: JobSpec) -> EnqueueHook:
            if spec.payload.get("refuse"):
                raise PermissionError("refused")
            yield spec

    app = App()
    app.middleware(Refuse())
    app.task("t")(lambda job: None)
    with conn.transaction():
        kept = app.enqueue(client, "t", {}, conn=conn).id
        with pytest.raises(PermissionError):
            app.enqueue(client, "t", {"refuse": True}, conn=conn)
    assert [i for (i,) in conn.execute("SELECT id FROM miniqueue_jobs").fetchall()] == [kept]


def test_chains_and_groups_through_the_app_pass_each_job(client: Client, conn: Connection) -> None:
    events: list[str] = []
    app = stamped_app(events, "m1")
    app.task("t")(lambda job: None)
    steps = app.chain(client, [JobSpec("t", {"seen": [], "step": i}) for i in range(2)])
    group = app.group(client, [JobSpec("t", {"seen": []})], then=JobSpec("t", {"seen": [], "then": True}))
    assert group.on_success is not None
    ids = [*(r.id for r in steps), *(r.id for r in group.members), group.on_success.id]
    assert all(payload(conn, i)["seen"] == ["m1"] for i in ids)
    assert [e for e in events if "saw" in e] == [f"m1 saw job {i}" for i in ids]
    assert row(conn, steps[1].id)["parents"] == [steps[0].id]  # still a chain


def test_aenqueue_achain_and_agroup_pass_the_same_hooks(dsn: str, conn: Connection) -> None:
    events: list[str] = []
    app = stamped_app(events, "m1", "m2")
    app.task("t")(lambda job: None)

    async def main() -> list[int]:
        async with AsyncClient(dsn) as aclient:
            one = await app.aenqueue(aclient, "t", {"seen": []})
            chained = await app.achain(aclient, [JobSpec("t", {"seen": []})])
            grouped = await app.agroup(aclient, [JobSpec("t", {"seen": []})], on_complete=JobSpec("t", {"seen": []}))
            assert grouped.on_complete is not None
            return [one.id, chained[0].id, grouped.members[0].id, grouped.on_complete.id]

    ids = asyncio.run(main())
    assert all(payload(conn, i)["seen"] == ["m2", "m1"] for i in ids)
    assert len(events) == 4 * len(ids)


@pytest.mark.parametrize("kind", ["def", "async def"])
def test_a_job_added_to_its_group_by_a_handler_passes_the_enqueue_hooks(
    kind: str, client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    events: list[str] = []
    app = stamped_app(events, "m1", "m2")
    added: list[int] = []

    if kind == "def":

        @app.task("member")
        def member(job: Job) -> None:
            if job.payload.get("add"):
                with job.transaction():
                    added.append(job.add_to_group(JobSpec("member", {"seen": []})).id)

    else:

        @app.task("member")
        async def amember(job: Job) -> None:
            if job.payload.get("add"):
                async with job.atransaction():
                    added.append((await job.aadd_to_group(JobSpec("member", {"seen": []}))).id)

    app.task("done")(lambda job: None)
    group = app.group(client, [JobSpec("member", {"seen": [], "add": True})], then=JobSpec("done", {"seen": []}))
    assert group.on_success is not None
    start_worker(app)
    assert finished(conn, group.on_success.id)["state"] == "completed"
    assert len(added) == 1
    assert payload(conn, added[0])["seen"] == ["m2", "m1"]
    assert [e for e in events if "enqueues" in e or "saw job" in e][-4:] == [
        *["m2 enqueues", "m1 enqueues"],
        *[f"m1 saw job {added[0]}", f"m2 saw job {added[0]}"],
    ]


def test_a_periodic_slot_passes_the_enqueue_hooks_in_the_reaper_and_a_refusal_leaves_it_to_the_next_pass(
    dsn: str, conn: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    class Tag(Middleware):
        refuse = True

        def enqueue(self, spec: JobSpec) -> EnqueueHook:
            if self.refuse:
                raise ValueError("tenant unknown")
            yield spec._replace(payload={**spec.payload, "tenant": "acme"})

    app = report_app(hourly_due(conn, 1))
    tag = app.middleware(Tag())
    reaper = scheduler(dsn, app)
    try:
        assert reaper.schedule_periodic() == []  # the schedule's first sighting
        slot = recorded(conn)
        set_last_slot(conn, slot - dt.timedelta(hours=1))
        assert reaper.schedule_periodic() == []
        assert "periodic report: cannot enqueue its slot: tenant unknown" in caplog.text
        assert count(conn) == 0 and recorded(conn) == slot - dt.timedelta(hours=1)  # the slot is still due
        tag.refuse = False
        (job_id,) = reaper.schedule_periodic()
    finally:
        reaper.close()
    assert payload(conn, job_id) == {"kind": "daily", "tenant": "acme"}
    assert recorded(conn) == slot


def test_a_hook_that_yields_no_spec_is_a_config_error(client: Client, conn: Connection) -> None:
    class Broken(Middleware):
        def enqueue(self, spec: JobSpec) -> EnqueueHook:
            yield spec.payload  # the mistake under test: the payload, not the spec

    app = App()
    app.middleware(Broken())
    app.task("t")(lambda job: None)
    with pytest.raises(ConfigError, match=r"middleware .*Broken: its enqueue hook yielded dict, not a JobSpec"):
        app.enqueue(client, "t", {"a": 1})
    assert count(conn) == 0


def test_registering_what_is_not_a_middleware_or_one_twice_is_refused() -> None:
    class Forgot(Middleware):
        def run(self, job: Job) -> Any:  # no yield: not a generator
            job.payload = {}

    class Awaits(Middleware):
        async def run(self, job: Job) -> Any:  # type: ignore[override]
            return None

    app = App()
    with pytest.raises(ConfigError, match=r"no enqueue hook \(subclass miniqueue\.Middleware\)"):
        app.middleware(lambda job: None)  # type: ignore[type-var]
    for wrong in (Forgot(), Awaits()):
        with pytest.raises(ConfigError, match="its run hook is not a generator: write it with one 'yield'"):
            app.middleware(wrong)
    tenants = Stamp("m1", [])
    app.middleware(tenants)
    with pytest.raises(ConfigError, match="registered twice"):
        app.middleware(tenants)


# -- around a run --------------------------------------------------------------------------------


def test_run_hooks_nest_with_the_first_registered_outermost(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    events: list[str] = []
    app = stamped_app(events, "m1", "m2")

    @app.task("t")
    def handler(job: Job) -> str:
        events.append(f"handler sees {job.payload['seen']}")
        return "done"

    job_id = app.enqueue(client, "t", {"seen": []}).id
    events.clear()
    start_worker(app)
    assert finished(conn, job_id)["result"] == "done"
    assert events == ["m1 before", "m2 before", "handler sees ['m2', 'm1']", "m2 after done", "m1 after done"]


def test_a_hook_that_swallows_the_handlers_exception_completes_the_job(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    class Fallback(Middleware):
        def run(self, job: Job) -> RunHook:
            try:
                return (yield)
            except ConnectionError:
                return {"fallback": True}

    app = App()
    app.middleware(Fallback())
    app.task("t", max_attempts=1)(lambda job: _raise(ConnectionError("the API is down")))
    job_id = app.enqueue(client, "t").id
    start_worker(app)
    stored = finished(conn, job_id)
    assert (stored["state"], stored["result"], stored["errors"]) == ("completed", {"fallback": True}, [])


def test_a_hook_that_raises_fails_the_attempt_without_running_the_handler(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    ran: list[int] = []

    class Tenancy(Middleware):
        def run(self, job: Job) -> RunHook:
            if job.payload["tenant"] == "gone":
                raise LookupError(f"tenant {job.payload['tenant']!r} does not exist")
            return (yield)

    app = App()
    app.middleware(Tenancy())
    app.task("t", max_attempts=1)(lambda job: ran.append(job.id))
    job_id = app.enqueue(client, "t", {"tenant": "gone"}).id
    start_worker(app)
    stored = finished(conn, job_id)
    assert stored["state"] == "dead" and ran == []
    assert "LookupError: tenant 'gone' does not exist" in stored["errors"][0]["error"]


def test_a_hook_that_raises_after_the_handler_fails_the_attempt(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    class Strict(Middleware):
        def run(self, job: Job) -> RunHook:
            result = yield
            if result is None:
                raise ValueError("a handler of this app must return a result")
            return result

    app = App()
    app.middleware(Strict())
    app.task("t", max_attempts=1)(lambda job: None)
    job_id = app.enqueue(client, "t").id
    start_worker(app)
    assert "ValueError: a handler of this app must return a result" in finished(conn, job_id)["errors"][0]["error"]


def test_a_hook_that_returns_before_its_yield_skips_the_handler(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    class Skip(Middleware):
        def run(self, job: Job) -> RunHook:
            if job.payload.get("skip"):
                return "skipped"
            return (yield)

    app = App()
    app.middleware(Skip())
    app.task("t")(lambda job: _raise(AssertionError("the handler ran")))
    job_id = app.enqueue(client, "t", {"skip": True}).id
    start_worker(app)
    assert finished(conn, job_id)["result"] == "skipped"


def test_a_snooze_stays_a_snooze_whatever_a_hook_returns(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    class SwallowAll(Middleware):
        def run(self, job: Job) -> RunHook:
            try:
                return (yield)
            except Exception:
                return "swallowed"

    app = App()
    app.middleware(SwallowAll())
    app.task("t")(lambda job: _raise(Snooze(3600)))
    job_id = app.enqueue(client, "t").id
    start_worker(app)
    wait_until(lambda: row(conn, job_id)["attempt"] == 1 and row(conn, job_id)["state"] == "available")
    stored = row(conn, job_id)
    assert stored["result"] is None and stored["scheduled_at"] > stored["created_at"]


def test_async_handlers_run_inside_the_same_hooks(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    events: list[str] = []
    app = stamped_app(events, "m1", "m2")

    @app.task("t", max_attempts=1)
    async def handler(job: Job) -> str:
        await asyncio.sleep(0)
        events.append("handler")
        if job.payload.get("fail"):
            raise RuntimeError("async failure")
        return "done"

    ok = app.enqueue(client, "t", {"seen": []}).id
    failing = app.enqueue(client, "t", {"seen": [], "fail": True}).id
    events.clear()
    start_worker(app)
    assert finished(conn, ok)["result"] == "done"
    assert "RuntimeError: async failure" in finished(conn, failing)["errors"][0]["error"]
    assert events == [
        *["m1 before", "m2 before", "handler", "m2 after done", "m1 after done"],
        *["m1 before", "m2 before", "handler", "m2 saw async failure", "m1 saw async failure"],
    ]


@pytest.mark.parametrize("kind", ["def", "async def"])
def test_run_hooks_wrap_each_job_of_a_batch_and_see_its_own_outcome(
    client: Client, conn: Connection, start_worker: StartWorker, kind: str
) -> None:
    """Each job's hooks are entered, the batch handler runs once on the jobs they reached, and
    each job's hooks see that job's outcome: one hook skips a job, one rescues another's error."""
    events: list[str] = []
    calls: list[list[int]] = []

    class Gate(Middleware):
        def run(self, job: Job) -> RunHook:
            if job.payload.get("skip"):
                return "skipped"  # before its yield: this job never reaches the handler
            try:
                return (yield)
            except LookupError:
                return "rescued"

    app = stamped_app(events, "m1")
    app.middleware(Gate())

    def outcomes(jobs: list[Job]) -> dict[int, object]:
        calls.append(sorted(job.id for job in jobs))
        return {job.id: KeyError("gone") if job.payload.get("lost") else job.payload["n"] for job in jobs}

    if kind == "def":
        app.task("t", max_attempts=1, batch=Batch(size=3, wait=0.2))(outcomes)
    else:

        async def handler(jobs: list[Job]) -> dict[int, object]:
            await asyncio.sleep(0)
            return outcomes(jobs)

        app.task("t", max_attempts=1, batch=Batch(size=3, wait=0.2))(handler)
    plain, lost, skipped = (
        app.enqueue(client, "t", {"seen": [], "n": 1}, conn=conn).id,
        app.enqueue(client, "t", {"seen": [], "n": 2, "lost": True}, conn=conn).id,
        app.enqueue(client, "t", {"seen": [], "n": 3, "skip": True}, conn=conn).id,
    )
    events.clear()
    start_worker(app)
    assert [finished(conn, job)["result"] for job in (plain, lost, skipped)] == [1, "rescued", "skipped"]
    assert calls == [[plain, lost]], "one call, on the jobs the hooks let through"
    assert events.count("m1 before") == 3
    assert sorted(e for e in events if e != "m1 before") == ["m1 after 1", "m1 after rescued", "m1 after skipped"]


def test_run_jobs_of_the_testing_kit_runs_the_hooks(client: Client) -> None:
    events: list[str] = []
    app = stamped_app(events, "m1")
    app.task("t")(lambda job: job.payload["seen"])
    app.enqueue(client, "t", {"seen": []})
    result = run_jobs(app, client)
    assert [job.result for job in result.completed] == [["m1"]]
    assert events[-2:] == ["m1 before", "m1 after ['m1']"]


def test_the_attempts_span_encloses_the_run_hooks(spans: Spans, traced_client: Client) -> None:
    seen: list[int] = []

    class Traced(Middleware):
        def run(self, job: Job) -> RunHook:
            seen.append(trace.get_current_span().get_span_context().span_id)
            result = yield
            seen.append(trace.get_current_span().get_span_context().span_id)
            return result

    app = App()
    app.middleware(Traced())
    app.task("t")(lambda job: None)
    app.enqueue(traced_client, "t")
    run_jobs(app, traced_client)
    assert seen == [span_id(spans.one("process t"))] * 2


# -- in worker processes -------------------------------------------------------------------------


@pytest.fixture
def supervise(dsn: str, tmp_path: Path, repo_root: Path) -> Iterator[StartSupervisor]:
    with Fleet(dsn, tmp_path, repo_root, "tests.apps.middleware_app:app") as fleet:
        yield fleet.start


def test_supervised_workers_run_the_run_hooks_in_their_own_processes(
    supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    from ..apps.middleware_app import app

    sup = supervise(workers=2)
    sup.wait_ready(2)
    job_id = app.enqueue(client, "work", {"n": 1}).id
    assert payload(conn, job_id) == {"n": 1, "tenant": "acme"}
    result = finished(conn, job_id)["result"]
    assert result["tenant"] == "acme" and result["handler"]["payload"] == {"n": 1}
    assert result["hooked_in"] == result["handler"]["pid"] != os.getpid()
    assert result["hooked_in"] in sup.workers()


# -- the example: payloads encrypted at rest ------------------------------------------------------

KEYS = {"2024-01": bytes(range(32)), "2025-01": bytes(range(32, 64))}


def keys_text(*kids: str) -> str:
    import base64

    return ",".join(f"{kid}={base64.b64encode(KEYS[kid]).decode()}" for kid in kids)


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    pytest.importorskip("cryptography")
    monkeypatch.setenv("PAYLOAD_KEYS", keys_text("2025-01", "2024-01"))
    return importlib.import_module("examples.encrypted_payloads")


def test_the_example_stores_payloads_sealed_and_its_handler_reads_them_open(
    example: ModuleType, client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app: App = example.app
    job_id = app.enqueue(client, "charge", {"card": "4111111111111111", "cents": 1250}).id
    stored = conn.execute("SELECT payload::text, payload FROM miniqueue_jobs WHERE id = %s", [job_id]).fetchone()
    assert stored is not None
    text, sealed = stored
    assert set(sealed) == {"kid", "nonce", "ct"} and sealed["kid"] == "2025-01"
    assert "4111" not in text and "1250" not in text and "card" not in text
    start_worker(app)
    assert finished(conn, job_id)["result"] == {"charged": 1250, "card": "**** 1111"}


def test_the_example_opens_payloads_sealed_with_an_older_key(
    example: ModuleType, client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    old = App()
    old.middleware(example.EncryptedPayloads(example.Keyring.parse(keys_text("2024-01"))))
    old.task("charge", queue="payments")(lambda job: None)
    job_id = old.enqueue(client, "charge", {"card": "4000000000000002", "cents": 99}).id
    assert payload(conn, job_id)["kid"] == "2024-01"
    start_worker(example.app)  # sealing with 2025-01, opening both
    assert finished(conn, job_id)["result"] == {"charged": 99, "card": "**** 0002"}


def test_the_example_fails_for_good_a_job_enqueued_without_the_app(
    example: ModuleType, client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    plain = client.enqueue("charge", {"card": "4111111111111111", "cents": 1}, queue="payments").id
    forged = client.enqueue("charge", {"kid": "2025-01", "nonce": "AAAAAAAAAAAAAAAA", "ct": "AAAA"}, queue="payments")
    start_worker(example.app)
    assert "the payload is not sealed: enqueue this task through the app" in finished(conn, plain)["errors"][0]["error"]
    failed = finished(conn, forged.id)
    assert failed["state"] == "failed" and "does not open with key '2025-01'" in failed["errors"][0]["error"]


def test_the_example_refuses_a_payload_that_is_not_json(example: ModuleType, client: Client, conn: Connection) -> None:
    with pytest.raises(InvalidInput, match="the payload of task 'charge' is not JSON"):
        example.app.enqueue(client, "charge", {"cents": float("nan")})
    assert count(conn) == 0


def _raise(exc: BaseException) -> None:
    raise exc
