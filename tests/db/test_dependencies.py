"""Jobs that wait for jobs: depends_on, chains and groups, on a real PostgreSQL."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from miniqueue import Client, InvalidInput, JobSpec, PermanentError, State
from miniqueue.core.db import Connection, connect
from miniqueue.store.store import Store
from miniqueue.tasks.app import App
from miniqueue.tasks.job import Job
from miniqueue.web import create_app

from ..helpers import count, expire_lease, row, wait_until
from ..running import StartWorker
from .test_cli import run
from .test_web import on_localhost


class Recorder:
    """An app whose ``node`` task returns its name joined to its parents' results, records each
    run, and records a violation if a parent had not completed when it started."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.runs: list[int] = []
        self.violations: list[str] = []
        self.seen: dict[int, dict[int, Any]] = {}
        self.lock = threading.Lock()
        self.app = App()
        self.app.task("node")(self.node)
        self.app.task("fail", max_attempts=1)(self.fail)
        self.app.task("crash", max_attempts=1)(self.crash)

    def node(self, job: Job) -> Any:
        if job.parents:
            with connect(self.dsn, purpose="test") as c:
                states = c.execute("SELECT id, state FROM miniqueue_jobs WHERE id = ANY(%s)", [list(job.parents)])
                for parent, state in states.fetchall():
                    if state != "completed":
                        self.violations.append(f"job {job.id} started while its parent {parent} was {state}")
        with self.lock:
            self.runs.append(job.id)
            self.seen[job.id] = job.parent_results
        return "".join([*(str(r) for r in job.parent_results.values()), job.payload["name"]])

    def fail(self, job: Job) -> None:
        raise PermanentError("broken on purpose")

    def crash(self, job: Job) -> None:
        raise RuntimeError("retried until dead")


@pytest.fixture
def recorder(dsn: str) -> Recorder:
    return Recorder(dsn)


def state(conn: Connection, job_id: int) -> str:
    return str(row(conn, job_id)["state"])


def completed(conn: Connection, *ids: int) -> bool:
    return all(state(conn, i) == "completed" for i in ids)


def test_diamond_runs_each_job_once_after_its_parents(
    client: Client, conn: Connection, recorder: Recorder, start_worker: StartWorker
) -> None:
    a = client.enqueue("node", {"name": "a"}).id
    b = client.enqueue("node", {"name": "b"}, depends_on=[a]).id
    c = client.enqueue("node", {"name": "c"}, depends_on=[a]).id
    d = client.enqueue("node", {"name": "d"}, depends_on=[b, c]).id
    assert [state(conn, i) for i in (a, b, c, d)] == ["available", "waiting", "waiting", "waiting"]
    assert row(conn, d)["pending_parents"] == 2 and row(conn, a)["dependents"] == [b, c]
    start_worker(recorder.app, concurrency=2)
    wait_until(lambda: completed(conn, a, b, c, d), what="the diamond completed")
    assert sorted(recorder.runs) == [a, b, c, d] and recorder.violations == []
    assert recorder.seen[d] == {b: "ab", c: "ac"}
    assert client.result(d) == "abacd"


def test_fan_in_of_a_thousand_parents(
    client: Client, conn: Connection, recorder: Recorder, start_worker: StartWorker
) -> None:
    parents = [r.id for r in client.enqueue_many([JobSpec("node", {"name": str(i)}) for i in range(1000)])]
    child = client.enqueue("node", {"name": "!"}, depends_on=parents).id
    assert row(conn, child)["pending_parents"] == 1000
    start_worker(recorder.app, concurrency=4)
    wait_until(lambda: state(conn, child) == "completed", timeout=60, what="the fan-in completed")
    assert recorder.runs.count(child) == 1 and recorder.violations == []
    assert list(recorder.seen[child]) == parents
    assert client.result(child) == "".join(str(i) for i in range(1000)) + "!"


