"""Job progress: reported by handlers (``job.progress``), written with the heartbeat's lease
renewal and the completion (fenced), read with ``client.progress``, ``jobs show`` and the
dashboard, and followed with ``client.watch``."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from miniqueue import AsyncClient, Client, InvalidInput, JobNotFound, WaitTimeout
from miniqueue.cli.main import main
from miniqueue.core.db import Connection
from miniqueue.core.records import JobProgress, JobSpec, State
from miniqueue.core.validation import validate
from miniqueue.store.store import Store
from miniqueue.tasks.app import App
from miniqueue.tasks.job import MAX_PROGRESS_META_BYTES, Job, encode_progress
from miniqueue.web import create_app

from ..helpers import expire_lease, row, take_over, wait_until
from ..running import RunOne, StartWorker


def stepping_app(gate: threading.Event, steps: int = 3) -> App:
    """``step`` reports 10%, 20%, ... one step at a time: each step waits for ``gate`` (set by
    the test once it saw the step's progress), then returns ``{"steps": steps}``. ``step_async``
    does the same in an ``async def`` handler."""
    app = App()

    @app.task("step", max_attempts=1)
    def step(job: Job) -> Any:
        for n in range(1, steps + 1):
            job.progress(n * 10, step=n)
            gate.wait(10)
            gate.clear()
        return {"steps": steps}

    @app.task("step_async", max_attempts=1)
    async def step_async(job: Job) -> Any:
        for n in range(1, steps + 1):
            job.progress(n * 10, step=n)
            while not gate.is_set():
                await asyncio.sleep(0.01)
            gate.clear()
        return {"steps": steps}

    return app


def step_written(client: Client, job_id: int, percent: float) -> JobProgress | None:
    """The job as read, once its progress says ``percent``."""
    current = client.progress(job_id)
    return current if current.progress is not None and current.progress.percent == percent else None


def show(dsn: str, job_id: int, *options: str) -> str:
    """What ``miniqueue jobs show`` prints."""
    shown = CliRunner().invoke(
        main, ["jobs", "show", str(job_id), *options, "--database-url", dsn], env={"DATABASE_URL": None}
    )
    assert shown.exit_code == 0, shown.output
    return shown.output


def percent(item: JobProgress) -> float | None:
    return None if item.progress is None else item.progress.percent


def test_progress_is_seen_while_the_job_runs_and_kept_when_it_completes(
    client: Client, dsn: str, start_worker: StartWorker
) -> None:
    gate = threading.Event()
    job_id = client.enqueue("step").id
    start_worker(stepping_app(gate))
    for n in (1, 2, 3):
        current = wait_until(functools.partial(step_written, client, job_id, n * 10), what=f"step {n} written")
        assert current.state is State.RUNNING and current.progress is not None
        assert current.progress.meta == {"step": n} and current.progress.at is not None
        assert f"progress: {n * 10}% (step={n})" in show(dsn, job_id)
        gate.set()
    done = wait_until(lambda: ((p := client.progress(job_id)).finished and p) or None, what="job completed")
    assert done.state is State.COMPLETED and done.result == {"steps": 3} and percent(done) == 30
    assert json.loads(show(dsn, job_id, "--json"))["progress"]["percent"] == 30


def test_the_dashboard_job_page_refreshes_the_progress(client: Client, start_worker: StartWorker) -> None:
    """The job page's live region (the fragment its script re-fetches every few seconds, as for
    every live page) shows each step's progress as it is written."""
    gate = threading.Event()
    job_id = client.enqueue("step").id
    start_worker(stepping_app(gate))
    with TestClient(create_app(client), base_url="http://localhost") as web:
        page = web.get(f"/jobs/{job_id}").text
        assert 'data-live="' in page
        for n in (1, 2, 3):
            wait_until(functools.partial(step_written, client, job_id, n * 10), what=f"step {n} written")
            fragment = web.get(f"/jobs/{job_id}?partial=1").text
            assert f'<progress max="100" value="{n * 10}.0">' in fragment and f"{n * 10}%" in fragment
            assert f"<code>{{&#34;step&#34;: {n}}}</code>" in fragment  # the meta, escaped
            gate.set()


@pytest.mark.parametrize("task", ["step", "step_async"])
def test_watch_yields_increasing_progress_then_the_outcome(
    client: Client, start_worker: StartWorker, task: str
) -> None:
    gate = threading.Event()
    job_id = client.enqueue(task).id
    start_worker(stepping_app(gate))
    items = []
    for item in client.watch(job_id, timeout=30):
        items.append(item)
        if item.progress is not None and not item.finished:
            gate.set()  # the next step may run: it is seen, and the watch waits for the next
    updates = [percent(item) for item in items if item.progress is not None and not item.finished]
    assert updates == [10, 20, 30]
    assert items[-1].finished and items[-1].state is State.COMPLETED and items[-1].result == {"steps": 3}
    assert all(not item.finished for item in items[:-1])


def test_async_watch_yields_increasing_progress_then_the_outcome(dsn: str, start_worker: StartWorker) -> None:
    gate = threading.Event()

    async def follow() -> list[JobProgress]:
        async with AsyncClient(dsn) as client:
            job_id = (await client.enqueue("step_async")).id
            start_worker(stepping_app(gate))
            items = []
            async for item in client.watch(job_id, timeout=30):
                items.append(item)
                if item.progress is not None and not item.finished:
                    gate.set()
            assert (await client.progress(job_id)).state is State.COMPLETED
            return items

    items = asyncio.run(follow())
    assert [percent(item) for item in items if item.progress is not None and not item.finished] == [10, 20, 30]
    assert items[-1].finished and items[-1].result == {"steps": 3}


