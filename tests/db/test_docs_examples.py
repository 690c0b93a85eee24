"""Every code example of README.md and docs/**/*.md runs here, or says why it does not.

The examples are the fenced ```python, ```bash and ```console blocks. A block runs unless an
HTML comment on the line just before it (invisible on the site and on GitHub) says otherwise:

- ``<!-- example: not run: REASON -->``: not run, for the reason given (it installs packages,
  starts a server that runs until stopped, needs root, ...).
- ``<!-- example: workers: REASON -->``: a shell block that starts ``miniqueue-supervise`` is not
  run (the reason says why); the test publishes the page's app's task declarations instead, as
  the workers it starts do when they start (``client.declare(app)``).
- ``<!-- example: with workers -->``: a Python block that waits for its jobs (``client.wait``)
  runs on a thread while the page's app's jobs run through the real worker
  (``miniqueue.testing.run_jobs``) until the block returns.
- ``<!-- example: file NAME -->``: a Python block written to the file NAME of the page's folder,
  for the page's setup to run (a test project's ``conftest.py``, say).
- ``<!-- example: same as PATH -->``: a Python block that is the code of a file of the
  repository (after its docstring and ``from __future__`` line), which its own tests run.

The Python blocks of a page run in order in one namespace, which the page's setup below
(``SETUPS``) starts with the names the page assumes (an ``app``, a ``client``, a table...). The
placeholder DSNs the docs use (``postgresql://localhost/mydb``, ``postgresql://app@db/app``) are
replaced by the test database's, in Python and shell blocks alike; shell blocks run under
``bash -euo pipefail`` with ``DATABASE_URL`` set to it, in a folder of their own.

After the last block, every ``miniqueue.App`` the page defined runs the queued jobs
(``run_jobs``), and every stored job must have completed (or end as the setup expects): a job
enqueued to a queue that no worker of the page's app serves stays available, and fails the test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import miniqueue
from miniqueue import Client, JobSpec
from miniqueue.client.sharded import migrate_shards
from miniqueue.core.db import Connection
from miniqueue.core.shard_map import ShardMap
from miniqueue.testing import database as testing_db
from miniqueue.testing import run_jobs

from .test_sqlalchemy import sqlalchemy_url

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LANGUAGES = {"python", "bash", "console"}
PLACEHOLDER_DSNS = ("postgresql://localhost/mydb", "postgresql://app@db/app")
MARKER = re.compile(r"^<!-- example: (.*) -->$")
KINDS = ("not run: ", "workers: ", "with workers", "same as ", "file ")


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    language: str
    code: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def examples(page: Path) -> list[Example]:
    """The page's code blocks in the languages above, each with the marker just before it."""
    found: list[Example] = []
    lines = page.read_text().splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("```") and line[3:].strip():
            language, start = line[3:].strip(), index
            end = lines.index("```", index + 1)
            marker = MARKER.match(lines[start - 1]) if start else None
            if language in LANGUAGES:
                code = "\n".join(lines[start + 1 : end]) + "\n"
                page_name = str(page.relative_to(ROOT))
                found.append(Example(page_name, start + 1, language, code, marker[1] if marker else None))
            index = end
        elif line.startswith("```"):
            index = lines.index("```", index + 1)
        index += 1
    return found


# --- the pages' setups ------------------------------------------------------------------------


@dataclass
class Context:
    dsn: str
    server_dsn: str
    client: Client
    conn: Connection
    folder: Path
    monkeypatch: pytest.MonkeyPatch


@dataclass
class Setup:
    """What a page's examples assume: ``names`` to start their namespace with, the final state
    expected of each task's jobs (default ``completed``), and a last step after the blocks."""

    names: dict[str, Any] = field(default_factory=dict)
    expect: dict[str, str] = field(default_factory=dict)
    then: Callable[[dict[str, Any]], None] | None = None


def resize_helpers(ctx: Context) -> Setup:
    """The resize task's helpers: an image of three tiles, each rendered by doing nothing."""

    def tiles(image_id: int) -> list[int]:
        return [1, 2, 3]

    def render(tile: int) -> None:
        pass

    return Setup({"tiles": tiles, "render": render})


def tutorial(ctx: Context) -> Setup:
    """``DATABASE_URL`` names the test database; the ``flaky`` task ends dead, by design."""
    ctx.monkeypatch.setenv("DATABASE_URL", ctx.dsn)
    return Setup(expect={"flaky": "dead"})


def app_and_client(ctx: Context) -> Setup:
    """An ``app`` to define tasks on, ``miniqueue`` imported, and a ``client`` on the test database."""
    return Setup({"app": miniqueue.App(), "miniqueue": miniqueue, "client": ctx.client})