def test_a_parent_completed_before_enqueue_counts_as_done(
    client: Client, conn: Connection, recorder: Recorder, start_worker: StartWorker
) -> None:
    start_worker(recorder.app)
    done = client.enqueue("node", {"name": "x"}).id
    wait_until(lambda: completed(conn, done), what="parent completed")
    pending = client.enqueue("node", {"name": "y"}, delay=3600).id
    child = client.enqueue("node", {"name": "z"}, depends_on=[done, pending])
    stored = row(conn, child.id)
    assert stored["state"] == "waiting" and stored["pending_parents"] == 1 and stored["parents"] == [done, pending]
    only_done = client.enqueue("node", {"name": "w"}, depends_on=[done]).id
    wait_until(lambda: completed(conn, only_done), what="a job whose parents all completed runs at once")
    assert client.result(only_done) == "xw"


def test_a_parent_retried_releases_its_dependent_once_it_completes(
    client: Client, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()

    @app.task("flaky")
    def flaky(job: Job) -> int:
        if job.run == 1:
            raise RuntimeError("first attempt fails")
        return job.run

    app.task("after")(lambda job: job.parent_result)
    parent = client.enqueue("flaky").id
    child = client.enqueue("after", depends_on=[parent]).id
    start_worker(app)
    wait_until(lambda: completed(conn, child), timeout=20, what="child completed")
    assert row(conn, parent)["attempt"] == 2 and client.result(child) == 2


@pytest.mark.parametrize("how", ["failed", "dead by the worker", "dead by the reaper", "cancelled"])
def test_a_parent_that_does_not_complete_cancels_its_dependents_and_theirs(
    client: Client, conn: Connection, store: Store, recorder: Recorder, start_worker: StartWorker, how: str
) -> None:
    task = {"failed": "fail", "dead by the worker": "crash"}.get(how, "node")
    parent = client.enqueue(task, {"name": "p"}, max_attempts=1).id
    child = client.enqueue("node", {"name": "c"}, depends_on=[parent]).id
    grandchild = client.enqueue("node", {"name": "g"}, depends_on=[child]).id
    other = client.enqueue("node", {"name": "o"}).id
    sibling = client.enqueue("node", {"name": "s"}, depends_on=[other, child]).id
    if how == "dead by the reaper":
        [lease] = store.claim(conn, ["default"], "gone:1:x", 30, 1)
        expire_lease(conn, lease.id)
        assert store.recover_expired_leases(conn) == {parent: State.DEAD}
    elif how == "cancelled":
        client.cancel([parent])
    else:
        start_worker(recorder.app)
    ended = {"failed": "failed", "cancelled": "cancelled"}.get(how, "dead")
    wait_until(lambda: state(conn, sibling) == "cancelled", what="the cancellation reached every descendant")
    assert state(conn, parent) == ended
    assert row(conn, child)["last_error"] == f"cancelled: its parent job {parent} ended {ended}"
    assert row(conn, grandchild)["last_error"] == f"cancelled: its parent job {child} ended cancelled"
    assert row(conn, sibling)["last_error"] == f"cancelled: its parent job {child} ended cancelled"
    assert all(row(conn, i)["finished_at"] is not None for i in (child, grandchild, sibling))
    assert not set(recorder.runs) & {child, grandchild, sibling}
    # The finished-job counters stay exact.
    counted = conn.execute("SELECT sum(count) FROM miniqueue_counts WHERE state = 'cancelled'").fetchone()
    assert counted == (count(conn, "state = 'cancelled'"),)


def test_cancelling_a_waiting_job_and_deleting_an_unfinished_parent(client: Client, conn: Connection) -> None:
    parent = client.enqueue("node", {"name": "p"}).id
    child = client.enqueue("node", {"name": "c"}, depends_on=[parent]).id
    grandchild = client.enqueue("node", {"name": "g"}, depends_on=[child]).id
    client.cancel([child])
    assert state(conn, child) == "cancelled" and state(conn, grandchild) == "cancelled"
    assert state(conn, parent) == "available"
    other = client.enqueue("node", {"name": "o"}, depends_on=[parent]).id
    with client.connection() as c:
        client.store.delete(c, [parent])
    assert row(conn, other)["last_error"] == f"cancelled: its parent job {parent} was deleted unfinished"


def test_unknown_and_ended_parents_are_rejected_and_nothing_is_stored(client: Client, conn: Connection) -> None:
    parent = client.enqueue("node", {"name": "p"}).id
    dead = client.enqueue("node", {"name": "d"}).id
    client.cancel([dead])
    before = count(conn)
    next_id = parent + 10  # an id that no job has yet: a job cannot name a job enqueued after it
    cases: list[tuple[Any, str]] = [
        ([parent, next_id], f"do not exist: {next_id}; a job can only depend on jobs enqueued before it"),
        ([dead], f"names job {dead}, which ended cancelled"),
        ([], "depends_on is empty"),
        ("12", "give a list of job ids"),
        ([parent, 0], "depends_on job id 0 is invalid"),
    ]
    for depends_on, message in cases:
        with pytest.raises(InvalidInput, match=message):
            client.enqueue("node", {"name": "x"}, depends_on=depends_on)
    with pytest.raises(InvalidInput, match=f"job 1: depends_on names job.*{next_id}"):
        client.enqueue_many([JobSpec("node"), JobSpec("node", depends_on=[next_id])])
    with pytest.raises(InvalidInput, match="do not exist"):
        client.chain([JobSpec("node"), JobSpec("node", depends_on=[next_id])])
    assert count(conn) == before
    assert row(conn, parent)["dependents"] is None


def test_an_idempotent_repeat_links_nothing(client: Client, conn: Connection) -> None:
    parent = client.enqueue("node").id
    first = client.enqueue("node", depends_on=[parent], idempotency_key="k")
    again = client.enqueue("node", depends_on=[parent], idempotency_key="k")
    assert again.duplicate and again.id == first.id
    assert row(conn, parent)["dependents"] == [first.id] and row(conn, first.id)["pending_parents"] == 1


def test_a_dependent_enqueued_while_its_parent_completes_is_released(
    client: Client, conn: Connection, dsn: str, store: Store
) -> None:
    """The completion statement starts, then waits on the parent row that a dependent's enqueue
    locked; the dependent commits; the completion then goes on with a snapshot that predates
    the dependent. It must still release it (the settle function reads with a fresh snapshot)."""
    parent = client.enqueue("node").id
    [lease] = store.claim(conn, ["default"], "w:1:a", 30, 1)
    with connect(dsn, purpose="test-enqueue") as enqueuer, enqueuer.transaction():
        child = client.enqueue("node", depends_on=[parent], conn=enqueuer).id
        done: list[set[int]] = []
        completion = threading.Thread(target=lambda: done.append(_complete(dsn, store, lease.id, lease.attempt)))
        completion.start()
        wait_until(lambda: _blocked(conn), what="the completion waits on the parent row")
    completion.join(10)
    assert done == [{parent}]
    stored = row(conn, child)
    assert stored["state"] == "available" and stored["pending_parents"] == 0


def _complete(dsn: str, store: Store, job_id: int, attempt: int) -> set[int]:
    with connect(dsn, purpose="test-complete") as c:
        return store.complete_many(c, "w:1:a", [(job_id, attempt)])


def _blocked(conn: Connection) -> bool:
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'miniqueue:test-complete' "
        "AND wait_event_type = 'Lock' AND datname = current_database()"
    )
    found = conn.execute(query).fetchone()
    return found is not None and found[0] == 1