def test_watch_times_out_and_knows_no_unknown_job(client: Client) -> None:
    job_id = client.enqueue("nobody_runs_this").id
    with pytest.raises(WaitTimeout):
        list(client.watch(job_id, timeout=0.3))
    with pytest.raises(JobNotFound):
        list(client.watch(job_id + 1000, timeout=0.3))
    with pytest.raises(JobNotFound):
        client.progress(job_id + 1000)
    assert client.progress(job_id) == JobProgress(job_id, State.AVAILABLE, None)


def test_a_stale_attempt_writes_no_progress(store: Store, conn: Connection) -> None:
    """The renewal and the completion's write are fenced: once the job was recovered and claimed
    again, the first holder's progress is not written; the second holder's is."""
    job_id = store.enqueue(conn, validate(JobSpec("t"))).id
    (first,) = store.claim(conn, ["default"], "w1", 30, 1)
    expire_lease(conn, job_id)
    store.recover_expired_leases(conn)
    second = take_over(conn, store, job_id, "w2")
    stale = encode_progress(50, {"note": "stale"})
    assert store.renew_leases(conn, "w1", [(job_id, first.attempt)], 30, progress={job_id: stale}) == {}
    assert store.record_progress(conn, "w1", {(job_id, first.attempt): stale}) == set()
    assert row(conn, job_id)["progress"] is None
    assert store.renew_leases(conn, "w2", [(job_id, second.attempt)], 30, progress={job_id: encode_progress(5, {})})
    assert row(conn, job_id)["progress"]["percent"] == 5
    assert store.record_progress(conn, "w2", {(job_id, second.attempt): encode_progress(7, {})}) == {job_id}
    assert row(conn, job_id)["progress"]["percent"] == 7
    assert store.renew_leases(conn, "w2", [(job_id, second.attempt)], 30)  # no report: the last one stays
    assert row(conn, job_id)["progress"]["percent"] == 7


class StatementCounter:
    """Counts the statements sent by threads other than the test's (the worker's claim loop,
    heartbeat and handler threads) while ``counting`` is set: each ``Cursor.execute`` is one
    round trip to the server (these connections run in autocommit, one statement at a time)."""

    def __init__(self) -> None:
        self.counting = False
        self.count = 0
        self._lock = threading.Lock()

    def wrap(self, execute: Any) -> Any:
        def counted(cursor: Any, *args: Any, **kwargs: Any) -> Any:
            if self.counting and threading.current_thread() is not threading.main_thread():
                with self._lock:
                    self.count += 1
            return execute(cursor, *args, **kwargs)

        return counted


def test_a_thousand_reports_cost_a_few_round_trips(
    client: Client, conn: Connection, start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1,000 reports over three heartbeat intervals: the worker sends at most 10 statements from
    the handler's first report to the completion, renewals and the completion included (not
    one per report). Counted at the driver: every statement the worker's threads execute."""
    counter = StatementCounter()
    monkeypatch.setattr(psycopg.Cursor, "execute", counter.wrap(psycopg.Cursor.execute))
    app = App()

    @app.task("crunch", max_attempts=1)
    def crunch(job: Job) -> None:
        counter.counting = True
        for n in range(1000):
            job.progress(n / 10, row=n)
            job.wait(0.0015)  # spread the reports over a few heartbeats
        job.progress(100, row=1000)

    job_id = client.enqueue("crunch").id
    start_worker(app, poll_interval=30.0)  # no poll in the window: the claim loop waits for work
    wait_until(lambda: row(conn, job_id)["state"] == "completed", what="job completed")
    counter.counting = False
    progress = client.progress(job_id).progress
    assert progress is not None and (progress.percent, progress.meta) == (100, {"row": 1000})
    assert 3 <= counter.count <= 10, f"{counter.count} statements for 1,000 progress reports"


@pytest.mark.parametrize(
    ("percent", "meta", "error"),
    [
        (101, {}, "progress percent 101 is out of range: use a number from 0 to 100"),
        (-1, {}, "progress percent -1 is out of range"),
        (float("nan"), {}, "progress percent nan is out of range"),
        (float("inf"), {}, "progress percent inf is out of range"),
        ("50", {}, "progress percent '50' is not a number"),
        (True, {}, "progress percent True is not a number"),
        (50, {"x": float("nan")}, "progress meta contains a float nan"),
        (50, {"x": object()}, "progress meta is not JSON-serialisable"),
        (50, {"x": "a" * MAX_PROGRESS_META_BYTES}, f"the limit is {MAX_PROGRESS_META_BYTES} bytes"),
    ],
)
def test_bad_progress_is_a_clear_error(percent: Any, meta: dict[str, Any], error: str) -> None:
    with pytest.raises(InvalidInput, match=error.replace("(", r"\(").replace(")", r"\)")):
        encode_progress(percent, meta)


def test_a_bad_report_fails_the_attempt_and_writes_nothing(run_one: RunOne) -> None:
    stored = run_one(lambda job: job.progress(150), "dead", max_attempts=1)
    assert "progress percent 150 is out of range" in stored["last_error"]
    assert stored["progress"] is None
