"""The dashboard's routes and actions against a real PostgreSQL, through Starlette's TestClient."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Mount
from starlette.testclient import TestClient
from starlette.types import ASGIApp

from miniqueue import App, Client, ConfigError, JobSpec, State
from miniqueue.core.db import Connection
from miniqueue.core.records import ProcessInfo
from miniqueue.store.store import Store
from miniqueue.web import create_app, redact_keys

from ..helpers import count, row
from ..serving import read_only_dashboard

WORKER = "web-7:4242:abc123"
OTHER_WORKER = "web-8:77:ffee01"
AUDIT = "miniqueue.web.audit"


def on_localhost(asgi: ASGIApp) -> TestClient:
    """A browser on this machine: its requests name localhost in Host, as the dashboard expects."""
    return TestClient(asgi, base_url="http://localhost")


@pytest.fixture
def web(client: Client) -> Iterator[TestClient]:
    with on_localhost(create_app(client)) as test_client:
        yield test_client


def traceback_of(error: str) -> str:
    return f'Traceback (most recent call last):\n  File "tasks.py", line 3, in send_email\n{error}'


def dead_job(
    client: Client,
    store: Store,
    conn: Connection,
    *errors: str,
    queue: str = "emails",
    payload: Any = None,
    workers: tuple[str, ...] = (WORKER,),
) -> int:
    """A job that failed once per error (each on the next of ``workers``) and is now dead."""
    payload = payload if payload is not None else {"to": "ada@example.com"}
    job_id = client.enqueue("send_email", payload, queue=queue, priority=1000, max_attempts=len(errors)).id
    for i, error in enumerate(errors):
        worker = workers[i % len(workers)]
        [lease] = store.claim(conn, [queue], worker, 30, 1)
        assert lease.id == job_id
        store.record_failure(conn, job_id, worker, lease.attempt, traceback_of(error), 0)
    assert row(conn, job_id)["state"] == "dead"
    return job_id


def completed_job(client: Client, store: Store, conn: Connection, queue: str = "reports") -> int:
    job_id = client.enqueue("build_report", {"month": 5}, queue=queue, priority=1000).id
    [lease] = store.claim(conn, [queue], WORKER, 30, 1)
    store.complete(conn, lease.id, WORKER, lease.attempt)
    return job_id


def token(web: TestClient) -> str:
    """The CSRF token of the browser session (the cookie the first page set)."""
    if "miniqueue_csrf" not in web.cookies:
        web.get("/")
    value: str | None = web.cookies.get("miniqueue_csrf")
    assert value
    return value


def post(web: TestClient, path: str, **fields: Any) -> httpx2.Response:
    response: httpx2.Response = web.post(path, data={"csrf_token": token(web), **fields}, follow_redirects=False)
    return response


def listed(html: str) -> list[int]:
    """The job ids a jobs page lists, in order."""
    return [int(i) for i in re.findall(r'<td class="num"><a href="[^"]*/jobs/(\d+)">', html)]


def audit_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == AUDIT]


# -- pages ----------------------------------------------------------------------------------------


def test_overview_shows_counts_oldest_wait_throughput_and_paused_queues(
    web: TestClient, client: Client, store: Store, conn: Connection
) -> None:
    dead_job(client, store, conn, "ValueError: boom")
    completed_job(client, store, conn)
    completed_job(client, store, conn)
    client.enqueue("send_email", queue="emails")
    client.enqueue("send_email", queue="emails", delay=3600)
    conn.execute(
        "UPDATE miniqueue_jobs SET scheduled_at = now() - interval '125 seconds' WHERE state = 'available' "
        "AND scheduled_at <= now()"
    )
    store.set_queue_paused(conn, "emails", True)

    html = web.get("/").text
    assert "2 jobs completed and 1 failed or dead in the last hour" in html
    emails = html[html.index(">emails</a>") :].split("</tr>")[0]
    assert 'class="badge paused"' in emails
    cells = re.findall(r'<td class="num[^"]*">(?:<a [^>]*>)?(?:<span class="muted">)?([^<]+)<', emails)
    # available, of which later, running, completed, failed, dead, cancelled, waiting (for parents), expired,
    # oldest waiting, expired leases
    assert cells[:9] == ["2", "1", "0", "0", "0", "1", "0", "0", "0"]
    assert cells[9].startswith("2m 0") and cells[10] == "0"
    assert "/jobs?queue=emails&amp;state=dead" in emails
    fragment = web.get("/?partial=1").text
    assert "<html" not in fragment and "Finished per minute" in fragment


def test_overview_marks_a_queue_where_jobs_wait_that_no_worker_has_served(
    web: TestClient, client: Client, store: Store, conn: Connection
) -> None:
    client.enqueue_many([JobSpec("send_email", queue="emails"), JobSpec("send_email", queue="emails", delay=60)])
    client.enqueue("build_report", queue="reports")
    store.publish_tasks(conn, [], ["reports"])  # what a worker serving "reports" records as it starts
    completed_job(client, store, conn, queue="archive")  # no worker either, but nothing waits there

    def row_of(html: str, queue: str) -> str:
        return html[html.index(f">{queue}</a>") :].split("</tr>")[0]

    for html in (web.get("/").text, web.get("/?partial=1").text):
        assert 'class="badge unserved"' in row_of(html, "emails")
        assert "unserved" not in row_of(html, "reports") and "unserved" not in row_of(html, "archive")
        assert re.findall(r"No worker has ever served queue <strong>(\w+)</strong>, where (\d+) job", html) == [
            ("emails", "2")
        ]
    store.publish_tasks(conn, [], ["emails"])
    assert "unserved" not in web.get("/").text


def test_jobs_filter_by_state_queue_task_payload_and_time(
    web: TestClient, client: Client, store: Store, conn: Connection
) -> None:
    dead = dead_job(client, store, conn, "ValueError: boom", payload={"to": "grace@example.com"})
    first = client.enqueue("send_email", {"to": "ada@example.com"}, queue="emails").id
    middle = store.now(conn)
    second = client.enqueue("resize", {"image": "cat.png"}, queue="images").id
    third = client.enqueue("resize", {"image": "dog.png"}, queue="images").id

    assert listed(web.get("/jobs").text) == [third, second, first, dead]
    assert listed(web.get("/jobs", params={"state": "dead"}).text) == [dead]
    assert listed(web.get("/jobs", params={"queue": "images"}).text) == [third, second]
    assert listed(web.get("/jobs", params={"task": "send_email", "state": "available"}).text) == [first]
    assert listed(web.get("/jobs", params={"q": "dog.png"}).text) == [third]
    assert listed(web.get("/jobs", params={"from": middle.isoformat()}).text) == [third, second]
    assert listed(web.get("/jobs", params={"to": middle.isoformat()}).text) == [first, dead]
    page = web.get("/jobs", params={"queue": "images", "q": "dog"}).text
    assert 'value="images"' in page and 'value="dog"' in page  # the form shows the filter back
    assert listed(web.get("/jobs", params={"queue": "images", "partial": "1"}).text) == [third, second]


def test_jobs_pages_by_keyset(web: TestClient, client: Client) -> None:
    from miniqueue import JobSpec

    ids = [r.id for r in client.enqueue_many([JobSpec("resize", {"n": i}, queue="images") for i in range(120)])]
    newest_first = sorted(ids, reverse=True)

    first = web.get("/jobs", params={"queue": "images"}).text
    assert listed(first) == newest_first[:50]
    older = re.search(r'href="(/jobs\?[^"]*before_id=(\d+))" rel="next"', first)
    assert older and int(older[2]) == newest_first[49]
    second = web.get(older[1].replace("&amp;", "&")).text
    assert listed(second) == newest_first[50:100] and "« Newest" in second
    older = re.search(r'href="(/jobs\?[^"]*)" rel="next"', second)
    assert older
    third = web.get(older[1].replace("&amp;", "&")).text
    assert listed(third) == newest_first[100:] and 'rel="next"' not in third


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"state": "bogus"}, "state &#39;bogus&#39; is invalid"),
        ({"from": "yesterday"}, "time &#39;yesterday&#39; in filter &#39;from&#39; is invalid"),
        ({"before_id": "12abc"}, "before_id &#39;12abc&#39; is invalid"),
    ],
)
def test_bad_filters_are_a_400_naming_the_value(web: TestClient, params: dict[str, str], message: str) -> None:
    response = web.get("/jobs", params=params)
    assert response.status_code == 400 and message in response.text


def test_job_detail_shows_redacted_payload_errors_workers_and_timeline(
    client: Client, store: Store, conn: Connection
) -> None:
    payload = {"to": "ada@example.com", "smtp": {"password": "hunter2"}}
    job_id = dead_job(
        client, store, conn, "ValueError: first", "KeyError: 'second'", payload=payload, workers=(WORKER, OTHER_WORKER)
    )
    with on_localhost(create_app(client, redact=redact_keys(["password"]))) as web:
        html = web.get(f"/jobs/{job_id}").text
    assert "ada@example.com" in html and "hunter2" not in html and "••••••" in html
    assert "ValueError: first" in html and "KeyError: &#39;second&#39;" in html
    assert html.count("Traceback (most recent call last)") == 2
    assert '<span class="host">web-7</span> pid <span class="pid">4242</span>' in html
    assert '<span class="host">web-8</span> pid <span class="pid">77</span>' in html
    labels = re.findall(r'<span class="event-label">([^<]+)</span>', html)
    assert labels == [
        "Created",
        "Attempt 1 started",
        "Attempt 1 failed",
        "Scheduled",
        "Attempt 2 started",
        "Attempt 2 failed",
        "Dead",
    ]
    assert "attempts exhausted (2 of 2)" in html
    assert f'action="/jobs/{job_id}/requeue"' in html and f'action="/jobs/{job_id}/cancel"' not in html


def test_a_missing_job_is_a_404(web: TestClient) -> None:
    response = web.get("/jobs/424242")
    assert response.status_code == 404 and "job 424242 does not exist" in response.text


def test_ids_out_of_range_or_not_ascii_digits_are_a_400(web: TestClient) -> None:
    assert web.get("/jobs/99999999999999999999").status_code == 400
    assert web.get("/jobs", params={"before_id": "9" * 20}).status_code == 400
    assert web.get("/jobs/confirm", params={"action": "cancel", "ids": "\u00b2"}).status_code == 400
    assert post(web, "/jobs/action", action="cancel", ids="1", expected="\u00b2").status_code == 400
    assert web.get("/jobs", params={"done": "requeue", "n": "\u00b2"}).status_code == 200


def test_workers_page_shows_the_process_registry(web: TestClient, store: Store, conn: Connection) -> None:
    now = store.now(conn)
    supervisor = "web-7:4200"
    store.register_processes(
        conn,
        supervisor,
        "web-7",
        [
            ProcessInfo(
                id=supervisor,
                kind="supervisor",
                pid=4200,
                title="miniqueue-supervise: 2 workers",
                started_at=now,
                rss_bytes=30 * 1024 * 1024,
            ),
            ProcessInfo(
                id=WORKER,
                kind="worker",
                pid=4242,
                title="miniqueue worker: busy",
                started_at=now,
                rss_bytes=50 * 1024 * 1024,
                jobs_done=17,
                restarts=2,
                current_jobs=(991,),
            ),
        ],
    )
    html = web.get("/workers").text
    assert "miniqueue-supervise: 2 workers" in html and "miniqueue worker: busy" in html
    worker_row = html[html.index("miniqueue worker: busy") :].split("</tr>")[0]
    assert '<a href="/jobs/991">991</a>' in worker_row and "50.0 MiB" in worker_row
    assert '<td class="num">17</td>' in worker_row and '<td class="num warn">2</td>' in worker_row
    assert "<h2" in html and "web-7" in html
    assert "4242" in web.get("/workers?partial=1").text


# -- actions on jobs --------------------------------------------------------------------------------


def test_requeue_one_job_writes_an_audit_line(
    web: TestClient, client: Client, store: Store, conn: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = dead_job(client, store, conn, "ValueError: boom")
    caplog.set_level(logging.INFO, logger=AUDIT)
    response = post(web, f"/jobs/{job_id}/requeue")
    assert response.status_code == 303 and response.headers["location"] == f"/jobs/{job_id}?done=requeue&n=1"
    assert row(conn, job_id)["state"] == "available"
    assert audit_lines(caplog) == [f"user=anonymous@testclient action=requeue ids={job_id} count=1 outcome=ok"]
    assert "Requeued 1 job(s)." in web.get(response.headers["location"]).text


def test_cancel_one_job_and_a_refused_action(
    web: TestClient, client: Client, store: Store, conn: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    waiting = client.enqueue("send_email", queue="emails").id
    done = completed_job(client, store, conn)
    caplog.set_level(logging.INFO, logger=AUDIT)
    assert post(web, f"/jobs/{waiting}/cancel").status_code == 303
    assert row(conn, waiting)["state"] == "cancelled"
    refused = post(web, f"/jobs/{done}/cancel")
    assert refused.status_code == 409 and f"cannot cancel job {done}: it is completed" in refused.text
    assert row(conn, done)["state"] == "completed"
    assert post(web, f"/jobs/{done}/explode").status_code == 400
    lines = audit_lines(caplog)
    assert lines[0] == f"user=anonymous@testclient action=cancel ids={waiting} count=1 outcome=ok"
    assert lines[1].startswith(f"user=anonymous@testclient action=cancel ids={done} count=0 outcome=refused: ")


def test_delete_one_job_after_a_confirmation(web: TestClient, client: Client, store: Store, conn: Connection) -> None:
    job_id = dead_job(client, store, conn, "ValueError: boom")
    page = web.get("/jobs/confirm", params={"action": "delete", "ids": job_id}).text
    assert "Delete 1 job?" in page and "gone for good" in page
    assert count(conn) == 1  # looking at the confirmation changes nothing
    response = post(web, "/jobs/action", action="delete", ids=str(job_id), expected="1")
    assert response.headers["location"] == "/jobs?done=delete&n=1"
    assert count(conn) == 0


def test_act_on_a_selection_counts_only_the_jobs_it_applies_to(
    web: TestClient, client: Client, store: Store, conn: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    dead = [dead_job(client, store, conn, "ValueError: boom") for _ in range(2)]
    done = completed_job(client, store, conn)
    selection: dict[str, str | list[int]] = {"action": "requeue", "ids": [*dead, done], "state": "dead"}
    page = web.get("/jobs/confirm", params=selection).text
    assert "Requeue 2 jobs?" in page and "1 completed job" in page
    assert 'name="expected" value="2"' in page and 'name="state" value="dead"' in page
    caplog.set_level(logging.INFO, logger=AUDIT)
    response = post(
        web, "/jobs/action", action="requeue", ids=[str(i) for i in [*dead, done]], expected="2", state="dead"
    )
    assert response.headers["location"] == "/jobs?state=dead&done=requeue&n=2"
    assert [row(conn, i)["state"] for i in [*dead, done]] == ["available", "available", "completed"]
    assert audit_lines(caplog) == [
        f"user=anonymous@testclient action=requeue ids={dead[0]},{dead[1]} count=2 outcome=ok"
    ]


def test_act_on_everything_matching_the_filter(
    web: TestClient, client: Client, store: Store, conn: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    emails = [dead_job(client, store, conn, "ValueError: boom") for _ in range(3)]
    reports = dead_job(client, store, conn, "ValueError: boom", queue="reports")
    waiting = client.enqueue("send_email", queue="emails").id
    page = web.get("/jobs/confirm", params={"action": "requeue", "scope": "matching", "queue": "emails"}).text
    assert "Requeue 3 jobs?" in page and "every job matching: queue emails" in page
    caplog.set_level(logging.INFO, logger=AUDIT)
    response = post(web, "/jobs/action", action="requeue", scope="matching", queue="emails", expected="3")
    assert response.headers["location"] == "/jobs?queue=emails&done=requeue&n=3"
    assert [row(conn, i)["state"] for i in emails] == ["available"] * 3
    assert row(conn, reports)["state"] == "dead"
    ids = ",".join(str(i) for i in emails)
    assert audit_lines(caplog) == [
        f"user=anonymous@testclient action=requeue ids={ids} filter=[queue emails] count=3 outcome=ok"
    ]

    cancel = {"action": "cancel", "scope": "matching", "queue": "emails", "state": "available"}
    assert "Cancel 4 jobs?" in web.get("/jobs/confirm", params=cancel).text
    post(web, "/jobs/action", **cancel, expected="4")
    assert count(conn, "state = 'cancelled'") == 4 and row(conn, waiting)["state"] == "cancelled"
    delete = {"action": "delete", "scope": "matching", "state": "cancelled"}
    assert "Delete 4 jobs?" in web.get("/jobs/confirm", params=delete).text
    post(web, "/jobs/action", **delete, expected="4")
    assert count(conn) == 1 and row(conn, reports)["state"] == "dead"


def test_an_audit_line_cannot_be_forged_through_the_filter(
    web: TestClient, client: Client, store: Store, conn: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    dead_job(client, store, conn, "ValueError: boom")
    caplog.set_level(logging.INFO, logger=AUDIT)
    forged = "x\nuser=admin@10.0.0.1 action=delete count=1000"
    post(web, "/jobs/action", action="requeue", scope="matching", task=forged, expected="1")
    [line] = audit_lines(caplog)
    assert "\n" not in line and "task x\\nuser=admin" in line


def test_an_action_on_a_filter_applies_to_at_most_the_confirmed_count(
    web: TestClient, client: Client, store: Store, conn: Connection
) -> None:
    dead = [dead_job(client, store, conn, "ValueError: boom") for _ in range(5)]
    post(web, "/jobs/action", action="requeue", scope="matching", state="dead", expected="2")
    assert [row(conn, i)["state"] for i in dead] == ["available"] * 2 + ["dead"] * 3  # oldest first
    assert post(web, "/jobs/action", action="requeue", scope="matching").status_code == 400  # no count confirmed


def test_confirmation_without_a_selection_or_with_nothing_to_do(web: TestClient, client: Client) -> None:
    response = web.get("/jobs/confirm", params={"action": "requeue"})
    assert response.status_code == 400 and "no job selected" in response.text
    client.enqueue("send_email", queue="emails")
    page = web.get("/jobs/confirm", params={"action": "requeue", "scope": "matching"}).text
    assert "Requeue 0 jobs?" in page and "Nothing to requeue." in page and '<form method="post"' not in page


# -- queues and schedules ----------------------------------------------------------------------------


def test_the_queues_page_names_each_blocked_sequence_key_and_the_job_blocking_it(
    web: TestClient, client: Client, conn: Connection
) -> None:
    assert "No sequence key is blocked." in web.get("/queues").text
    dead = client.enqueue("send_email", queue="emails", sequence_key="user:<5>").id
    client.enqueue("send_email", queue="emails", sequence_key="user:<5>")
    conn.execute(
        "UPDATE miniqueue_jobs SET state = 'dead', attempt = 1, finished_at = now(), last_error = 'smtp down'"
        " WHERE id = %s",
        [dead],
    )
    page = web.get("/queues").text
    section = page[page.index("Blocked sequences") :]
    assert "user:&lt;5&gt;" in section and f'href="/jobs/{dead}">job {dead}</a>' in section
    assert "smtp down" in section
    job_page = web.get(f"/jobs/{dead}").text
    assert "Sequence key" in job_page and "user:&lt;5&gt;" in job_page


def test_pause_and_resume_a_queue(
    web: TestClient, client: Client, store: Store, conn: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = client.enqueue("send_email", queue="emails").id
    caplog.set_level(logging.INFO, logger=AUDIT)
    response = post(web, "/queues/emails/pause")
    assert response.headers["location"] == "/queues?done=pause"
    assert store.paused_queues(conn) == ["emails"]
    assert store.claim(conn, ["emails"], WORKER, 30, 10) == []
    page = web.get("/queues").text
    assert 'class="badge paused"' in page and 'action="/queues/emails/resume"' in page

    post(web, "/queues/emails/resume")
    assert store.paused_queues(conn) == []
    assert [lease.id for lease in store.claim(conn, ["emails"], WORKER, 30, 10)] == [job_id]
    assert audit_lines(caplog) == [
        "user=anonymous@testclient action=pause-queue queue=emails count=1 outcome=ok",
        "user=anonymous@testclient action=resume-queue queue=emails count=1 outcome=ok",
    ]
    assert post(web, "/queues/Bad%20Name/pause").status_code == 400


def test_the_queues_page_sets_and_removes_key_rules_and_shows_each_fair_key(
    web: TestClient, client: Client, store: Store, conn: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=AUDIT)
    client.enqueue_many([JobSpec("report", {}, queue="reports", fair_key=key) for key in ("acme", "acme", "globex")])
    store.claim(conn, ["reports"], WORKER, 30, 1)
    response = post(web, "/keys/set", pattern="acme", limit="2", weight="3")
    assert response.headers["location"] == "/queues?done=set-rule"
    assert [(r.pattern, r.max_running, r.weight) for r in client.key_rules()] == [("acme", 2, 3.0)]
    page = web.get("/queues").text
    assert "<code>acme</code>" in page and "Set the key rule" not in page
    assert "globex" in page and "100%" in page  # acme runs the queue's one running fair job
    assert post(web, "/keys/set", pattern="*", limit="1").status_code == 400  # every key, not said
    assert post(web, "/keys/set", pattern="x", limit="many").status_code == 400
    assert [r.pattern for r in client.key_rules()] == ["acme"]
    post(web, "/keys/unset", pattern="acme")
    assert client.key_rules() == []
    assert audit_lines(caplog) == [
        "user=anonymous@testclient action=set-key-rule pattern=acme count=1 outcome=ok",
        "user=anonymous@testclient action=unset-key-rule pattern=acme count=1 outcome=ok",
    ]


def schedules_app() -> App:
    app = App()
    app.task("send_digest", queue="emails", max_attempts=3)(lambda job: None)
    app.periodic("0 * * * *", task="send_digest", payload={"kind": "hourly"}, name="hourly-digest")
    return app


def test_periodic_enable_disable_and_run_now(
    client: Client, store: Store, conn: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=AUDIT)
    with on_localhost(create_app(client, app=schedules_app())) as web:
        page = web.get("/periodic").text
        assert "hourly-digest" in page and "0 * * * *" in page and "send_digest" in page
        assert 'action="/periodic/hourly-digest/disable"' in page and "Run now" in page

        assert post(web, "/periodic/hourly-digest/disable").headers["location"] == "/periodic?done=disable"
        assert store.periodic_state(conn)["hourly-digest"][1] is False
        assert 'action="/periodic/hourly-digest/enable"' in web.get("/periodic").text
        post(web, "/periodic/hourly-digest/enable")
        assert store.periodic_state(conn)["hourly-digest"][1] is True

        response = post(web, "/periodic/hourly-digest/run")
        job_id = int(response.headers["location"].split("/")[-1].split("?")[0])
        job = row(conn, job_id)
        assert (job["task"], job["queue"], job["payload"], job["max_attempts"]) == (
            "send_digest",
            "emails",
            {"kind": "hourly"},
            3,
        )
        assert post(web, "/periodic/nope/run").status_code == 404
    assert audit_lines(caplog) == [
        "user=anonymous@testclient action=disable-schedule schedule=hourly-digest count=1 outcome=ok",
        "user=anonymous@testclient action=enable-schedule schedule=hourly-digest count=1 outcome=ok",
        f"user=anonymous@testclient action=run-schedule ids={job_id} schedule=hourly-digest count=1 outcome=ok",
    ]


def test_periodic_without_an_app_shows_the_database_state(web: TestClient, store: Store, conn: Connection) -> None:
    store.set_periodic_enabled(conn, "nightly", False)
    page = web.get("/periodic").text
    assert "nightly" in page and "disabled" in page and "Run now" not in page and "create_app(dsn, app=app)" in page
    assert post(web, "/periodic/nightly/run").status_code == 404
    post(web, "/periodic/nightly/enable")
    assert store.periodic_state(conn)["nightly"][1] is True


# -- security -----------------------------------------------------------------------------------------


def test_read_only_shows_no_action_and_refuses_every_post(client: Client, store: Store, conn: Connection) -> None:
    job_id = dead_job(client, store, conn, "ValueError: boom")
    with on_localhost(create_app(client, read_only=True, app=schedules_app())) as web:
        for path in ["/", "/jobs", f"/jobs/{job_id}", "/queues", "/periodic", "/workers"]:
            page = web.get(path)
            assert page.status_code == 200 and 'method="post"' not in page.text and 'name="ids"' not in page.text
            assert "read-only" in page.text
        for path in [f"/jobs/{job_id}/requeue", "/jobs/action", "/queues/emails/pause", "/periodic/hourly-digest/run"]:
            response = post(web, path, action="requeue", ids=str(job_id), expected="1")
            assert response.status_code == 403 and "read-only" in response.text
    assert row(conn, job_id)["state"] == "dead" and store.paused_queues(conn) == [] and count(conn) == 1


def test_every_post_needs_the_csrf_token_of_its_cookie(
    web: TestClient, client: Client, store: Store, conn: Connection
) -> None:
    job_id = dead_job(client, store, conn, "ValueError: boom")
    path = f"/jobs/{job_id}/requeue"
    good = token(web)
    assert web.post(path, data={}).status_code == 403
    tampered = good[:-1] + ("1" if good.endswith("0") else "0")
    assert web.post(path, data={"csrf_token": tampered}).status_code == 403
    assert web.post(path, data={"csrf_token": "é"}).status_code == 403
    as_json = web.post(path, content=b'{"csrf_token": "x"}', headers={"content-type": "application/json"})
    assert as_json.status_code == 403
    with on_localhost(create_app(client)) as stranger:  # a cross-site form: the token without its cookie
        assert stranger.post(path, data={"csrf_token": good}).status_code == 403
        forged = "nonce.0123"  # a cookie the attacker planted: not signed by the server
        stranger.cookies.set("miniqueue_csrf", forged)
        assert stranger.post(path, data={"csrf_token": forged}).status_code == 403
    assert row(conn, job_id)["state"] == "dead"
    assert web.post(path, headers={"X-CSRF-Token": good}, follow_redirects=False).status_code == 303
    assert row(conn, job_id)["state"] == "available"


def test_csrf_cookie_is_strict_and_http_only(web: TestClient) -> None:
    web.cookies.clear()
    cookie = web.get("/").headers["set-cookie"]
    assert cookie.startswith("miniqueue_csrf=") and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert "set-cookie" not in web.get("/").headers  # issued once, then reused


def test_pages_refuse_to_be_framed_and_load_only_their_own_assets(web: TestClient, client: Client) -> None:
    for response in [web.get("/"), web.get("/jobs/1"), on_localhost(create_app(client, auth=lambda r: False)).get("/")]:
        assert response.headers["x-frame-options"] == "DENY"
        assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
        assert response.headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in web.get("/").text and " style=" not in web.get("/").text


def test_basic_auth_from_the_environment(
    client: Client, store: Store, conn: Connection, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MINIQUEUE_WEB_USER", "alice")
    monkeypatch.setenv("MINIQUEUE_WEB_PASSWORD", "s3cret:with:colons")
    job_id = dead_job(client, store, conn, "ValueError: boom")
    caplog.set_level(logging.INFO, logger=AUDIT)
    with on_localhost(create_app(client)) as web:
        refused = web.get("/")
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic realm=")
        assert web.get("/", auth=("alice", "wrong")).status_code == 401
        assert web.get("/", headers={"Authorization": "Basic !!notbase64"}).status_code == 401
        assert web.get("/static/style.css").status_code == 401
        web.auth = ("alice", "s3cret:with:colons")
        assert web.get("/").status_code == 200
        assert post(web, f"/jobs/{job_id}/requeue").status_code == 303
    assert audit_lines(caplog) == [
        "user=alice@testclient action=login failures=1 outcome=failed",
        "user=?@testclient action=login failures=2 outcome=failed",
        "user=alice@testclient action=login failures=2 outcome=ok",
        f"user=alice@testclient action=requeue ids={job_id} count=1 outcome=ok",
    ]


def test_basic_auth_needs_both_variables(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINIQUEUE_WEB_USER", "alice")
    monkeypatch.delenv("MINIQUEUE_WEB_PASSWORD", raising=False)
    with pytest.raises(ConfigError, match="MINIQUEUE_WEB_PASSWORD is not set"):
        create_app(client)


def test_a_pluggable_auth_callable(client: Client) -> None:
    def by_header(request: Request) -> bool:
        request.state.miniqueue_user = "ops-bot"
        return request.headers.get("x-api-key") == "k-123"

    async def by_cookie(request: Request) -> bool:
        return request.cookies.get("session") == "valid"

    with on_localhost(create_app(client, auth=by_header)) as web:
        assert web.get("/").status_code == 401
        assert web.get("/", headers={"x-api-key": "k-123"}).status_code == 200
    with on_localhost(create_app(client, auth=by_cookie)) as web:
        assert web.get("/jobs").status_code == 401
        web.cookies.set("session", "valid")
        assert web.get("/jobs").status_code == 200


# -- embedding and serving ------------------------------------------------------------------------------


def test_mounted_under_a_prefix_inside_another_app(client: Client, store: Store, conn: Connection) -> None:
    job_id = dead_job(client, store, conn, "ValueError: boom")
    host = Starlette(routes=[Mount("/admin/queue", app=create_app(client))])
    with on_localhost(host) as web:
        first = web.get("/admin/queue/jobs")
        assert "Path=/admin/queue;" in first.headers["set-cookie"]
        page = first.text
        assert f'href="/admin/queue/jobs/{job_id}"' in page and 'href="/admin/queue/static/style.css"' in page
        assert 'data-live="/admin/queue/jobs?partial=1"' in page
        assert web.get("/admin/queue/static/live.js").status_code == 200
        response = web.post(
            f"/admin/queue/jobs/{job_id}/requeue",
            data={"csrf_token": web.cookies["miniqueue_csrf"]},
            follow_redirects=False,
        )
        assert response.headers["location"] == f"/admin/queue/jobs/{job_id}?done=requeue&n=1"
    assert row(conn, job_id)["state"] == "available"


def test_a_dashboard_created_from_a_dsn_opens_its_pool_on_first_use(dsn: str, client: Client) -> None:
    job_id = client.enqueue("send_email", queue="emails").id
    with on_localhost(create_app(dsn)) as web:
        assert listed(web.get("/jobs").text) == [job_id]


def test_an_unreachable_database_is_a_503_page_not_a_traceback() -> None:
    dashboard = create_app("postgresql://miniqueue:s3cret@127.0.0.1:1/nowhere")  # connects on first use only
    with on_localhost(dashboard) as web:
        response = web.get("/")
    assert response.status_code == 503 and "database unavailable" in response.text
    assert "s3cret" not in response.text and "Traceback" not in response.text


def test_miniqueue_web_serves_the_dashboard(dsn: str, client: Client, tmp_path: Path) -> None:
    job_id = client.enqueue("send_email", queue="emails").id
    env = {**os.environ, "DATABASE_URL": dsn, "MINIQUEUE_WEB_USER": "", "MINIQUEUE_WEB_PASSWORD": ""}
    with read_only_dashboard(env, tmp_path / "web.log") as address:
        response = httpx2.get(f"{address}/jobs", timeout=5)
        assert response.status_code == 200 and f"/jobs/{job_id}" in response.text and "read-only" in response.text
        assert httpx2.post(f"{address}/queues/emails/pause").status_code == 403


def test_state_counts_are_consistent_with_the_store(
    web: TestClient, client: Client, store: Store, conn: Connection
) -> None:
    dead_job(client, store, conn, "ValueError: boom")
    html = web.get("/?partial=1").text
    dead_card = re.search(r'href="/jobs\?state=dead">(\d+)</a>', html)
    assert dead_card and int(dead_card[1]) == sum(q.counts[State.DEAD] for q in store.queue_stats(conn))
