"""The dashboard in a real headless Chromium: Debian's ``chromium`` driven by Playwright.

The dashboard runs under uvicorn on a free localhost port against the test database; a real
:class:`miniqueue.Worker` runs on a thread where a test needs one. Each page is saved to
docs/screenshots/ (linked from docs/operations/dashboard.md). Nothing here is skipped: without
/usr/bin/chromium (``apt-get install -y chromium``) or the playwright package the tests fail.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import uvicorn

from miniqueue import App, Client, JobSpec, Worker, WorkerConfig
from miniqueue.core.db import Connection
from miniqueue.core.records import ProcessInfo
from miniqueue.store.store import Store
from miniqueue.tasks.job import encode_progress
from miniqueue.web import create_app, redact_keys

from ..helpers import row, wait_until

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
# The committed screenshots are refreshed on request (MINIQUEUE_SCREENSHOTS=1), so that a test
# run does not rewrite tracked files; otherwise they go to a scratch folder.
SCREENSHOTS = (
    Path(__file__).resolve().parents[2] / "docs" / "screenshots"
    if os.environ.get("MINIQUEUE_SCREENSHOTS")
    else Path(tempfile.gettempdir()) / "miniqueue-screenshots"
)
WORKER_ID = "app-1:31337:9f2c1a"
TIMEOUT_MS = 10_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the playwright package is missing: pip install playwright (no `playwright install` needed)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser, server: str) -> Iterator[Page]:
    """A fresh browser context, closed before the server stops; the test fails if any page
    logged an error (a CSP violation, a script error, a failed fetch)."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    context.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    context.on("page", lambda p: p.on("console", lambda m: errors.append(m.text) if m.type == "error" else None))
    yield context.new_page()
    context.close()
    assert errors == []


def demo_app() -> App:
    app = App()
    for task, queue in [
        ("send_email", "emails"),
        ("build_report", "reports"),
        ("resize_image", "images"),
        ("deliver_webhook", "webhooks"),
        ("make_thumbnail", "thumbnails"),
    ]:
        app.task(task, queue=queue)(lambda job: None)
    app.periodic("*/15 * * * *", task="build_report", payload={"kind": "quarter-hourly"}, name="report-digest")
    app.periodic("0 3 * * *", task="send_email", payload={"template": "nightly-summary"}, name="nightly-summary")
    return app


