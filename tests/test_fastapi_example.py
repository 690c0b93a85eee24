"""examples/fastapi_app.py, as the README shows it: real requests through FastAPI's TestClient
(the app's lifespan, its pool, its transactions), then its async task run by a real worker."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from fastapi.testclient import TestClient

from miniqueue import Client
from miniqueue.db import Connection
from miniqueue.testing import run_jobs

from .helpers import count, row


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
            "send_welcome", "emails", {"user_id": ada["user"]}, "available",
        )  # fmt: skip

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


def test_the_readme_shows_the_example_as_it_is(repo_root: Path) -> None:
    code = (repo_root / "examples" / "fastapi_app.py").read_text()
    body = code[code.index("import os") :]  # after the docstring and the __future__ import
    assert body in (repo_root / "README.md").read_text(), "README's Async section differs from examples/fastapi_app.py"