def keys_page(ctx: Context) -> Setup:
    """As :func:`app_and_client`; the debounced jobs are made due before the page's jobs run
    (their run-at is seconds after the enqueue)."""

    def then(names: dict[str, Any]) -> None:
        ctx.conn.execute("UPDATE miniqueue_jobs SET scheduled_at = now() WHERE state = 'available'")

    return Setup({**app_and_client(ctx).names}, then=then)


def enqueue_page(ctx: Context) -> Setup:
    """An ``orders`` table for the transactional enqueue to insert into."""
    ctx.conn.execute("DROP TABLE IF EXISTS orders")
    ctx.conn.execute("CREATE TABLE orders (id BIGINT PRIMARY KEY)")

    def then(names: dict[str, Any]) -> None:
        ctx.conn.execute("DROP TABLE orders")

    return Setup(then=then)


def results_page(ctx: Context) -> Setup:
    """An ``app`` with the tasks the chain and the group name: ``fetch`` returns a page,
    ``parse`` and ``store`` pass on their parent's result, ``resize`` returns its image,
    ``notify`` checks it got every ``resize``'s result; ``images`` to resize."""
    app = miniqueue.App()

    @app.task("fetch")
    def fetch(job: miniqueue.Job) -> str:
        return f"<html>{job.payload['url']}</html>"

    @app.task("parse")
    def parse(job: miniqueue.Job) -> Any:
        return job.parent_result

    @app.task("store")
    def store(job: miniqueue.Job) -> Any:
        assert job.parent_result == "<html>https://example.com/</html>"
        return job.parent_result

    @app.task("resize")
    def resize(job: miniqueue.Job) -> Any:
        return job.payload["image"]

    @app.task("notify")
    def notify(job: miniqueue.Job) -> None:
        assert sorted(job.parent_results.values()) == [1, 2, 3]

    names = app_and_client(ctx).names
    names.update(app=app, JobSpec=JobSpec, images=[1, 2, 3], u="https://example.com/")
    return Setup(names)


def transactions_page(ctx: Context) -> Setup:
    """An ``app``, and an ``accounts`` table with account 1; afterwards a ``credit`` job is
    enqueued (it runs with the page's jobs) and must have credited the account once."""
    ctx.conn.execute("DROP TABLE IF EXISTS accounts")
    ctx.conn.execute("CREATE TABLE accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)")
    ctx.conn.execute("INSERT INTO accounts VALUES (1, 100)")

    def then(names: dict[str, Any]) -> None:
        names["app"].enqueue(ctx.client, "credit", {"amount": 5, "account": 1})
        names["run_jobs"](names["app"], ctx.client)
        balance = ctx.conn.execute("SELECT balance FROM accounts WHERE id = 1").fetchone()
        ctx.conn.execute("DROP TABLE accounts")
        assert balance == (105,)

    names = app_and_client(ctx).names
    names["run_jobs"] = run_jobs
    return Setup(names, then=then)


def sqlalchemy_page(ctx: Context) -> Setup:
    """A SQLAlchemy ``engine`` on the test database (``postgresql+psycopg://``), ``Session``,
    an ``Order`` model on an ``orders`` table, a ``client`` and ``jobs`` (one JobSpec)."""

    class Base(DeclarativeBase):
        pass

    class Order(Base):
        __tablename__ = "orders"
        id: Mapped[int] = mapped_column(primary_key=True)

    engine = create_engine(sqlalchemy_url(ctx.dsn))
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)

    def then(names: dict[str, Any]) -> None:
        stored = ctx.conn.execute("SELECT task, payload FROM miniqueue_jobs ORDER BY id").fetchall()
        Base.metadata.drop_all(engine)
        engine.dispose()
        assert stored == [("send_receipt", {"order": 8}), ("send_receipt", {"order": 9})]

    names = {"engine": engine, "Session": Session, "Order": Order, "client": ctx.client}
    names["jobs"] = [JobSpec("send_receipt", {"order": 9})]
    return Setup(names, then=then)


def dashboard_page(ctx: Context) -> Setup:
    """A ``client``, an ``is_admin`` check, and a ``myproject.tasks`` module with an ``app``."""
    package = ctx.folder / "myproject"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text("import miniqueue\n\napp = miniqueue.App()\n")
    ctx.monkeypatch.syspath_prepend(str(ctx.folder))
    for name in [name for name in sys.modules if name.split(".")[0] == "myproject"]:
        ctx.monkeypatch.delitem(sys.modules, name)
    return Setup({"client": ctx.client, "is_admin": lambda request: True})


