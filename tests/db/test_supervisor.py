"""miniqueue-supervise as a real process tree on a real database: children are found with psutil
and killed for real."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
from psycopg import sql

from miniqueue import Client, JobSpec
from miniqueue.core.db import Connection
from miniqueue.store.migrate import run_migrations

from ..helpers import count, row, wait_until
from ..serving import run_miniqueue
from ..supervised import Fleet, StartSupervisor, Supervised, create_executions

APP = "tests.apps.supervised:app"


@pytest.fixture
def supervise(dsn: str, tmp_path: Path, repo_root: Path, executions: Connection) -> Iterator[StartSupervisor]:
    with Fleet(dsn, tmp_path, repo_root, APP) as fleet:
        yield fleet.start


def held_by(conn: Connection, job_id: int) -> int | None:
    """The pid of the worker process holding a running job."""
    leased_by = row(conn, job_id)["leased_by"]
    return int(leased_by.split(":")[1]) if leased_by else None


def handler_started(conn: Connection, job_id: int) -> bool:
    """The handler recorded its execution (claimed is not enough: a stop between the claim and
    the handler's start hands the job back unstarted)."""
    return conn.execute("SELECT 1 FROM executions WHERE job_id = %s", [job_id]).fetchone() is not None


def test_spawns_named_workers_and_a_reaper(supervise: StartSupervisor) -> None:
    sup = supervise(workers=3)
    sup.wait_ready(3)
    titles = sorted(sup.titles().values())
    assert titles == [
        "miniqueue reaper",
        "miniqueue worker-1 idle",
        "miniqueue worker-2 idle",
        "miniqueue worker-3 idle",
    ]
    assert " ".join(sup.process.cmdline()).strip() == "miniqueue supervisor"


def test_sigkill_a_worker_mid_job_then_the_job_is_rerun_as_attempt_2(
    supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    sup = supervise(workers=2)
    sup.wait_ready(2)
    job_id = client.enqueue("work", {"sleep_on": [1]}).id
    pid = wait_until(lambda: held_by(conn, job_id), what="job running")
    wait_until(lambda: f"job {job_id} work" in sup.titles().get(pid, ""), what="title shows the job")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: row(conn, job_id)["state"] == "completed", timeout=15, what="job completed after the kill")
    stored = row(conn, job_id)
    assert stored["attempt"] == 2
    # Released by the supervisor after waitpid (the reaper would say "worker lost" at lease expiry).
    assert stored["errors"][0]["error"] == f"worker process died: SIGKILL (pid {pid})"
    wait_until(lambda: len(sup.workers()) == 2 and pid not in sup.workers(), what="worker replaced")


def test_a_crashed_workers_job_waits_its_tasks_own_backoff(
    supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    """The supervisor, which has no app, charges the crash with the backoff the task's workers
    published, as the worker would have charged an exception."""
    sup = supervise(workers=1)
    sup.wait_ready(1)
    job_id = client.enqueue("patient", {"sleep_on": [1]}).id
    # Its handler running (a job killed before its handler starts goes back uncharged, at once).
    wait_until(lambda: handler_started(conn, job_id), what="handler running")
    pid = held_by(conn, job_id)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: row(conn, job_id)["state"] == "available", what="the crash charged")
    [waits] = conn.execute(
        "SELECT scheduled_at - now() > interval '2 seconds' FROM miniqueue_jobs WHERE id = %s", [job_id]
    ).fetchone() or [None]
    assert waits, "retried within the default backoff's 2 s, not the task's days"
    assert row(conn, job_id)["errors"][0]["error"] == f"worker process died: SIGKILL (pid {pid})"


def test_sigkill_the_reaper_then_it_is_replaced(supervise: StartSupervisor) -> None:
    sup = supervise(workers=1)
    sup.wait_ready(1)
    reaper = sup.reaper()
    assert reaper is not None
    os.kill(reaper, signal.SIGKILL)
    wait_until(lambda: sup.reaper() not in (None, reaper), what="a new reaper")
    assert "reaper" in sup.output() and "killed by SIGKILL" in sup.output()


def test_sigkill_the_supervisor_then_every_child_exits(supervise: StartSupervisor) -> None:
    sup = supervise(workers=2)
    sup.wait_ready(2)
    children = [psutil.Process(pid) for pid in sup.titles()]
    os.kill(sup.proc.pid, signal.SIGKILL)
    sup.proc.wait(5)

    def all_gone() -> bool:
        for child in children:
            try:
                if child.status() != psutil.STATUS_ZOMBIE:
                    return False
            except psutil.NoSuchProcess:
                continue
        return True

    wait_until(all_gone, timeout=10, what="children exit after the supervisor died")


def test_term_while_a_job_runs_completes_it_and_exits_0(
    supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    sup = supervise(workers=1)
    sup.wait_ready(1)
    job_id = client.enqueue("work", {"sleep_on": [1], "seconds": 1.5}).id
    wait_until(lambda: handler_started(conn, job_id), what="handler running")
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(20) == 0
    assert row(conn, job_id)["state"] == "completed"
    assert row(conn, job_id)["attempt"] == 1


def _saw_signals(sup: Supervised, count: int) -> bool:
    return sup.proc.poll() is not None or sup.output().count("received SIG") >= count


def interruptions(conn: Connection, job_id: int) -> list[str]:
    return [e["error"] for e in row(conn, job_id)["errors"] if e["error"].startswith("interrupted")]


@pytest.mark.parametrize("signals", [["SIGTERM"], ["SIGINT"], ["SIGQUIT"], ["SIGINT", "SIGINT"]])
@pytest.mark.parametrize("deaf", [True, False], ids=["ignores-stop", "honours-stop"])
def test_a_stop_interrupting_a_job_spends_no_attempt(
    supervise: StartSupervisor, client: Client, conn: Connection, signals: list[str], deaf: bool
) -> None:
    sup = supervise("--shutdown-timeout", "0.5", workers=1)
    sup.wait_ready(1)
    payload = {"sleep_on": [1], "seconds": 15, "deaf": deaf}
    job_id = client.enqueue("work", payload, max_attempts=1).id
    wait_until(lambda: handler_started(conn, job_id), what="handler running")
    for sent, name in enumerate(signals, 1):
        with contextlib.suppress(ProcessLookupError):  # (a stop honoured at once may have ended it)
            os.killpg(sup.proc.pid, getattr(signal, name))  # as a terminal's Ctrl-C reaches the whole group
        # Two signals sent at once may arrive as one (the OS does not queue them): a person's second
        # Ctrl-C comes after the first was seen.
        wait_until(functools.partial(_saw_signals, sup, sent), what=f"the supervisor saw {name}")
    assert sup.proc.wait(20) == 0
    stored = row(conn, job_id)
    assert (stored["state"], stored["attempt"], stored["max_attempts"]) == ("available", 1, 2)
    [note] = interruptions(conn, job_id)
    assert "the supervisor was asked to stop" in note and note.endswith("attempt not charged")
    if deaf or len(signals) == 1:  # (a job that honours the first Ctrl-C may be gone before the second)
        mode = "fast" if signals in (["SIGQUIT"], ["SIGINT", "SIGINT"]) else "graceful"  # a second Ctrl-C: fast
        assert f"the supervisor was asked to stop ({mode})" in note, note
    if deaf:  # still running when its worker ended: the note says for how long
        assert re.match(r"interrupted after \d+\.\ds: ", note), f"the note says how long the job ran: {note!r}"
    assert "died" not in (stored["last_error"] or "")


def test_hup_interrupting_a_job_spends_no_attempt_and_the_new_generation_runs_it(
    supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    sup = supervise("--shutdown-timeout", "0.5", workers=1)
    sup.wait_ready(1)
    job_id = client.enqueue("work", {"sleep_on": [1], "seconds": 15, "deaf": True}, max_attempts=1).id
    wait_until(lambda: handler_started(conn, job_id), what="handler running")
    sup.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: row(conn, job_id)["state"] == "completed", timeout=20, what="job completed after HUP")
    stored = row(conn, job_id)
    assert (stored["attempt"], stored["max_attempts"]) == (2, 2)
    [note] = interruptions(conn, job_id)
    assert "replaced by HUP" in note


def test_a_crash_charges_only_the_running_job_not_the_prefetched_ones(
    supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    sup = supervise("--prefetch", "10", workers=1)
    sup.wait_ready(1)
    with conn.transaction():  # one commit: the worker's first claim takes the crash and its bystanders
        crash = client.enqueue("segfault", priority=1, max_attempts=2, conn=conn).id
        bystanders = [client.enqueue("work", max_attempts=1, conn=conn).id for _ in range(10)]
    wait_until(lambda: row(conn, crash)["state"] == "dead", timeout=30, what="the crashing job dead")
    wait_until(lambda: count(conn, "state = 'completed'") == 10, timeout=30, what="every bystander completed")
    assert [e["error"].split(" (pid")[0] for e in row(conn, crash)["errors"]] == ["worker process died: SIGSEGV"] * 2
    handed_back = [e["error"] for i in bystanders for e in row(conn, i)["errors"]]
    assert handed_back, "the bystanders were held by the crashed worker"
    assert all(note.startswith("handed back: worker process died: SIGSEGV") for note in handed_back)
    assert all(note.endswith("attempt not charged") for note in handed_back)


def test_ttin_adds_and_ttou_removes_a_worker(supervise: StartSupervisor) -> None:
    sup = supervise(workers=2)
    sup.wait_ready(2)
    sup.proc.send_signal(signal.SIGTTIN)
    wait_until(lambda: len(sup.workers()) == 3, what="three workers")
    assert any("worker-3" in t for t in sup.titles().values())
    sup.proc.send_signal(signal.SIGTTOU)
    wait_until(lambda: len(sup.workers()) == 2, what="back to two workers")
    assert not any("worker-3" in t for t in sup.titles().values())


def test_hup_replaces_every_worker(supervise: StartSupervisor) -> None:
    sup = supervise(workers=2)
    sup.wait_ready(2)
    before = set(sup.workers())
    sup.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: len(sup.workers()) == 2 and not before & set(sup.workers()), what="a new generation")


@pytest.mark.parametrize(("task", "signame"), [("segfault", "SIGSEGV"), ("abort", "SIGABRT")])
def test_a_crashing_handler_goes_dead_at_max_attempts_with_the_signal_named(
    supervise: StartSupervisor, client: Client, conn: Connection, task: str, signame: str
) -> None:
    sup = supervise(workers=1)
    sup.wait_ready(1)
    job_id = client.enqueue(task, max_attempts=2).id
    wait_until(lambda: row(conn, job_id)["state"] == "dead", timeout=20, what="crashing job dead")
    stored = row(conn, job_id)
    assert [e["error"].split(" (pid")[0] for e in stored["errors"]] == [f"worker process died: {signame}"] * 2
    assert count(conn, "true") == 1
    ok = client.enqueue("work").id
    wait_until(lambda: row(conn, ok)["state"] == "completed", what="supervisor still healthy")


def test_a_worker_over_the_memory_limit_is_recycled(
    supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    sup = supervise("--max-memory-per-child", "150", workers=1)
    sup.wait_ready(1)
    first = sup.workers()[0]
    ids = [client.enqueue("hog", {"mb": 100}).id for _ in range(2)]
    wait_until(lambda: all(row(conn, i)["state"] == "completed" for i in ids), what="hogs completed")
    wait_until(lambda: (workers := sup.workers()) and workers[0] != first, what="worker recycled")
    assert "over --max-memory-per-child 150 MB" in sup.output()


def test_max_jobs_per_child_recycles_the_worker(supervise: StartSupervisor, client: Client, conn: Connection) -> None:
    sup = supervise("--max-jobs-per-child", "2", workers=1)
    sup.wait_ready(1)
    ids = [client.enqueue("work").id for _ in range(6)]
    wait_until(lambda: all(row(conn, i)["state"] == "completed" for i in ids), what="jobs completed")
    pids = {p for (p,) in conn.execute("SELECT DISTINCT pid FROM executions").fetchall()}
    assert len(pids) == 3
    assert all(row(conn, i)["attempt"] == 1 for i in ids)


def test_a_handler_past_its_hard_timeout_is_killed_and_charged(
    supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    sup = supervise(workers=1)
    sup.wait_ready(1)
    job_id = client.enqueue("stuck", max_attempts=1).id
    wait_until(lambda: row(conn, job_id)["state"] == "dead", timeout=20, what="stuck job dead")
    error = row(conn, job_id)["last_error"]
    assert error.startswith(f"worker process killed: job {job_id} (stuck) exceeded its 0.5s timeout")


@pytest.mark.parametrize("preload", [[], ["--preload"]], ids=["checked in a child", "preloaded"])
@pytest.mark.parametrize(
    ("app", "error"),
    [
        (
            "tests.apss.supervised:app",
            "Error: cannot import module 'tests.apss.supervised' for app "
            "'tests.apss.supervised:app': ModuleNotFoundError: No module named 'tests.apss'",
        ),
        (
            "tests.apps.broken:app",
            "Error: cannot import module 'tests.apps.broken' for app 'tests.apps.broken:app': "
            "RuntimeError: this app is broken on purpose (at ",
        ),
        (
            "tests.apps.supervised:ap",
            "Error: module 'tests.apps.supervised' has no attribute 'ap' (app 'tests.apps.supervised:ap')",
        ),
    ],
    ids=["a typo in the module", "a module that raises", "a typo in the attribute"],
)
def test_an_app_that_does_not_load_stops_the_supervisor_before_any_fork(
    supervise: StartSupervisor, app: str, error: str, preload: list[str]
) -> None:
    sup = supervise(*preload, app=app, workers=2)
    assert sup.proc.wait(30) == 2
    [line] = sup.output().splitlines()  # no child spawned, no traceback: the one line
    assert line.startswith(error), line


def test_a_broken_app_says_where_it_broke(supervise: StartSupervisor) -> None:
    sup = supervise(app="tests.apps.broken:app", workers=2)
    assert sup.proc.wait(30) == 2
    assert sup.output().rstrip().endswith("tests/apps/broken.py:3)")


def test_children_that_keep_failing_to_boot_stop_the_supervisor(supervise: StartSupervisor) -> None:
    sup = supervise(app="tests.apps.loads_only_in_the_check:app", workers=2)
    assert sup.proc.wait(30) == 3
    output = sup.output()
    assert "failed to boot 3 times in a row" in output
    assert re.search(r"this app fails in (worker-\d|reaper) on purpose", output), output


def test_a_stop_during_the_app_check_ends_it(supervise: StartSupervisor) -> None:
    sup = supervise(app="tests.apps.never_loads:app", workers=1)
    check = wait_until(
        lambda: [pid for pid, title in sup.titles().items() if "app-check" in title], what="the app check running"
    )
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(30) == 0
    assert not psutil.pid_exists(check[0]) or psutil.Process(check[0]).status() == psutil.STATUS_ZOMBIE
    assert "spawned" not in sup.output()


def test_two_supervisors_share_the_work_without_duplicates(
    supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    first, second = supervise(workers=1), supervise(workers=1)
    first.wait_ready(1)
    second.wait_ready(1)
    ids = [client.enqueue("work").id for _ in range(200)]
    wait_until(lambda: count(conn, "state = 'completed'") == 200, timeout=60, what="200 jobs completed")
    executed = conn.execute("SELECT job_id, count(*) FROM executions GROUP BY job_id").fetchall()
    assert sorted(job_id for job_id, _ in executed) == sorted(ids)
    assert all(n == 1 for _, n in executed)
    pids = {p for (p,) in conn.execute("SELECT DISTINCT pid FROM executions").fetchall()}
    assert pids <= set(first.workers()) | set(second.workers())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "0"], "Invalid value for '--workers': '0': run at least 1 worker process"),
        (["--lease-duration", "3", "--heartbeat-interval", "3"], "must be below the lease"),
        (["--workers", "500"], "needs 2503 connections"),
        (["--workers", "6", "--concurrency", "400"], "run at most"),
    ],
)
def test_bad_options_get_one_clear_line(dsn: str, args: list[str], message: str) -> None:
    result = run_miniqueue("supervise", "--app", APP, *args, dsn=dsn)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_prints_jobs_in_priority_order(dsn: str) -> None:
    result = run_miniqueue("demo", dsn=dsn, timeout=60)
    assert result.returncode == 0, result.stderr
    processed = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("processed")]
    assert processed == [
        "process_payment",
        "generate_thumbnail",
        "sync_inventory",
        "send_welcome_email",
        "send_notification",
    ]


