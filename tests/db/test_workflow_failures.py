"""Workflows that survive failure: dependencies that allow it, a group's on_success / on_complete /
on_failure callbacks, and members that add jobs to their own group (docs/guides/results.md)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from miniqueue import Client, JobSpec, State
from miniqueue.core.db import Connection
from miniqueue.core.errors import InvalidInput
from miniqueue.tasks.app import App
from miniqueue.tasks.job import Job, PermanentError

from ..helpers import row, wait_until
from ..running import StartWorker, worker_starter
from ..supervised import Fleet, create_executions
from .test_supervisor import handler_started, held_by


@pytest.fixture
def start_worker(dsn: str) -> Iterator[StartWorker]:
    """Workers with a 10 s lease: no test here waits for one to expire, and a claimed job must
    not outlive its lease unstarted when the machine is slow."""
    yield from worker_starter(dsn, lease_duration=10.0, heartbeat_seconds=2.0)


@pytest.fixture
def callbacks(conn: Connection) -> Connection:
    """Each callback's run, committed with its completion (a second completion would show)."""
    conn.execute("CREATE TABLE IF NOT EXISTS callback_runs (job_id BIGINT PRIMARY KEY, parents JSONB)")
    conn.execute("TRUNCATE callback_runs")
    return conn


def workflow_app() -> App:
    app = App()

    @app.task("member", max_attempts=1)
    def member(job: Job) -> Any:
        if job.payload.get("fail"):
            raise PermanentError("member failed on purpose")
        if job.payload.get("add"):
            with job.transaction() as conn:
                for extra in job.payload["add"]:
                    job.add_to_group(JobSpec("member", {"n": extra}))
                conn.execute("SELECT 1")
                job.set_result(job.payload.get("n"))
            return None
        return job.payload.get("n")

    @app.task("callback")
    def callback(job: Job) -> None:
        outcomes = {str(k): [v.state.value, v.result] for k, v in job.parent_outcomes.items()}
        with job.transaction() as conn:
            conn.execute("INSERT INTO callback_runs VALUES (%s, %s)", [job.id, Jsonb(outcomes)])

    return app


def parents_read(conn: Connection, callback: int) -> Any:
    """How the callback's handler saw its parents' outcomes: {id: [state, result]}."""
    found = conn.execute("SELECT parents FROM callback_runs WHERE job_id = %s", [callback]).fetchone()
    assert found is not None, f"callback {callback} did not run"
    return found[0]


def settled(conn: Connection, ids: list[int]) -> bool:
    return all(row(conn, i)["state"] in ("completed", "failed", "dead", "cancelled") for i in ids)


def test_a_dependency_that_allows_failure_runs_after_its_parent_failed(
    client: Client, callbacks: Connection, start_worker: StartWorker
) -> None:
    app = workflow_app()
    parent = client.enqueue("member", {"fail": True}).id
    strict = client.enqueue("callback", depends_on=[parent]).id
    tolerant = client.enqueue("callback", depends_on=[parent], allow_failure=True).id
    start_worker(app)
    wait_until(lambda: settled(callbacks, [parent, strict, tolerant]), what="all settled")
    assert row(callbacks, parent)["state"] == "failed"
    assert row(callbacks, strict)["state"] == "cancelled", "a plain dependency is cancelled by a failed parent"
    assert row(callbacks, tolerant)["state"] == "completed"
    seen = parents_read(callbacks, tolerant)
    assert seen == {str(parent): ["failed", None]}, "the dependent read how its parent ended"


def test_a_dependency_on_a_parent_that_already_failed_runs_at_once_when_it_allows_failure(
    client: Client, callbacks: Connection, start_worker: StartWorker
) -> None:
    app = workflow_app()
    parent = client.enqueue("member", {"fail": True}).id
    start_worker(app)
    wait_until(lambda: row(callbacks, parent)["state"] == "failed", what="the parent failed")
    with pytest.raises(InvalidInput, match=f"depends_on names job {parent}, which ended failed"):
        client.enqueue("callback", depends_on=[parent])
    tolerant = client.enqueue("callback", depends_on=[parent], allow_failure=True).id
    assert row(callbacks, tolerant)["failed_parents"] == 1
    wait_until(lambda: row(callbacks, tolerant)["state"] == "completed", what="the tolerant dependent ran")