MYPROJECT_FOR_TESTING = {
    "myproject/__init__.py": "",
    "myproject/tasks.py": (
        "import miniqueue\n\napp = miniqueue.App()\n\n\n"
        '@app.task("welcome", queue="mail")\ndef welcome(job: miniqueue.Job) -> None:\n    pass\n'
    ),
    "myproject/accounts.py": (
        "import miniqueue\n\n\ndef sign_up(client: miniqueue.Client, user: str) -> None:\n"
        '    client.enqueue("welcome", {"user": user})\n'
    ),
}


def kit_page(ctx: Context) -> Setup:
    """A project whose ``myproject.accounts.sign_up`` enqueues a ``welcome`` job by task name;
    the page's ``conftest.py`` and ``test_signup.py`` are run by pytest there, on this server."""
    for name, text in MYPROJECT_FOR_TESTING.items():
        (ctx.folder / name).parent.mkdir(exist_ok=True)
        (ctx.folder / name).write_text(text)

    def then(names: dict[str, Any]) -> None:
        env = {**os.environ, "TEST_DATABASE_URL": ctx.server_dsn, "PYTHONPATH": str(ctx.folder)}
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "test_signup.py"]
        done = subprocess.run(command, cwd=ctx.folder, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "1 passed" in done.stdout, done.stdout

    return Setup(then=then)


SHARD_NAMES = ("main", "mail", "events")


def shards_page(ctx: Context) -> Setup:
    """The page's map in ``$MINIQUEUE_SHARDS``: three databases of the test server, the page's own
    (joining a map is for good), migrated and joined (its shell block, which would do it, starts
    workers too)."""
    dsns = {name: testing_db.create_database(ctx.server_dsn, prefix=f"miniqueue_docs_{name}") for name in SHARD_NAMES}
    shards = {
        "databases": {name: {"url": dsn, "index": i} for i, (name, dsn) in enumerate(dsns.items())},
        "queues": {"emails": ["mail"], "clicks": ["main", "events"]},
    }
    migrate_shards(ShardMap.parse(shards))
    ctx.monkeypatch.setenv("MINIQUEUE_SHARDS", json.dumps(shards))

    def then(names: dict[str, Any]) -> None:
        names["client"].close()
        for dsn in dsns.values():
            testing_db.drop_database(ctx.server_dsn, dsn)

    return Setup(then=then)


SETUPS: dict[str, Callable[[Context], Setup]] = {
    "README.md": resize_helpers,
    "docs/guides/tasks.md": resize_helpers,
    "docs/tutorial.md": tutorial,
    "docs/guides/enqueue.md": enqueue_page,
    "docs/guides/limits.md": app_and_client,
    "docs/guides/fairness.md": app_and_client,
    "docs/guides/keys.md": keys_page,
    "docs/guides/durable.md": app_and_client,
    "docs/guides/middleware.md": app_and_client,
    "docs/guides/periodic.md": app_and_client,
    "docs/guides/results.md": results_page,
    "docs/guides/transactions.md": transactions_page,
    "docs/guides/django-sqlalchemy.md": sqlalchemy_page,
    "docs/operations/dashboard.md": dashboard_page,
    "docs/guides/testing.md": kit_page,
    "docs/guides/shards.md": shards_page,
}


# --- running them -----------------------------------------------------------------------------


def with_test_dsn(code: str, dsn: str) -> str:
    for placeholder in PLACEHOLDER_DSNS:
        code = code.replace(placeholder, dsn)
    return code


def apps(names: dict[str, Any]) -> list[miniqueue.App]:
    return [value for value in names.values() if isinstance(value, miniqueue.App) and value.tasks]


def run_python(example: Example, names: dict[str, Any], dsn: str) -> None:
    exec(compile(with_test_dsn(example.code, dsn), example.where, "exec"), names)


def run_python_with_workers(example: Example, names: dict[str, Any], ctx: Context) -> None:
    """Run the block on a thread while the page's apps run the queued jobs, until it returns."""
    failure: list[BaseException] = []

    def block() -> None:
        try:
            run_python(example, names, ctx.dsn)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=block, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while thread.is_alive() and time.monotonic() < deadline:
        for app in apps(names):
            run_jobs(app, ctx.client)
        thread.join(0.02)
    assert not thread.is_alive(), f"{example.where} did not return within 30 s"
    if failure:
        raise failure[0]


def run_shell(example: Example, ctx: Context) -> None:
    code = with_test_dsn(example.code, ctx.dsn)
    if example.language == "console":  # the commands are the lines after "$ "
        code = "\n".join(line[2:] for line in code.splitlines() if line.startswith("$ ")) + "\n"
    env = {**os.environ, "DATABASE_URL": ctx.dsn}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code],
        cwd=ctx.folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"{example.where} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"