@pytest.fixture
def workflow_executions(conn: Connection) -> Connection:
    create_executions(conn, "parents_done BOOLEAN")
    return conn


def test_sigkill_mid_workflow_releases_each_dependent_once_after_its_parents(
    dsn: str, tmp_path: Path, repo_root: Path, workflow_executions: Connection, client: Client
) -> None:
    conn = workflow_executions
    with Fleet(dsn, tmp_path, repo_root, "tests.apps.workflow:app") as fleet:
        sup = fleet.start(workers=2)
        sup.wait_ready(2)
        # The last member to finish is the slow one: its worker is killed while it runs, so the
        # member completes on a later attempt, and that completion releases the callback. The slow
        # jobs sleep on their second attempt too: the first kill may hand the chain's slow step
        # back unstarted (its attempt moves on), and it must still be running when its turn comes.
        slow_step = {"sleep_on": [1, 2], "seconds": 5}
        members = [JobSpec("step", {"value": 1}) for _ in range(5)] + [JobSpec("step", {"value": 1, **slow_step})]
        group = client.group(members, then=JobSpec("step", {"value": 100}))
        chain = client.chain(
            [
                JobSpec("step", {"value": 1}),
                JobSpec("step", {"value": 10, **slow_step}),
                JobSpec("step", {"value": 100}),
            ]
        )
        for slow in (group.members[-1].id, chain[1].id):
            pid = wait_until(lambda: handler_started(conn, slow) and held_by(conn, slow), what="slow job running")  # noqa: B023
            os.kill(pid, signal.SIGKILL)
        assert client.wait(group.then.id, timeout=60) == 106
        assert client.wait(chain[-1].id, timeout=60) == 111
    runs = conn.execute("SELECT job_id, count(*), bool_and(parents_done) FROM executions GROUP BY job_id").fetchall()
    by_job = {job_id: (n, done) for job_id, n, done in runs}
    # At least once, and every run beyond the first explained by a kill in the job's history: the
    # slow jobs were killed as they ran; a kill may also catch another job of the same worker (a
    # re-run of the first slow job, or a dependent whose handler had returned but whose outcome
    # was not yet recorded), which then runs again. A dependent is released once, after its
    # parents, and each of its runs sees them completed.
    for job_id in (group.members[-1].id, chain[1].id, group.then.id, chain[-1].id):
        history = [entry["error"] for entry in row(conn, job_id)["errors"]]
        kills = sum(e.startswith(("worker process died: SIGKILL", "handed back: worker process died")) for e in history)
        aimed_at = job_id in (group.members[-1].id, chain[1].id)
        assert (2 if aimed_at else 1) <= by_job[job_id][0] <= 1 + kills, (job_id, by_job[job_id], history)
    assert all(done for _, done in by_job.values())


