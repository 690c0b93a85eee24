"""miniqueue.integrations.django with a real Django project (tests/django_project) on the test
database: jobs enqueued on Django's own connection commit and roll back with its transaction,
and ``manage.py miniqueue`` runs miniqueue's commands, the supervisor among them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django
import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test.utils import override_settings
from psycopg.conninfo import conninfo_to_dict

import miniqueue
from miniqueue import Client
from miniqueue.core.db import Connection
from miniqueue.integrations.django import (
    close_clients,
    database_url,
    enqueue,
    enqueue_many,
    get_client,
    psycopg_connection,
)
from miniqueue.store.migrate import latest_version
from miniqueue.testing import assert_enqueued, enqueued_jobs, run_jobs

from ..helpers import count, wait_until
from ..serving import start, stop

SETTINGS = "tests.django_project.settings"
MANAGE = Path(__file__).resolve().parents[1] / "django_project" / "manage.py"


def manage(dsn: str, repo_root: Path, cwd: Path, *arguments: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the test project's ``manage.py`` on the database ``dsn``, to its end."""
    environ = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "DJANGO_TEST_DSN": dsn,
        "PYTHONPATH": str(repo_root),
        **env,
    }
    return subprocess.run(
        [sys.executable, str(MANAGE), *arguments],
        env=environ,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def sessions(conn: Connection, dbname: str, application: str) -> int:
    """How many sessions ``application`` has open on database ``dbname``."""
    found = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND application_name = %s", [dbname, application]
    ).fetchone()
    assert found is not None
    return int(found[0])


@pytest.fixture(scope="session")
def django_project(database_dsn: str) -> str:
    """Django set up on the test session's database, with the project's tables created."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_TEST_DSN", database_dsn)
        patch.setenv("DJANGO_SETTINGS_MODULE", SETTINGS)
        django.setup()
    from tests.django_project.shop.models import Order, Receipt

    with connection.schema_editor() as editor:
        editor.create_model(Order)
        editor.create_model(Receipt)
    return database_dsn


@pytest.fixture
def shop(django_project: str, dsn: str) -> Iterator[Any]:
    """The shop's models, with no order or receipt left by an earlier test."""
    from tests.django_project.shop import models

    models.Order.objects.all().delete()
    models.Receipt.objects.all().delete()
    yield models


def test_the_job_commits_with_the_atomic_block(shop: Any, client: Client, conn: Connection) -> None:
    from tests.django_project.shop.views import place_order

    job_id = place_order(1)
    [job] = assert_enqueued(client, task="send_receipt", payload={"order": 1}, queue="mail")
    assert job.id == job_id
    assert shop.Order.objects.filter(number=1).exists()


def test_a_job_is_invisible_until_the_block_commits(shop: Any, conn: Connection) -> None:
    with transaction.atomic():
        shop.Order.objects.create(number=2)
        enqueue("send_receipt", {"order": 2})
        assert count(conn) == 0  # another connection sees nothing yet
    assert count(conn) == 1


def test_a_rolled_back_block_leaves_no_job(shop: Any, client: Client) -> None:
    from tests.django_project.shop.views import place_order

    with pytest.raises(RuntimeError, match="payment declined"):
        place_order(3, fail=True)
    with transaction.atomic():
        enqueue("kept")
        try:
            with transaction.atomic():  # a savepoint
                enqueue("dropped")
                raise ValueError
        except ValueError:
            pass
        enqueue_many([miniqueue.JobSpec("batch", {"n": i}) for i in range(600)])  # by COPY
    assert [job.task for job in enqueued_jobs(client)][:2] == ["kept", "batch"]
    assert len(enqueued_jobs(client, task="batch")) == 600
    assert enqueued_jobs(client, task="dropped") == []
    assert not shop.Order.objects.filter(number=3).exists()


def test_outside_a_block_the_job_is_stored_at_once(shop: Any, conn: Connection) -> None:
    assert connection.get_autocommit()
    enqueue("now", delay=60)
    assert count(conn, "task = 'now' AND scheduled_at > now()") == 1


def test_a_failed_enqueue_marks_the_block_for_rollback(shop: Any, client: Client, dsn: str) -> None:
    with psycopg.connect(dsn) as other:  # holds an uncommitted job with the same idempotency key
        client.enqueue("charge", idempotency_key="order-8", conn=other)
        with transaction.atomic():
            shop.Order.objects.create(number=8)
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '100ms'")
            with pytest.raises(miniqueue.DatabaseUnavailable, match="lock timeout"):
                enqueue("charge", idempotency_key="order-8")
            # The transaction is aborted: Django must not try to commit the order.
            assert connection.needs_rollback
        other.rollback()
    assert not shop.Order.objects.filter(number=8).exists()
    assert enqueued_jobs(client) == []


def test_the_dsn_comes_from_django(shop: Any, dsn: str) -> None:
    ours, theirs = conninfo_to_dict(database_url()), conninfo_to_dict(dsn)
    assert {k: ours.get(k) for k in ("dbname", "host", "port", "user")} == {
        k: theirs.get(k) for k in ("dbname", "host", "port", "user")
    }
    assert psycopg_connection() is connection.connection
    with override_settings(MINIQUEUE={"DATABASE_URL": dsn, "SCHEMA": "public"}):
        assert database_url() == dsn
    with override_settings(MINIQUEUE={"QUEUE": "x"}), pytest.raises(miniqueue.ConfigError, match="unknown keys"):
        database_url()
    with override_settings(MINIQUEUE={"DATABASE": "other"}), pytest.raises(miniqueue.ConfigError, match="'other'"):
        get_client()
    assert get_client() is get_client()