def run_same_as(example: Example, path: str) -> None:
    """The block is the file's code after its docstring and ``from __future__`` line."""
    text = (ROOT / path).read_text()
    future = "from __future__ import annotations\n\n"
    assert future in text, f"{path} has no {future.strip()!r} line to start the comparison after"
    assert example.code == text.split(future, 1)[1], f"{example.where} differs from {path}"


PAGE_EXAMPLES = {str(page.relative_to(ROOT)): examples(page) for page in PAGES}


def test_every_marker_is_known_and_gives_its_reason() -> None:
    for found in PAGE_EXAMPLES.values():
        for example in found:
            if example.marker is None:
                continue
            assert example.marker.startswith(KINDS), f"{example.where}: unknown marker {example.marker!r}"
            reason = example.marker.split(":", 1)[1].strip() if ":" in example.marker else ""
            if example.marker.startswith(("not run: ", "workers: ")):
                assert len(reason) > 10, f"{example.where}: say why it is not run"
            if example.marker == "with workers":
                assert example.language == "python", f"{example.where}: 'with workers' is for Python"
            if example.marker.startswith("workers: "):
                assert "miniqueue-supervise" in example.code, f"{example.where}: starts no workers"


@pytest.fixture
def context(
    dsn: str, server_dsn: str, client: Client, conn: Connection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Context:
    return Context(dsn, server_dsn, client, conn, tmp_path, monkeypatch)


@pytest.fixture
def names() -> Iterator[dict[str, Any]]:
    found: dict[str, Any] = {"__name__": "docs_example"}
    yield found
    for value in found.values():  # the clients the examples opened and left open
        if isinstance(value, Client):
            value.close()


@pytest.mark.parametrize("page", [page for page, found in PAGE_EXAMPLES.items() if found])
def test_the_examples_of(page: str, context: Context, names: dict[str, Any]) -> None:
    setup = SETUPS[page](context) if page in SETUPS else Setup()
    run_page(page, PAGE_EXAMPLES[page], setup, context, names)


def run_page(page: str, found: list[Example], setup: Setup, context: Context, names: dict[str, Any]) -> None:
    names.update(setup.names)
    for example in found:
        marker = example.marker or ""
        if marker.startswith("not run: "):
            continue
        if marker.startswith("workers: "):
            for app in apps(names):
                context.client.declare(app)
        elif marker.startswith("file "):
            (context.folder / marker.removeprefix("file ")).write_text(example.code)
        elif marker.startswith("same as "):
            run_same_as(example, marker.removeprefix("same as "))
        elif example.language == "python" and marker == "with workers":
            run_python_with_workers(example, names, context)
        elif example.language == "python":
            run_python(example, names, context.dsn)
        else:
            run_shell(example, context)
    if setup.then is not None:
        setup.then(names)
    for app in apps(names):
        result = run_jobs(app, context.client)
        assert result.stopped_by == "idle", result.summary()
    stored = context.conn.execute("SELECT id, task, queue, state FROM miniqueue_jobs ORDER BY id").fetchall()
    if apps(names):
        wrong = [job for job in stored if job[3] != setup.expect.get(job[1], "completed")]
        assert not wrong, f"jobs of {page} that no worker of its app completed (id, task, queue, state): {wrong}"


def test_a_job_in_a_queue_no_worker_of_the_app_serves_fails_its_page(context: Context, names: dict[str, Any]) -> None:
    tasks = 'app = miniqueue.App()\n\n@app.task("resize", queue="images")\ndef resize(job): ...\n'
    enqueue = 'client.enqueue("resize", {"image_id": 42}, queue="image")   # a typo\n'
    found = [Example("page.md", 1, "python", tasks, None), Example("page.md", 9, "python", enqueue, None)]
    with pytest.raises(AssertionError, match=r"\(1, 'resize', 'image', 'available'\)"):
        run_page("page.md", found, Setup({"miniqueue": miniqueue, "client": context.client}), context, names)


def test_every_block_is_collected() -> None:
    """No fenced block in the languages above escapes the collector (an indented one, say)."""
    for page in PAGES:
        fences = re.findall(r"^\s*```(\w+)", page.read_text(), re.M)
        expected = sum(language in LANGUAGES for language in fences)
        assert len(PAGE_EXAMPLES[str(page.relative_to(ROOT))]) == expected, page