def test_a_groups_callbacks_each_run_by_their_rule(
    client: Client, callbacks: Connection, start_worker: StartWorker
) -> None:
    app = workflow_app()
    spec = JobSpec("callback")
    failing = client.group(
        [JobSpec("member", {"n": 1}), JobSpec("member", {"fail": True})],
        on_success=spec,
        on_complete=spec,
        on_failure=spec,
    )
    passing = client.group([JobSpec("member", {"n": 2}), JobSpec("member", {"n": 3})], then=spec, on_failure=spec)
    only_complete = client.group([JobSpec("member", {"n": 4})], on_complete=spec)
    with pytest.raises(LookupError, match="this group has no then"):
        _ = only_complete.then
    assert failing.then is not None and failing.on_complete is not None and failing.on_failure is not None
    assert passing.then is not None and passing.on_failure is not None and passing.on_complete is None
    start_worker(app)
    assert only_complete.on_complete is not None
    every = [failing.then.id, failing.on_complete.id, failing.on_failure.id, passing.then.id, passing.on_failure.id]
    every.append(only_complete.on_complete.id)
    wait_until(lambda: settled(callbacks, every), what="every callback settled")
    states = {i: row(callbacks, i)["state"] for i in every}
    assert states == {
        failing.then.id: "cancelled",
        failing.on_complete.id: "completed",
        failing.on_failure.id: "completed",
        passing.then.id: "completed",
        passing.on_failure.id: "cancelled",
        only_complete.on_complete.id: "completed",
    }
    assert (
        "every parent completed, and it runs only if one does not"
        in row(callbacks, passing.on_failure.id)["last_error"]
    )
    member_ids = [m.id for m in failing.members]
    seen = parents_read(callbacks, failing.on_failure.id)
    assert seen == {str(member_ids[0]): ["completed", 1], str(member_ids[1]): ["failed", None]}
    assert callbacks.execute("SELECT count(*) FROM callback_runs").fetchone() == (4,), "each of the four ran once"
    counted = {c.state: c.count for c in client.counts() if c.queue == "default" and c.state is State.CANCELLED}
    assert counted == {State.CANCELLED: 2}, "the unneeded callbacks are counted as cancelled"


def test_a_member_adds_jobs_to_its_group_and_the_callback_waits_for_them(
    client: Client, callbacks: Connection, start_worker: StartWorker
) -> None:
    app = workflow_app()
    group = client.group(
        [JobSpec("member", {"n": 1, "add": [10, 11]}), JobSpec("member", {"n": 2})], then=JobSpec("callback")
    )
    start_worker(app)
    wait_until(lambda: row(callbacks, group.then.id)["state"] == "completed", what="the callback ran")
    parents = row(callbacks, group.then.id)["parents"]
    assert len(parents) == 4, "the two members and the two jobs one of them added"
    added = [p for p in parents if p not in {m.id for m in group.members}]
    for job_id in added:
        assert row(callbacks, job_id)["state"] == "completed"
        assert row(callbacks, job_id)["dependents"] == [group.then.id]
    seen = parents_read(callbacks, group.then.id)
    assert sorted(v[1] for v in seen.values()) == [1, 2, 10, 11]
    last_member = callbacks.execute(
        "SELECT max(finished_at) FROM miniqueue_jobs WHERE id = ANY(%s)", [parents]
    ).fetchone()
    started = row(callbacks, group.then.id)["completed_at"]
    assert last_member is not None and last_member[0] <= started, "the callback ran after every member"


