"""examples/fastapi_app.py, as docs/guides/async.md shows it: real requests through FastAPI's TestClient
(the app's lifespan, its pool, its transactions), then its async task run by a real worker."""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from fastapi.testclient import TestClient

from miniqueue import Client
from miniqueue.core.db import Connection
from miniqueue.testing import run_jobs

from ..helpers import count, row, wait_until
from ..serving import listening, start, stop
from ..supervised import free_port


@pytest.fixture
def example(dsn: str, conn: Connection, repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("DATABASE_URL", dsn)
    monkeypatch.syspath_prepend(str(repo_root))
    conn.execute("DROP TABLE IF EXISTS users")  # the example's own table
    yield importlib.import_module("examples.fastapi_app")
    conn.execute("DROP TABLE IF EXISTS users")


def user(conn: Connection, email: str) -> tuple[int, int, object] | None:
    found = conn.execute("SELECT id, referrals, welcomed_at FROM users WHERE email = %s", [email]).fetchone()
    return None if found is None else (found[0], found[1], found[2])


def test_the_endpoint_enqueues_in_its_own_transaction(example: ModuleType, conn: Connection, client: Client) -> None:
    with TestClient(example.api) as http:
        created = http.post("/signups", json={"email": "ada@example.com"})
        assert created.status_code == 201, created.text
        ada = created.json()
        job = row(conn, ada["job"])
        assert (job["task"], job["queue"], job["payload"], job["state"]) == (
            "send_welcome",
            "emails",
            {"user_id": ada["user"]},
            "available",
        )

        # A referrer nobody has: the endpoint raises inside its transaction, so the user it
        # inserted and the job it enqueued are both rolled back.
        refused = http.post("/signups", json={"email": "bob@example.com", "referrer": "nobody@example.com"})
        assert refused.status_code == 422, refused.text
        assert user(conn, "bob@example.com") is None
        assert count(conn) == 1

        referred = http.post("/signups", json={"email": "cy@example.com", "referrer": "ada@example.com"})
        assert referred.status_code == 201, referred.text
        assert count(conn) == 2
        assert user(conn, "ada@example.com") == (ada["user"], 1, None)

    result = run_jobs(example.tasks, client)
    assert len(result.completed) == 2 and not result.failed and not result.dead
    for email in ("ada@example.com", "cy@example.com"):
        found = user(conn, email)
        assert found is not None and found[2] is not None, f"{email} was not welcomed"


def test_signing_up_twice_answers_409(example: ModuleType, conn: Connection) -> None:
    with TestClient(example.api) as http:
        first = http.post("/signups", json={"email": "ada@example.com"})
        assert first.status_code == 201, first.text
        again = http.post("/signups", json={"email": "ada@example.com"})
        assert again.status_code == 409, again.text
        assert again.json() == {"detail": "'ada@example.com' has already signed up"}
        assert count(conn) == 1  # no second welcome
        assert user(conn, "ada@example.com") == (first.json()["user"], 0, None)

        # The pool's connection is fine after the refusal, and a referral still counts once.
        referred = http.post("/signups", json={"email": "bob@example.com", "referrer": "ada@example.com"})
        assert referred.status_code == 201, referred.text
        assert count(conn) == 2 and user(conn, "ada@example.com") == (first.json()["user"], 1, None)


def post(url: str, body: dict[str, str]) -> tuple[int, dict[str, object]]:
    """A real HTTP POST of JSON; the status and the decoded answer."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_served_as_the_docstring_says(dsn: str, conn: Connection, repo_root: Path, tmp_path: Path) -> None:
    """The documented commands, run from the repository root: ``uvicorn examples.fastapi_app:api``
    (on a free port rather than 8000) and ``miniqueue-supervise --app examples.fastapi_app:tasks``."""
    code = (repo_root / "examples" / "fastapi_app.py").read_text()
    page = (repo_root / "docs" / "guides" / "async.md").read_text()
    for command in ("uvicorn examples.fastapi_app:api", "miniqueue-supervise --app examples.fastapi_app:tasks"):
        assert command in code and command in page, command
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "DATABASE_URL": dsn, "PYTHONPATH": str(repo_root)}
    port = free_port()
    conn.execute("DROP TABLE IF EXISTS users")
    serve = [str(bin_dir / "uvicorn"), "examples.fastapi_app:api", "--port", str(port)]
    supervise = [str(bin_dir / "miniqueue-supervise"), "--app", "examples.fastapi_app:tasks", "--workers", "1"]
    server, workers = start(serve, tmp_path / "uvicorn.log", env), start(supervise, tmp_path / "supervise.log", env)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: listening(f"{base}/docs", server, tmp_path / "uvicorn.log"), timeout=30, what="uvicorn")
        status, created = post(f"{base}/signups", {"email": "ada@example.com"})
        assert status == 201, created
        assert post(f"{base}/signups", {"email": "ada@example.com"}) == (
            409,
            {"detail": "'ada@example.com' has already signed up"},
        )
        wait_until(lambda: (user(conn, "ada@example.com") or (0, 0, None))[2], timeout=30, what="the welcome")
        assert row(conn, int(str(created["job"])))["state"] == "completed"
    finally:
        served, supervised = stop(server), stop(workers)
        conn.execute("DROP TABLE IF EXISTS users")
    # uvicorn shuts down (the lifespan closes the pool), then re-raises the SIGTERM it caught.
    served_log = (tmp_path / "uvicorn.log").read_text()
    assert served == -signal.SIGTERM and "Application shutdown complete." in served_log, served_log
    assert supervised == 0, (tmp_path / "supervise.log").read_text()


def test_the_docs_show_the_example_as_it_is(repo_root: Path) -> None:
    code = (repo_root / "examples" / "fastapi_app.py").read_text()
    body = code[code.index("import os") :]  # after the docstring and the __future__ import
    page = (repo_root / "docs" / "guides" / "async.md").read_text()
    assert body in page, "docs/guides/async.md differs from examples/fastapi_app.py"