def test_run_jobs_with_orm_handlers(shop: Any) -> None:
    from tests.django_project.shop.tasks import app
    from tests.django_project.shop.views import place_order

    job_id = place_order(5)
    result = run_jobs(app, get_client())
    assert [job.id for job in result.completed] == [job_id]
    assert shop.Receipt.objects.get(order=5).job_id == job_id


def test_manage_py_miniqueue_runs_the_cli(shop: Any, capsys: pytest.CaptureFixture[str]) -> None:
    enqueue("send_receipt", {"order": 6}, queue="mail")
    call_command("miniqueue", "migrate")
    call_command("miniqueue", "stats", "--json")
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert any(row["queue"] == "mail" and row["available"] == 1 for row in stats), stats
    with pytest.raises(django.core.management.CommandError, match="exited with status 2"):
        call_command("miniqueue", "no-such-command")


def test_manage_py_miniqueue_supervise(shop: Any, dsn: str, repo_root: Path, tmp_path: Path) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS, "DJANGO_TEST_DSN": dsn, "PYTHONPATH": str(repo_root)}
    log = tmp_path / "supervise.log"
    argv = [sys.executable, str(MANAGE), "miniqueue", "supervise", "--workers", "1", "--poll-interval", "0.1"]
    proc = start(argv, log, env, cwd=tmp_path)
    try:
        from tests.django_project.shop.views import place_order

        job_id = place_order(7)
        wait_until(lambda: shop.Receipt.objects.filter(order=7).exists(), timeout=30, what="the receipt")
        assert shop.Receipt.objects.get(order=7).job_id == job_id
    finally:
        stopped = stop(proc)
    assert stopped == 0, log.read_text()


def test_manage_py_test_runs_the_testing_kit(
    django_project: str, conn: Connection, repo_root: Path, tmp_path: Path
) -> None:
    """Django's test runner over the shop's tests (tests/django_project/shop/tests.py): its new
    test database gets the queue's tables from ``migrate``; inside TestCase the assertions see
    the jobs the test's uncommitted transaction enqueued; the TransactionTestCase runs them
    through get_client()'s pool; and the test database is dropped at the end."""
    test_database = f"test_{conninfo_to_dict(django_project)['dbname']}"
    done = manage(django_project, repo_root, tmp_path, "test", "tests.django_project.shop", "--noinput", "-v", "2")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Applied miniqueue's migrations 001-" in output
    assert "Ran 4 tests" in output and "\nOK" in output, output
    assert "being accessed by other users" not in output, output
    found = conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", [test_database]).fetchone()
    assert found == (0,), f"{test_database} was left behind"


def test_manage_py_migrate_creates_the_queue_tables(fresh_database: str, repo_root: Path, tmp_path: Path) -> None:
    def queue_version() -> int | None:
        with psycopg.connect(fresh_database) as fresh:
            if fresh.execute("SELECT to_regclass('public.miniqueue_migrations')").fetchone() == (None,):
                return None
            found = fresh.execute("SELECT max(version) FROM miniqueue_migrations").fetchone()
            return None if found is None else found[0]

    kept_off = manage(fresh_database, repo_root, tmp_path, "migrate", DJANGO_TEST_NO_QUEUE_MIGRATE="1")
    assert kept_off.returncode == 0, kept_off.stderr
    assert queue_version() is None  # the router said no

    first = manage(fresh_database, repo_root, tmp_path, "migrate")
    assert first.returncode == 0, first.stderr
    assert f"Applied miniqueue's migrations 001-{latest_version():03d} to 'default'" in first.stdout
    assert queue_version() == latest_version()
    again = manage(fresh_database, repo_root, tmp_path, "migrate")
    assert again.returncode == 0, again.stderr
    assert "miniqueue" not in again.stdout  # nothing pending, nothing said


def test_the_kit_reads_what_an_open_transaction_enqueued(shop: Any, client: Client) -> None:
    """As inside django.test.TestCase: the jobs are in Django's transaction, not committed."""
    from tests.django_project.shop.tasks import app
    from tests.django_project.shop.views import place_order

    with transaction.atomic():
        job_id = place_order(9)  # a savepoint inside the outer block
        [job] = assert_enqueued(get_client(), task="send_receipt", payload={"order": 9}, queue="mail", count=1)
        assert job.id == job_id and job.payload == {"order": 9}  # decoded, though Django loads jsonb as text
        assert enqueued_jobs(client) == []  # a connection of another pool sees nothing yet
        with pytest.raises(miniqueue.ConfigError, match=rf"job\(s\) \[{job_id}\].*TransactionTestCase"):
            run_jobs(app, get_client())
        transaction.set_rollback(True)
    assert enqueued_jobs(get_client()) == []


def test_a_connection_to_no_database_closes_the_pools(shop: Any, conn: Connection, django_project: str) -> None:
    """Django connects to no database to create or drop a test database: get_client()'s pools
    close first, so that no idle connection keeps the test database from being dropped."""
    dbname = str(conninfo_to_dict(django_project)["dbname"])
    close_clients()  # what earlier tests left idle
    wait_until(lambda: sessions(conn, dbname, "miniqueue:django") == 0, what="earlier tests' connections to close")
    client = get_client()
    client.list_jobs()  # opens one of the pool's connections
    assert sessions(conn, dbname, "miniqueue:django") == 1
    with connection._nodb_cursor() as cursor:  # what the test runner's create and drop use
        cursor.execute("SELECT 1")
    wait_until(lambda: sessions(conn, dbname, "miniqueue:django") == 0, what="the pool's connection to close")
    assert get_client() is not client