@pytest.fixture
def server(client: Client) -> Iterator[str]:
    """The dashboard under uvicorn on a free port; yields its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    dashboard = create_app(client, app=demo_app(), redact=redact_keys(), refresh_seconds=0.5)
    uv = uvicorn.Server(uvicorn.Config(dashboard, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    wait_until(lambda: uv.started, timeout=10, what="uvicorn to start")
    yield f"http://127.0.0.1:{port}"
    uv.should_exit = True
    thread.join(10)


def shoot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def fail_job(store: Store, conn: Connection, queue: str, errors: list[str]) -> int:
    """Claim the next job of ``queue`` and fail it once per error (the last failure kills it)."""
    job_id = 0
    for error in errors:
        [lease] = store.claim(conn, [queue], WORKER_ID, 30, 1)
        job_id = lease.id
        trace = f'Traceback (most recent call last):\n  File "app/mail.py", line 42, in send\n    smtp.send(m)\n{error}'
        store.record_failure(conn, lease.id, WORKER_ID, lease.attempt, trace, 0)
    return job_id


def seed(client: Client, store: Store, conn: Connection) -> list[int]:
    """A realistic hour: completed jobs spread over it, a few dead ones, some waiting; returns the dead ids."""
    specs = [
        JobSpec("send_email", {"to": f"user{i}@example.com", "api_token": "tok-secret"}, queue="emails")
        for i in range(260)
    ]
    specs += [JobSpec("build_report", {"month": i % 12 + 1}, queue="reports") for i in range(90)]
    client.enqueue_many(specs)
    store.publish_tasks(conn, [], ["emails", "reports", "images"])  # as the app's workers do when they start
    for queue, n in [("emails", 252), ("reports", 86)]:
        leases = store.claim(conn, [queue], WORKER_ID, 30, n)
        store.complete_many(conn, WORKER_ID, [(lease.id, lease.attempt) for lease in leases])
    # Spread the finishes over the hour, busier lately, as a chart would look in production.
    conn.execute(
        "UPDATE miniqueue_jobs SET finished_at = now() - floor(power((id * 7919 % 1000) / 1000.0, 1.5) * 59) "
        "* interval '1 minute' WHERE state = 'completed'"
    )
    dead = []
    for queue in ("emails", "emails", "reports"):
        task = "send_email" if queue == "emails" else "build_report"
        payload = {"to": "ops@example.com", "smtp_password": "hunter2"}
        job_id = client.enqueue(task, payload, queue=queue, priority=10, max_attempts=2).id
        fail_job(
            store,
            conn,
            queue,
            [
                "smtplib.SMTPServerDisconnected: Connection unexpectedly closed",
                "TimeoutError: SMTP server did not answer within 30s",
            ],
        )
        dead.append(job_id)
    client.enqueue_many([JobSpec("resize_image", {"path": f"uploads/{i}.jpg"}, queue="images") for i in range(14)])
    client.enqueue("build_report", {"month": 6}, queue="reports", delay=3600)
    store.claim(conn, ["images"], WORKER_ID, 30, 2)
    conn.execute(
        "UPDATE miniqueue_jobs SET created_at = now() - interval '252 seconds', scheduled_at = "
        "now() - interval '252 seconds' WHERE queue = 'images' AND state = 'available'"
    )
    return dead


def test_overview_and_a_filtered_job_list(
    page: Page, server: str, client: Client, store: Store, conn: Connection
) -> None:
    from playwright.sync_api import expect

    dead = seed(client, store, conn)
    page.goto(f"{server}/")
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    emails = page.get_by_role("row").filter(has=page.get_by_role("rowheader", name="emails"))
    expect(emails).to_contain_text("252")
    expect(page.locator("svg.chart rect.bar-completed")).to_have_count(60)
    shoot(page, "overview")

    page.get_by_role("link", name="Jobs", exact=True).click()
    page.get_by_label("State").select_option("dead")
    page.get_by_label("Queue").fill("emails")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**/jobs?state=dead&queue=emails**")
    links = page.locator("table.jobs tbody tr td.num a")
    expect(links).to_have_text([str(i) for i in sorted(dead[:2], reverse=True)])
    shoot(page, "jobs")


def test_requeue_a_dead_job_and_see_its_state_change(
    page: Page, server: str, client: Client, store: Store, conn: Connection
) -> None:
    from playwright.sync_api import expect

    dead = seed(client, store, conn)
    page.goto(f"{server}/jobs?state=dead")
    page.get_by_role("link", name=str(dead[0]), exact=True).click()
    heading = page.get_by_role("heading", level=1)
    expect(heading).to_contain_text(f"Job {dead[0]}")
    expect(heading.locator(".state")).to_have_text("dead")
    expect(page.locator(".attempt")).to_have_count(2)
    expect(page.locator("pre.code").first).to_contain_text("••••••")  # the redact hook hid the api token
    shoot(page, "job")

    page.get_by_role("button", name="Requeue").click()
    expect(page.get_by_role("status")).to_have_text("Requeued 1 job(s).")
    expect(heading.locator(".state")).to_have_text("available")
    assert row(conn, dead[0])["state"] == "available"

    page.goto(f"{server}/jobs?state=dead")
    page.get_by_label("Select every job on this page").check()
    page.get_by_role("button", name="Requeue…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Requeue 2 jobs?")
    shoot(page, "confirm")
    page.get_by_role("button", name="Requeue 2 jobs").click()
    expect(page.get_by_role("status")).to_have_text("Requeued 2 job(s).")
    assert {row(conn, i)["state"] for i in dead} == {"available"}


def test_a_running_job_page_shows_its_progress_live(
    page: Page, server: str, client: Client, store: Store, conn: Connection
) -> None:
    """Progress written by the worker's lease renewal appears on an open job page without a
    reload, and stays once the job completed."""
    from playwright.sync_api import expect

    job_id = client.enqueue("build_report", {"month": 7}, queue="reports").id
    [lease] = store.claim(conn, ["reports"], WORKER_ID, 30, 1)

    def renew(percent: float, rows: int) -> None:  # as the worker's heartbeat writes it
        progress = {lease.id: encode_progress(percent, {"rows": rows})}
        store.renew_leases(conn, WORKER_ID, [(lease.id, lease.attempt)], 30, progress=progress)

    renew(10, 100)
    page.goto(f"{server}/jobs/{job_id}")
    shown = page.locator("dd.progress")
    expect(shown).to_contain_text("10%")
    renew(60, 600)
    expect(shown.locator("progress")).to_have_attribute("value", "60.0")  # by live polling
    expect(shown).to_contain_text('{"rows": 600}')
    store.complete(conn, lease.id, WORKER_ID, lease.attempt)
    expect(page.get_by_role("heading", level=1).locator(".state")).to_have_text("completed")
    expect(shown).to_contain_text("60%")


def test_pausing_a_queue_stops_a_real_worker_claiming_from_it(
    page: Page, server: str, client: Client, store: Store, conn: Connection, dsn: str
) -> None:
    from playwright.sync_api import expect

    seed(client, store, conn)  # other queues, for a realistic screenshot
    worker = Worker(
        demo_app(),
        dsn,
        WorkerConfig(queues=["webhooks", "thumbnails"], lease_duration=5, poll_interval=0.1, shutdown_timeout=5),
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        warm = client.enqueue("deliver_webhook", queue="webhooks").id
        wait_until(lambda: client.get(warm).state.value == "completed", what="the worker to run a webhook")
        page.goto(f"{server}/queues")
        page.get_by_role("button", name="Pause webhooks").click()
        expect(page.get_by_role("status")).to_contain_text("Paused the queue")
        webhooks = page.get_by_role("row").filter(has=page.get_by_role("rowheader", name="webhooks"))
        expect(webhooks.locator(".badge")).to_have_text("paused")

        held = client.enqueue("deliver_webhook", {"url": "https://example.com/hook"}, queue="webhooks").id
        probe = client.enqueue("make_thumbnail", queue="thumbnails").id
        # The worker claims from both queues in one statement, run after `held` was enqueued:
        # once `probe` is done, that claim has seen `held` and passed it over.
        wait_until(lambda: client.get(probe).state.value == "completed", what="the worker to run a thumbnail")
        assert client.get(held).state.value == "available"
        expect(webhooks.locator("td").nth(1)).to_have_text("1")  # the live fragment shows it waiting
        shoot(page, "queues")

        job_page = page.context.new_page()
        job_page.goto(f"{server}/jobs/{held}")
        state = job_page.get_by_role("heading", level=1).locator(".state")
        expect(state).to_have_text("available")
        page.get_by_role("button", name="Resume webhooks").click()
        expect(state).to_have_text("completed")  # seen by live polling, without a reload
        job_page.get_by_role("button", name="Pause live updates").click()
        expect(job_page.locator("#live-toggle")).to_have_attribute("aria-pressed", "true")
        expect(job_page.locator("#live-status")).to_have_text("paused")
    finally:
        worker.stop()
        thread.join(10)


def test_workers_and_periodic_pages(page: Page, server: str, store: Store, conn: Connection) -> None:
    from playwright.sync_api import expect

    now = store.now(conn)
    hour: Any = now.replace(minute=0, second=0, microsecond=0)
    processes = [
        ProcessInfo(
            id="app-1:31300",
            kind="supervisor",
            pid=31300,
            title="miniqueue-supervise: 3 workers",
            started_at=hour,
            rss_bytes=41 * 2**20,
        )
    ]
    processes += [
        ProcessInfo(
            id=f"app-1:{31336 + i}:9f2c1{i}",
            kind="worker",
            pid=31336 + i,
            started_at=hour,
            title=f"miniqueue worker {i}: {'busy' if i else 'idle'}",
            rss_bytes=(88 + i) * 2**20,
            jobs_done=1200 + 37 * i,
            restarts=i // 2,
            current_jobs=(1001 + i,) if i else (),
        )
        for i in range(3)
    ]
    processes.append(
        ProcessInfo(
            id="app-1:31340", kind="reaper", pid=31340, title="miniqueue reaper", started_at=hour, rss_bytes=36 * 2**20
        )
    )
    store.register_processes(conn, "app-1:31300", "app-1", processes)
    store.set_periodic_enabled(conn, "nightly-summary", False)

    page.goto(f"{server}/workers")
    expect(page.get_by_role("cell", name="miniqueue worker 2: busy")).to_be_visible()
    expect(page.get_by_role("link", name="1003")).to_be_visible()
    shoot(page, "workers")

    page.goto(f"{server}/periodic")
    digest = page.get_by_role("row").filter(has=page.get_by_role("rowheader", name="report-digest"))
    digest.get_by_role("button", name="Run now").click()
    expect(page.get_by_role("status")).to_have_text("Enqueued a run of the schedule now.")
    expect(page.get_by_role("heading", level=1)).to_contain_text("build_report")
    page.goto(f"{server}/periodic")
    nightly = page.get_by_role("row").filter(has=page.get_by_role("rowheader", name="nightly-summary"))
    expect(nightly.locator(".badge.paused")).to_have_text("disabled")
    shoot(page, "periodic")