def test_a_worker_that_dies_after_it_was_ready_has_its_cause_logged(
    dsn: str, tmp_path: Path, repo_root: Path, conn: Connection
) -> None:
    """A crash loop says why: the error a worker reported before it died reaches the log, not
    only its exit code."""
    schema = f"doomed_{uuid.uuid4().hex[:8]}"
    run_migrations(dsn, schema)
    fleet = Fleet(dsn, tmp_path, repo_root, APP)
    try:
        sup = fleet.start("--schema", schema, workers=1)
        sup.wait_ready(1)
        drop = sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema))  # under the worker's feet
        # The drop takes the tables' locks one by one while the worker's claim takes them too:
        # PostgreSQL may pick the drop as a deadlock's victim, which only means try again.
        wait_until(lambda: _without_deadlock(conn, drop), what="the schema dropped under the worker")
        cause = (
            r"worker-1 \(pid (\d+)\) exited with code 1\n.* worker-1 \(pid \1\) reported: "
            r"miniqueue\.SchemaOutOfDate: the miniqueue tables are missing"
        )
        wait_until(lambda: re.search(cause, sup.output()), what="the worker's own error in the supervisor's log")
    finally:
        fleet.stop_all()
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _without_deadlock(conn: Connection, statement: sql.Composed) -> bool:
    """Run ``statement``; False if PostgreSQL chose it as a deadlock's victim."""
    try:
        conn.execute(statement)
    except psycopg.errors.DeadlockDetected:
        return False
    return True