def test_chain_passes_each_result_to_the_next_step(
    client: Client, conn: Connection, recorder: Recorder, start_worker: StartWorker
) -> None:
    steps = client.chain([JobSpec("node", {"name": n}) for n in "abcd"])
    ids = [s.id for s in steps]
    assert [row(conn, i)["parents"] for i in ids] == [None, ids[:1], ids[1:2], ids[2:3]]
    start_worker(recorder.app, concurrency=3)
    assert client.wait(ids[-1], timeout=30) == "abcd"
    assert recorder.runs == ids and recorder.violations == []


def test_group_runs_its_callback_once_with_every_members_result(
    client: Client, conn: Connection, recorder: Recorder, start_worker: StartWorker
) -> None:
    group = client.group([JobSpec("node", {"name": str(i)}) for i in range(20)], then=JobSpec("node", {"name": "!"}))
    members = [m.id for m in group.members]
    for _ in range(3):
        start_worker(recorder.app, concurrency=4)
    client.wait(group.then.id, timeout=30)
    assert recorder.runs.count(group.then.id) == 1 and recorder.violations == []
    assert recorder.seen[group.then.id] == {m: str(i) for i, m in enumerate(members)}
    assert row(conn, group.then.id)["attempt"] == 1


def test_waiting_jobs_show_in_stats_and_lists(client: Client, conn: Connection) -> None:
    parent = client.enqueue("node", queue="q1").id
    children = [client.enqueue("node", queue="q2", depends_on=[parent]).id for _ in range(3)]
    [stats] = [s for s in client.queue_stats() if s.queue == "q2"]
    assert stats.counts[State.WAITING] == 3 and stats.counts[State.AVAILABLE] == 0
    listed = client.list_jobs(state="waiting")
    assert sorted(j.id for j in listed) == children and all(j.parents == (parent,) for j in listed)
    assert client.get(parent).dependents == tuple(children)


