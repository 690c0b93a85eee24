"""``Client.why`` and ``miniqueue jobs why``: each cause that holds a job back, made for real on a
real database (a worker's claim, a paused queue, a full limit, parents, a parked job...) and
named exactly: its sentence, with the database's times in it, and its facts."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from miniqueue import App, AsyncClient, Client, Job, State
from miniqueue.cli.main import main
from miniqueue.core.causes import when
from miniqueue.core.db import Connection
from miniqueue.core.diagnosis import Cause, CauseKind, Diagnosis
from miniqueue.core.records import ProcessInfo
from miniqueue.store.store import Store
from miniqueue.web import create_app

from ..helpers import expire_lease, row, wait_until
from ..running import StartWorker, worker_starter
from .test_async_client import using
from .test_web import on_localhost

WORKER = "host-1:4242:abc123"
SUPERVISOR = "host-1:4200"


@pytest.fixture
def start_worker(dsn: str) -> Iterator[StartWorker]:
    yield from worker_starter(dsn, lease_duration=10.0, heartbeat_seconds=2.0)


def serve(
    store: Store, conn: Connection, queue: str, *, seen_ago: float = 0.0, tasks: tuple[str, ...] | None = None
) -> None:
    """Queue ``queue`` served as under miniqueue-supervise: a worker published it as it started,
    and its supervisor registered the worker (last seen ``seen_ago`` seconds ago), with its queue
    and the tasks its app declares when ``tasks`` is given (as an older version's, without)."""
    store.publish_tasks(conn, [], [queue])
    now = store.now(conn)
    queues = None if tasks is None else (queue,)
    processes = [
        ProcessInfo(id=SUPERVISOR, kind="supervisor", pid=4200, title="miniqueue supervisor", started_at=now),
        ProcessInfo(
            id=WORKER, kind="worker", pid=4242, title="miniqueue 0 idle", started_at=now, queues=queues, tasks=tasks
        ),
    ]
    store.register_processes(conn, SUPERVISOR, "host-1", processes)
    if seen_ago:
        conn.execute("UPDATE miniqueue_processes SET last_seen = now() - make_interval(secs => %s)", [float(seen_ago)])


def only(diagnosis: Diagnosis, kind: CauseKind) -> Cause:
    """The one cause of ``kind`` (and that there is exactly one)."""
    found = [cause for cause in diagnosis.causes if cause.kind is kind]
    assert len(found) == 1, diagnosis.causes
    return found[0]


def claim(store: Store, conn: Connection, queue: str, worker: str = WORKER) -> tuple[int, int]:
    [lease] = store.claim(conn, [queue], worker, 30, 1)
    return lease.id, lease.attempt


# -- not run yet, and why ------------------------------------------------------------------------


def test_a_job_scheduled_for_later_says_when_by_the_database_clock(
    client: Client, store: Store, conn: Connection
) -> None:
    serve(store, conn, "mail")
    job_id = client.enqueue("send", queue="mail", delay=3600).id
    diagnosis = client.why(job_id)
    due = row(conn, job_id)["scheduled_at"]
    assert diagnosis.kinds == (CauseKind.SCHEDULED,)
    assert diagnosis.causes[0].message == (
        f"Job {job_id} is scheduled for later: it is due at {when(due, diagnosis.checked_at)}, by the database's clock."
    )
    assert when(due, diagnosis.checked_at).endswith("(in 1 h)")
    details = diagnosis.causes[0].details
    assert details["scheduled_at"] == due and details["reason"] == "run at"
    assert details["seconds"] == pytest.approx(3600, abs=5)
    assert (diagnosis.state, diagnosis.attempts, diagnosis.queue, diagnosis.task) == (
        State.AVAILABLE,
        "attempt 0 of 5",
        "mail",
        "send",
    )


def test_a_job_waiting_out_its_retry_delay_names_the_failed_run(client: Client, store: Store, conn: Connection) -> None:
    serve(store, conn, "mail")
    job_id = client.enqueue("send", queue="mail").id
    _, attempt = claim(store, conn, "mail")
    store.record_failure(conn, job_id, WORKER, attempt, "Traceback...\nTimeoutError: smtp", 600)
    diagnosis = client.why(job_id)
    due = row(conn, job_id)["scheduled_at"]
    cause = only(diagnosis, CauseKind.SCHEDULED)
    assert cause.message == (
        f"Job {job_id} waits out its retry delay after run 1 failed: it is due at "
        f"{when(due, diagnosis.checked_at)} (last error: TimeoutError: smtp)."
    )
    assert cause.details["reason"] == "retry" and diagnosis.attempts == "attempt 1 of 5"


def test_a_paused_queue_is_named_with_the_command_that_resumes_it(
    client: Client, store: Store, conn: Connection
) -> None:
    serve(store, conn, "mail")
    job_id = client.enqueue("send", queue="mail").id
    client.pause_queues(["mail"])
    diagnosis = client.why(job_id)
    changed = conn.execute("SELECT updated_at FROM miniqueue_queues WHERE name = 'mail'").fetchone()
    assert changed is not None
    assert diagnosis.kinds == (CauseKind.PAUSED,)
    assert diagnosis.causes[0].message == (
        f"Queue 'mail' is paused (its settings last changed at {when(changed[0], diagnosis.checked_at)}): "
        "no worker on any host claims its jobs until `miniqueue queues resume mail`."
    )
    assert diagnosis.causes[0].details == {"queue": "mail", "settings_changed_at": changed[0]}


def test_a_queue_no_worker_has_ever_served_is_named(client: Client, store: Store, conn: Connection) -> None:
    serve(store, conn, "mail")  # a live worker, of another queue
    job_id = client.enqueue("send", queue="typo").id
    diagnosis = client.why(job_id)
    assert diagnosis.kinds == (CauseKind.NO_WORKER,)
    assert diagnosis.causes[0].message == (
        "No worker has ever served queue 'typo': its jobs wait for nobody until a worker that serves it starts "
        "(a task's jobs go to the queue it declares; see docs/guides/tasks.md)."
    )
    assert diagnosis.causes[0].details["served_at"] is None


def test_a_queue_whose_workers_are_gone_says_when_one_was_last_seen(
    client: Client, store: Store, conn: Connection, start_worker: StartWorker
) -> None:
    app = App()

    @app.task("send", queue="mail")
    def send(job: Job) -> None: ...

    worker = start_worker(app)
    served = "SELECT 1 FROM miniqueue_served_queues WHERE queue = 'mail'"
    wait_until(lambda: conn.execute(served).fetchone(), what="the worker published its queue")
    worker.stop()
    serve(store, conn, "other", seen_ago=300)  # the registry's last worker: a supervisor gone 5 min ago
    conn.execute("UPDATE miniqueue_served_queues SET served_at = now() - interval '10 minutes' WHERE queue = 'mail'")
    job_id = client.enqueue("send").id

    def diagnosed() -> Diagnosis | None:  # the stopped worker's connections close on the server's time
        found = client.why(job_id)
        return found if found.kinds == (CauseKind.NO_WORKER,) else None

    diagnosis = wait_until(diagnosed, what="no worker connected")
    served_at = conn.execute("SELECT served_at FROM miniqueue_served_queues WHERE queue = 'mail'").fetchone()
    seen = conn.execute("SELECT last_seen FROM miniqueue_processes WHERE kind = 'worker'").fetchone()
    assert served_at is not None and seen is not None
    now = diagnosis.checked_at
    assert diagnosis.causes[0].message == (
        f"No live worker serves queue 'mail': a worker last started serving it at {when(served_at[0], now)}, and "
        f"none is connected to the database now (the process registry last saw one at {when(seen[0], now)})."
    )
    assert when(served_at[0], now).endswith("(10 min ago)") and when(seen[0], now).endswith("(5 min ago)")
    assert diagnosis.causes[0].details == {
        "queue": "mail",
        "served_at": served_at[0],
        "live_workers": 0,
        "worker_connections": 0,
        "worker_seen_at": seen[0],
    }


def test_a_queue_whose_workers_are_gone_is_named_while_workers_of_other_queues_are_live(
    client: Client, store: Store, conn: Connection
) -> None:
    serve(store, conn, "mail", tasks=("send",))
    serve(store, conn, "other", tasks=("send",))  # the registry's one live worker now serves "other" only
    conn.execute("UPDATE miniqueue_served_queues SET served_at = now() - interval '10 minutes' WHERE queue = 'mail'")
    job_id = client.enqueue("send", queue="mail").id
    diagnosis = client.why(job_id)
    assert diagnosis.kinds == (CauseKind.NO_WORKER,)
    served_at = conn.execute("SELECT served_at FROM miniqueue_served_queues WHERE queue = 'mail'").fetchone()
    assert served_at is not None
    assert diagnosis.causes[0].message == (
        f"No live worker serves queue 'mail': a worker last started serving it at "
        f"{when(served_at[0], diagnosis.checked_at)}, and the process registry's 1 live worker serves other "
        "queues only."
    )


def test_a_task_the_live_workers_of_its_queue_do_not_declare_is_named(
    client: Client, store: Store, conn: Connection
) -> None:
    serve(store, conn, "shared", tasks=("a1", "a2"))
    job_id = client.enqueue("b1", queue="shared").id
    diagnosis = client.why(job_id)
    cause = only(diagnosis, CauseKind.NO_HANDLER)
    assert cause.message == (
        "No live worker runs task 'b1': the 1 live worker of queue 'shared' declares 'a1', 'a2', and each that claims "
        "the job hands it back without spending an attempt; start a worker whose app declares the task (another "
        "app's, on a shared queue?)."
    )
    assert cause.details == {"queue": "shared", "task": "b1", "queue_workers": 1, "tasks": ["a1", "a2"]}
    assert client.why(client.enqueue("a1", queue="shared").id).kinds == (CauseKind.DUE,)


def test_a_full_concurrency_limit_names_the_jobs_holding_it(client: Client, store: Store, conn: Connection) -> None:
    serve(store, conn, "img")
    first = client.enqueue("resize", queue="img", concurrency_key="album-7", max_concurrent=1).id
    second = client.enqueue("resize", queue="img", concurrency_key="album-7", max_concurrent=1).id
    assert claim(store, conn, "img")[0] == first
    diagnosis = client.why(second)
    assert diagnosis.kinds == (CauseKind.CONCURRENCY_LIMIT,)
    assert diagnosis.causes[0].message == (
        f"Concurrency limit 'concurrency resize album-7' is full: 1 of 1 slot, held by job {first}."
    )
    assert diagnosis.causes[0].details == {
        "scope": "concurrency resize album-7",
        "max_running": 1,
        "holders": [first],
    }


def test_a_queue_at_its_cap_names_the_jobs_holding_its_slots(client: Client, store: Store, conn: Connection) -> None:
    serve(store, conn, "img")
    first = client.enqueue("resize", queue="img", priority=1).id
    second = client.enqueue("resize", queue="img").id
    client.limit_queue("img", 1)
    assert claim(store, conn, "img")[0] == first
    diagnosis = client.why(second)
    assert diagnosis.kinds == (CauseKind.QUEUE_CAP,)
    assert diagnosis.causes[0].message == f"Queue 'img' is at its cap of 1 running job, held by job {first}."
    assert diagnosis.causes[0].details == {
        "queue": "img",
        "scope": "queue img",
        "max_running": 1,
        "holders": [first],
    }


def test_a_rate_limit_says_when_its_next_token_comes(client: Client, store: Store, conn: Connection) -> None:
    serve(store, conn, "api")
    first = client.enqueue("call", queue="api", rate_limit="1/h").id
    second = client.enqueue("call", queue="api", rate_limit="1/h").id
    assert claim(store, conn, "api")[0] == first
    diagnosis = client.why(second)
    cause = only(diagnosis, CauseKind.RATE_LIMIT)
    assert diagnosis.kinds == (CauseKind.RATE_LIMIT,)
    next_token = cause.details["next_token_at"]
    assert cause.message == (
        f"Rate limit 'rate call' (1 per hour) has no token for job {second} until "
        f"{when(next_token, diagnosis.checked_at)}."
    )
    assert (next_token - diagnosis.checked_at).total_seconds() == pytest.approx(3600, abs=5)
    assert cause.details["scope"] == "rate call" and cause.details["rate"] == pytest.approx(1 / 3600)
    assert cause.details["tokens"] < 0.01


def test_a_job_waiting_for_parents_names_those_not_done(client: Client, store: Store, conn: Connection) -> None:
    serve(store, conn, "etl")
    done = client.enqueue("extract", queue="etl", priority=1).id
    running = client.enqueue("extract", queue="etl").id
    child = client.enqueue("load", queue="etl", depends_on=[done, running]).id
    job_id, attempt = claim(store, conn, "etl")
    store.complete(conn, job_id, WORKER, attempt)
    assert claim(store, conn, "etl")[0] == running
    diagnosis = client.why(child)
    assert diagnosis.kinds == (CauseKind.PARENTS,)
    assert diagnosis.causes[0].message == (
        f"Job {child} waits for 1 of its 2 parents to complete: job {running} (extract, running)."
    )
    assert diagnosis.causes[0].details == {
        "pending": 1,
        "total": 2,
        "run_when": None,
        "parents": [{"id": running, "task": "extract", "state": "running"}],
    }


def test_a_parked_job_names_its_signal_and_timeout(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()

    @app.task("approve")
    def approve(job: Job) -> Any:
        return job.wait_for(f"approval:{job.id}", timeout=3600, name="approval")

    job_id = app.enqueue(client, "approve").id
    start_worker(app)  # stays connected: a live worker
    wait_until(lambda: row(conn, job_id)["state"] == "waiting", what="parked")
    diagnosis = client.why(job_id)
    timeout = row(conn, job_id)["signal_timeout_at"]
    assert diagnosis.kinds == (CauseKind.SIGNAL,)
    assert diagnosis.causes[0].message == (
        f"Job {job_id} is parked until signal 'approval:{job_id}' comes (step 'approval'), with no worker and no "
        f"lease; it times out at {when(timeout, diagnosis.checked_at)}. `miniqueue signal approval:{job_id}` sends it."
    )
    assert diagnosis.causes[0].details == {"key": f"approval:{job_id}", "step": "approval", "timeout_at": timeout}


def test_a_durable_sleep_says_until_when(client: Client, conn: Connection, start_worker: StartWorker) -> None:
    app = App()

    @app.task("nap")
    def nap(job: Job) -> None:
        job.sleep(3600, name="cool-down")

    job_id = app.enqueue(client, "nap").id
    start_worker(app)
    wait_until(lambda: (r := row(conn, job_id))["state"] == "available" and r["steps"], what="asleep")
    diagnosis = client.why(job_id)
    until = row(conn, job_id)["scheduled_at"]
    assert diagnosis.kinds == (CauseKind.SLEEP,)
    assert diagnosis.causes[0].message == (
        f"Job {job_id} sleeps (durable sleep 'cool-down') until {when(until, diagnosis.checked_at)}, "
        "with no worker and no lease."
    )
    assert diagnosis.causes[0].details == {"step": "cool-down", "until": until}


def test_a_job_waiting_its_turn_names_the_job_holding_its_sequence(
    client: Client, store: Store, conn: Connection
) -> None:
    serve(store, conn, "albums")
    head = client.enqueue("reorder", queue="albums", sequence_key="album:7").id
    middle = client.enqueue("reorder", queue="albums", sequence_key="album:7").id
    last = client.enqueue("reorder", queue="albums", sequence_key="album:7").id
    assert claim(store, conn, "albums")[0] == head
    diagnosis = client.why(last)
    assert diagnosis.kinds == (CauseKind.SEQUENCE_TURN,)
    assert diagnosis.causes[0].message == (
        f"Job {last} waits its turn in sequence 'album:7': job {head} (reorder, running) holds it, "
        "and 1 job waits ahead of it."
    )
    assert diagnosis.causes[0].details == {
        "key": "album:7",
        "head": head,
        "head_state": "running",
        "head_error": None,
        "ahead": 1,
    }
    assert only(client.why(middle), CauseKind.SEQUENCE_TURN).details["ahead"] == 0


def test_a_failed_job_blocking_a_sequence_is_named_with_the_release(
    client: Client, store: Store, conn: Connection
) -> None:
    serve(store, conn, "albums")
    head = client.enqueue("reorder", queue="albums", sequence_key="album:7").id
    behind = client.enqueue("reorder", queue="albums", sequence_key="album:7").id
    job_id, attempt = claim(store, conn, "albums")
    store.fail(conn, job_id, WORKER, attempt, "Traceback...\nValueError: no such album")
    diagnosis = client.why(behind)
    assert diagnosis.kinds == (CauseKind.SEQUENCE_BLOCKED,)
    assert diagnosis.causes[0].message == (
        f"Sequence 'album:7' is blocked by job {head} (reorder), which ended failed; last error: ValueError: no "
        f"such album. Release the key with `miniqueue sequences release album:7`, or requeue, cancel or delete "
        f"job {head}; no job waits ahead of job {behind}."
    )
    assert diagnosis.causes[0].details["head"] == head and diagnosis.causes[0].details["head_state"] == "failed"


def test_a_job_past_its_deadline_will_never_run(client: Client, store: Store, conn: Connection) -> None:
    serve(store, conn, "mail")
    job_id = client.enqueue("send", queue="mail", expires_in=0.2).id
    expires_at = row(conn, job_id)["expires_at"]

    def passed() -> Diagnosis | None:
        found = client.why(job_id)
        return found if found.kinds == (CauseKind.DEADLINE_PASSED,) else None

    diagnosis = wait_until(passed, what="the deadline passed")
    assert diagnosis.causes[0].message == (
        f"Job {job_id} will never run: its deadline passed at {when(expires_at, diagnosis.checked_at)} before a "
        "worker claimed it, and the reaper marks it expired at its next pass."
    )


def test_causes_come_most_decisive_first(client: Client, store: Store, conn: Connection) -> None:
    job_id = client.enqueue("send", queue="cold", delay=60).id
    client.pause_queues(["cold"])
    assert client.why(job_id).kinds == (CauseKind.PAUSED, CauseKind.NO_WORKER, CauseKind.SCHEDULED)


def test_a_due_job_held_back_by_nothing_counts_the_jobs_ahead(client: Client, store: Store, conn: Connection) -> None:
    serve(store, conn, "mail")
    client.enqueue("send", queue="mail", priority=5)  # ahead: a higher priority
    client.enqueue("send", queue="mail", concurrency_key="k", priority=5)  # ahead, through the limited jobs' index
    client.enqueue("send", queue="mail")  # ahead: its priority, scheduled first
    client.enqueue("send", queue="mail", priority=-1)  # behind
    client.enqueue("send", queue="mail", priority=9, delay=60)  # not due
    job_id = client.enqueue("send", queue="mail").id
    client.enqueue("send", queue="mail")  # behind: its priority, scheduled after
    diagnosis = client.why(job_id)
    due = row(conn, job_id)["scheduled_at"]
    assert diagnosis.kinds == (CauseKind.DUE,)
    assert diagnosis.causes[0].message == (
        f"Nothing holds job {job_id} back: it has been due since {when(due, diagnosis.checked_at)} and runs when a "
        "worker of queue 'mail' has a free slot; 3 due jobs are ahead of it in the claim's order."
    )
    assert diagnosis.causes[0].details == {"due_since": due, "ahead": 3, "ahead_capped": False}


# -- running, and finished -----------------------------------------------------------------------


def test_a_running_job_says_where_and_until_when(client: Client, store: Store, conn: Connection) -> None:
    serve(store, conn, "mail")
    job_id = client.enqueue("send", queue="mail").id
    claim(store, conn, "mail")
    diagnosis = client.why(job_id)
    lease = row(conn, job_id)["lease_expires_at"]
    assert diagnosis.kinds == (CauseKind.RUNNING,)
    assert diagnosis.causes[0].message == (
        f"Job {job_id} is running: attempt 1 of 5 on worker {WORKER}, its lease renewed until "
        f"{when(lease, diagnosis.checked_at)}."
    )
    assert diagnosis.causes[0].details["worker"] == WORKER and diagnosis.causes[0].details["worker_seen_at"]


def test_a_job_leased_by_a_dead_worker_says_who_and_when_it_is_recovered(
    client: Client, store: Store, conn: Connection
) -> None:
    job_id = client.enqueue("send", queue="mail").id
    claim(store, conn, "mail", worker="gone-host:99:dead01")
    expire_lease(conn, job_id)
    diagnosis = client.why(job_id)
    expired = row(conn, job_id)["lease_expires_at"]
    recover_by = expired + dt.timedelta(seconds=5)
    now = diagnosis.checked_at
    assert diagnosis.kinds == (CauseKind.LEASE_EXPIRED,)
    assert diagnosis.causes[0].message == (
        f"Job {job_id} is leased by a process that stopped renewing it: worker gone-host:99:dead01 took attempt 1, "
        f"and its lease expired at {when(expired, now)}; it is not in the registry. Its supervisor hands a dead "
        "worker's jobs back as it reaps it, else the reaper recovers the lease at its next pass: by "
        f"{when(recover_by, now)} (the lease's expiry plus the reaper's interval, 5 s by default)."
    )
    assert diagnosis.causes[0].details["recover_by"] == recover_by and not diagnosis.causes[0].details["overdue"]

    conn.execute("UPDATE miniqueue_jobs SET lease_expires_at = now() - interval '1 minute' WHERE id = %s", [job_id])
    overdue = only(client.why(job_id), CauseKind.LEASE_EXPIRED)
    assert overdue.details["overdue"] and overdue.details["live_reapers"] == 0
    assert overdue.message.endswith(
        "That pass is overdue: no reaper is registered; start miniqueue-supervise, or run a Reaper."
    )


def test_a_finished_job_says_so_plainly(client: Client, store: Store, conn: Connection) -> None:
    completed = client.enqueue("send", queue="mail").id
    job_id, attempt = claim(store, conn, "mail")
    store.complete(conn, job_id, WORKER, attempt)
    dead = client.enqueue("send", queue="mail", max_attempts=1).id
    job_id, attempt = claim(store, conn, "mail")
    store.record_failure(conn, job_id, WORKER, attempt, "Traceback...\nKeyError: 'to'", 0)

    done = client.why(completed)
    finished_at = row(conn, completed)["finished_at"]
    assert done.kinds == (CauseKind.FINISHED,) and done.state is State.COMPLETED
    assert done.causes[0].message == (
        f"Job {completed} ran: it completed at {when(finished_at, done.checked_at)}, attempt 1 of 5."
    )
    died = client.why(dead)
    assert died.causes[0].message == (
        f"Job {dead} ran out of attempts: it died at {when(row(conn, dead)['finished_at'], died.checked_at)}, "
        f"attempt 1 of 1; last error: KeyError: 'to'. `miniqueue requeue {dead}` makes it available again."
    )
    assert died.causes[0].details["state"] == "dead" and died.causes[0].details["attempt"] == 1


def test_the_async_client_gives_the_same_diagnosis(dsn: str, client: Client, store: Store, conn: Connection) -> None:
    serve(store, conn, "mail")
    job_id = client.enqueue("send", queue="mail", delay=60).id

    async def diagnose(aclient: AsyncClient) -> Diagnosis:
        return await aclient.why(job_id)

    found, known = using(dsn, diagnose), client.why(job_id)
    assert found.kinds == known.kinds == (CauseKind.SCHEDULED,)
    assert found.causes[0].details["scheduled_at"] == known.causes[0].details["scheduled_at"]
    assert found.attempts == known.attempts and found.state is known.state


# -- the command line and the dashboard ------------------------------------------------------------


def cli(dsn: str, *args: str) -> Any:
    return CliRunner().invoke(main, ["jobs", "why", *args, "--database-url", dsn], env={"DATABASE_URL": None})


def test_the_command_prints_each_cause_and_json(dsn: str, client: Client, store: Store, conn: Connection) -> None:
    serve(store, conn, "mail")
    job_id = client.enqueue("send", queue="mail").id
    client.pause_queues(["mail"])
    expected = client.why(job_id)

    text = cli(dsn, str(job_id))
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    assert lines[0] == f"job {job_id} (send, queue mail): available, attempt 0 of 5"
    assert lines[1].startswith("- Queue 'mail' is paused (its settings last changed at ")
    assert lines[1].endswith("no worker on any host claims its jobs until `miniqueue queues resume mail`.")

    as_json = cli(dsn, str(job_id), "--json")
    assert as_json.exit_code == 0, as_json.output
    found = json.loads(as_json.output)
    assert found["job_id"] == job_id and found["state"] == "available" and found["attempts"] == "attempt 0 of 5"
    assert [c["kind"] for c in found["causes"]] == ["paused"]
    assert found["causes"][0]["details"] == {
        "queue": "mail",
        "settings_changed_at": expected.causes[0].details["settings_changed_at"].isoformat(),
    }
    assert found["causes"][0]["message"].startswith("Queue 'mail' is paused (its settings last changed at ")


def test_the_command_names_an_unknown_job(dsn: str) -> None:
    missing = cli(dsn, "999999")
    assert missing.exit_code == 1 and missing.output == "Error: job 999999 does not exist\n"
    invalid = cli(dsn, "0")
    assert invalid.exit_code == 2 and "0 is not in the range" in invalid.output


def test_the_job_page_shows_the_diagnosis(client: Client, store: Store, conn: Connection) -> None:
    serve(store, conn, "img")
    holder = client.enqueue("resize", queue="img", concurrency_key="a & b").id
    waiting = client.enqueue("resize", queue="img", concurrency_key="a & b").id
    claim(store, conn, "img")
    with on_localhost(create_app(client)) as web:
        html = web.get(f"/jobs/{waiting}").text
        running = web.get(f"/jobs/{holder}?partial=1").text
    assert '<h2 id="why-heading">Why it has not run</h2>' in html
    assert (
        '<li class="cause cause-concurrency_limit">Concurrency limit &#39;concurrency resize a &amp; b&#39; is full: '
        f"1 of 1 slot, held by job {holder}.</li>"
    ) in html
    assert '<h2 id="why-heading">Where it stands</h2>' in running and "cause-running" in running


def test_when_says_how_far_a_time_is() -> None:
    now = dt.datetime(2026, 1, 2, 9, 30, tzinfo=dt.timezone.utc)
    assert when(now, now) == "2026-01-02 09:30:00 UTC (now)"
    assert when(now + dt.timedelta(seconds=200), now) == "2026-01-02 09:33:20 UTC (in 3 min 20 s)"
    assert when(now - dt.timedelta(hours=2, minutes=5), now) == "2026-01-02 07:25:00 UTC (2 h 5 min ago)"
    assert when(now + dt.timedelta(days=3, hours=4), now).endswith("(in 3 d 4 h)")
