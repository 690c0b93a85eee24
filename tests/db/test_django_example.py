"""examples/django_shop, as its README.md says to run it: ``manage.py migrate``, ``runserver``
and ``miniqueue supervise`` on a database of the test's own, real requests, and the project's
own tests under ``manage.py test``.

Django is set up in subprocesses only, each with the example's settings: a process sets Django
up once, and this test process may have set it up already with tests/django_project's
(tests/db/test_django.py runs in the same pytest-xdist worker as this module, at times).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from miniqueue.core.db import Connection
from miniqueue.store.migrate import latest_version

from ..helpers import row, wait_until
from ..serving import listening, start, stop
from ..supervised import free_port

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "django_shop"
README = PROJECT / "README.md"
# The README's commands that this module runs (on a free port rather than 8000, and one worker).
MIGRATE = "python manage.py migrate"
STOCK_CODE = "from orders.models import Product; Product.objects.create(sku='tea', stock=3)"
STOCK = f'python manage.py shell -c "{STOCK_CODE}"'
SERVE = "python manage.py runserver"
SUPERVISE = "python manage.py miniqueue supervise --workers 2"
TEST = "python manage.py test orders"


def environment(database: str) -> dict[str, str]:
    """The example's environment: ``DATABASE_URL``, and the repository on the path (for
    miniqueue, should it not be installed)."""
    return {
        **os.environ,
        "DATABASE_URL": database,
        "PYTHONPATH": str(PROJECT.parent.parent),
        "PYTHONUNBUFFERED": "1",
    }


def manage(database: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    """``python manage.py ARGUMENTS`` in the example's folder, to its end."""
    return subprocess.run(
        [sys.executable, "manage.py", *arguments],
        env=environment(database),
        cwd=PROJECT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=100,
    )


def in_background(database: str, log: Path, *arguments: str) -> subprocess.Popen[bytes]:
    """``python manage.py ARGUMENTS`` in the example's folder, in the background, in a process
    group of its own, its output to ``log``."""
    return start([sys.executable, "manage.py", *arguments], log, environment(database), cwd=PROJECT)


def request(url: str, form: dict[str, str] | None = None) -> tuple[int, Any]:
    """A real HTTP GET, or POST of ``form``; the status and the decoded JSON answer."""
    data = None if form is None else urllib.parse.urlencode(form).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data), timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


@pytest.fixture
def shop_conn(fresh_database: str) -> Iterator[Connection]:
    """An autocommit connection to an empty database of the test's own, for the example."""
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        yield conn


def test_the_readme_shows_the_commands_run_here() -> None:
    readme = README.read_text()
    for command in (MIGRATE, STOCK, SERVE, SUPERVISE, TEST):
        assert command in readme, command


def test_served_as_the_readme_says(fresh_database: str, shop_conn: Connection, tmp_path: Path) -> None:
    migrated = manage(fresh_database, "migrate")
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert f"Applied miniqueue's migrations 001-{latest_version():03d} to 'default'" in migrated.stdout
    assert "Applying orders.0001_initial... OK" in migrated.stdout
    stocked = manage(fresh_database, "shell", "-c", STOCK_CODE)
    assert stocked.returncode == 0, stocked.stderr

    def stock() -> int:
        found = shop_conn.execute("SELECT stock FROM orders_product WHERE sku = 'tea'").fetchone()
        assert found is not None
        return int(found[0])

    def orders() -> list[tuple[Any, ...]]:
        return shop_conn.execute("SELECT id, quantity, email FROM orders_order ORDER BY id").fetchall()

    def jobs() -> list[tuple[Any, ...]]:
        return shop_conn.execute("SELECT id, task, queue, payload, state FROM miniqueue_jobs").fetchall()

    assert stock() == 3
    port = free_port()
    server = in_background(fresh_database, tmp_path / "runserver.log", "runserver", f"127.0.0.1:{port}", "--noreload")
    workers = None
    try:
        base = f"http://127.0.0.1:{port}"
        log = tmp_path / "runserver.log"
        wait_until(lambda: listening(f"{base}/orders/1/", server, log), timeout=30, what="runserver")

        # The order, its job and the stock it took commit together: the job is there, available,
        # before any worker has run.
        status, placed = request(f"{base}/orders/", {"sku": "tea", "quantity": "2", "email": "ada@example.com"})
        assert status == 201, placed
        assert orders() == [(placed["order"], 2, "ada@example.com")]
        assert jobs() == [(placed["job"], "send_confirmation", "emails", {"order": placed["order"]}, "available")]
        assert stock() == 1

        # Too few in stock: the block raises after its enqueue, and the order and the job roll back.
        status, refused = request(f"{base}/orders/", {"sku": "tea", "quantity": "2", "email": "bob@example.com"})
        assert (status, refused) == (409, {"error": "2 x 'tea' ordered, and fewer are in stock"})
        assert request(f"{base}/orders/", {"sku": "tea", "quantity": "0", "email": "bob"})[0] == 400
        assert request(f"{base}/orders/", {"sku": "cake", "quantity": "1", "email": "bob@example.com"})[0] == 404
        assert orders() == [(placed["order"], 2, "ada@example.com")]
        assert len(jobs()) == 1 and stock() == 1

        # The workers run the job, which emails and sets confirmed_at through the ORM.
        workers = in_background(fresh_database, tmp_path / "supervise.log", "miniqueue", "supervise", "--workers", "1")

        def confirmed() -> dict[str, Any] | None:
            status, shown = request(f"{base}/orders/{placed['order']}/")
            assert status == 200, shown
            return shown if shown["confirmed_at"] else None

        shown = wait_until(confirmed, timeout=30, what="the order's confirmation")
        assert (shown["order"], shown["sku"], shown["quantity"]) == (placed["order"], "tea", 2)
        wait_until(lambda: row(shop_conn, placed["job"])["state"] == "completed", what="the job's completion")
    finally:
        served = stop(server)
        supervised = None if workers is None else stop(workers)
    assert served == -signal.SIGTERM, (tmp_path / "runserver.log").read_text()
    supervise_log = (tmp_path / "supervise.log").read_text()
    assert supervised == 0, supervise_log
    assert "To: ada@example.com" in supervise_log, supervise_log  # the console email backend's
    assert "bob@example.com" not in supervise_log


def test_the_projects_own_tests_pass(fresh_database: str, shop_conn: Connection) -> None:
    """``manage.py test orders``: the runner's test database gets the queue's tables from
    ``migrate``, the TestCase's assertions see its uncommitted jobs, the TransactionTestCase
    runs them, and the test database is dropped at the end."""
    test_database = f"test_{conninfo_to_dict(fresh_database)['dbname']}"
    done = manage(fresh_database, "test", "orders", "--noinput", "-v", "2")
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Applied miniqueue's migrations 001-" in output, output
    assert "Ran 4 tests" in output and "\nOK" in output, output
    for name in (
        "test_an_order_enqueues_its_confirmation",
        "test_out_of_stock_stores_neither_the_order_nor_its_job",
        "test_a_wrong_form_is_refused",
        "test_the_job_sends_the_email_and_confirms_the_order",
    ):
        assert re.search(rf"^{name} \(orders\.tests\.\w+\.{name}\) \.\.\. ok$", output, re.MULTILINE), output
    found = shop_conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", [test_database]).fetchone()
    assert found == (0,), f"{test_database} was left behind"