def test_cli_and_dashboard_show_parents_dependents_and_results(client: Client, conn: Connection, dsn: str) -> None:
    parent = client.enqueue("node").id
    child = client.enqueue("node", depends_on=[parent]).id
    store = Store()
    [lease] = store.claim(conn, ["default"], "w:1:a", 30, 1)
    store.complete(conn, parent, "w:1:a", lease.attempt, result='{"rows": 3, "name": "caf\\u00e9"}')
    other = client.enqueue("node", queue="blocked", delay=3600).id
    waiting = client.enqueue("node", queue="blocked", depends_on=[other]).id

    listed = run(dsn, "jobs", "list", "--state", "waiting")
    assert listed.exit_code == 0, listed.output
    _header, line = listed.stdout.strip().splitlines()
    assert line.split()[:2] == [str(waiting), "waiting"] and f"waiting on 1 of 1 parents: {other}" in line
    shown = run(dsn, "jobs", "show", str(parent)).stdout
    assert 'result: {"name": "caf\\u00e9", "rows": 3}' in shown and f"dependents: [{child}]" in shown
    as_json = json.loads(run(dsn, "jobs", "show", str(child), "--json").stdout)
    assert as_json["parents"] == [parent] and as_json["state"] == "available" and as_json["result"] is None

    with on_localhost(create_app(client)) as web:
        page = web.get(f"/jobs/{parent}").text
        assert "Result" in page and "&#34;rows&#34;: 3" in page and f'href="/jobs/{child}"' in page
        page = web.get(f"/jobs/{waiting}").text
        assert f'href="/jobs/{other}"' in page and "(1 not completed yet)" in page
        assert "Result</h2>" not in page


def test_a_callback_of_members_with_huge_results_runs_and_stalls_nothing(client: Client, conn: Connection) -> None:
    """The members' results together exceed what one jsonb value may hold (256 MB): the claim
    must not aggregate them (it failed, and the worker retried the same claim forever)."""
    from miniqueue.testing import run_jobs

    app = App()
    callbacks: list[int] = []

    @app.task("member")
    def member(job: Job) -> str:
        return "small"

    @app.task("callback")
    def callback(job: Job) -> int:
        callbacks.append(len(job.parents))
        first = job.parent_results[job.parents[0]]  # read when asked: one row per parent
        return len(first)

    @app.task("other")
    def other(job: Job) -> None:
        pass

    group = client.group([JobSpec("member") for _ in range(280)], then=JobSpec("callback"))
    ids = [m.id for m in group.members]
    # Completed members whose results are 1,000,000 characters each (stored compressed).
    conn.execute(
        "UPDATE miniqueue_jobs SET state = 'completed', result = to_jsonb(repeat('x', 1000000)),"
        " finished_at = now(), completed_at = now() WHERE id = ANY(%s)",
        [ids],
    )
    conn.execute("UPDATE miniqueue_jobs SET state = 'available', pending_parents = 0 WHERE id = %s", [group.then.id])
    others = [client.enqueue("other").id for _ in range(20)]
    result = run_jobs(app, client, timeout=60)
    assert callbacks == [280]
    assert result.job(group.then.id).state == State.COMPLETED and result.job(group.then.id).result == 1_000_000
    assert all(result.job(i).state == State.COMPLETED for i in others)