def test_bad_workflows_are_refused_with_a_clear_error(client: Client, callbacks: Connection) -> None:
    with pytest.raises(InvalidInput, match="allow_failure needs depends_on"):
        client.enqueue("callback", allow_failure=True)
    with pytest.raises(InvalidInput, match="allow_failure 'yes' is invalid"):
        client.enqueue_many([JobSpec("callback", depends_on=[1], allow_failure="yes")])  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="a group needs a callback"):
        client.group([JobSpec("member")])
    with pytest.raises(InvalidInput, match="then and on_success name the same callback"):
        client.group([JobSpec("member")], then=JobSpec("callback"), on_success=JobSpec("callback"))
    assert callbacks.execute("SELECT count(*) FROM miniqueue_jobs").fetchone() == (0,), "nothing stored"


def test_add_to_group_outside_a_group_or_a_transaction_fails_the_attempt_clearly(
    client: Client, callbacks: Connection, start_worker: StartWorker
) -> None:
    app = App()

    @app.task("loner", max_attempts=1)
    def loner(job: Job) -> None:
        with job.transaction():
            job.add_to_group(JobSpec("x"))

    @app.task("careless", max_attempts=1)
    def careless(job: Job) -> None:
        job.add_to_group(JobSpec("x"))

    loner_id, careless_id = (client.enqueue(task, max_attempts=1).id for task in ("loner", "careless"))
    start_worker(app)
    wait_until(lambda: settled(callbacks, [loner_id, careless_id]), what="both ended")
    assert f"job {loner_id} is in no group" in row(callbacks, loner_id)["last_error"]
    assert "runs inside 'with job.transaction()'" in row(callbacks, careless_id)["last_error"]
    assert callbacks.execute("SELECT count(*) FROM miniqueue_jobs WHERE task = 'x'").fetchone() == (0,)


def test_under_a_sigkill_each_callback_runs_once_after_every_member_and_every_job_added(
    dsn: str, tmp_path: Path, repo_root: Path, conn: Connection, client: Client
) -> None:
    create_executions(conn, "parents_done BOOLEAN")
    conn.execute("DROP TABLE IF EXISTS callback_effects")
    conn.execute("CREATE TABLE callback_effects (job_id BIGINT PRIMARY KEY, parents_finished BOOLEAN NOT NULL)")
    with Fleet(dsn, tmp_path, repo_root, "tests.apps.workflow:app") as fleet:
        sup = fleet.start(workers=2)
        sup.wait_ready(2)
        slow = JobSpec("spawner", {"sleep_on": [1, 2], "seconds": 5})
        members = [JobSpec("step", {"value": 1}), JobSpec("flaky"), slow]
        group = client.group(members, then=JobSpec("tally"), on_complete=JobSpec("tally"), on_failure=JobSpec("tally"))
        assert group.then is not None and group.on_complete is not None and group.on_failure is not None
        slow_id = group.members[-1].id
        pid = wait_until(lambda: handler_started(conn, slow_id) and held_by(conn, slow_id), what="slow member running")
        os.kill(pid, signal.SIGKILL)
        for callback in (group.on_complete.id, group.on_failure.id):
            wait_until(lambda: row(conn, callback)["state"] == "completed", timeout=60, what="callback")  # noqa: B023
    assert row(conn, group.then.id)["state"] == "cancelled", "a member failed: the on-success callback is not needed"
    assert row(conn, slow_id)["attempt"] >= 2, "the slow member was killed and ran again"
    effects = dict(conn.execute("SELECT job_id, parents_finished FROM callback_effects").fetchall())
    assert effects == {group.on_complete.id: True, group.on_failure.id: True}, "each ran once, after every member"
    # The killed attempt's adds never committed; the last attempt's two did, and the callbacks
    # waited for them as for the members.
    added = conn.execute(
        "SELECT id FROM miniqueue_jobs WHERE task = 'step' AND payload ? 'value' "
        "AND (payload->>'value')::int >= 1000 ORDER BY id"
    ).fetchall()
    assert len(added) == 2 and all(row(conn, job_id)["state"] == "completed" for (job_id,) in added)
    for callback in (group.on_complete.id, group.on_failure.id):
        assert sorted(row(conn, callback)["parents"]) == sorted(
            [*(m.id for m in group.members), *(a for (a,) in added)]
        )
