"""A rolling deploy from the previous version's code, as users run one: the old version's workers
drain while the new version migrates the database, the new version's workers start beside them,
then the old supervisor gets TERM. Nothing is lost and no transactional effect runs twice.

The previous version is taken from this repository's history (``git archive``), so the test runs
in a git checkout; from an sdist, which has no history, it is skipped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
import textwrap
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path

import pytest

from miniqueue import Client, JobSpec
from miniqueue.core.db import Connection, connect
from miniqueue.store.migrate import latest_version, run_migrations
from miniqueue.store.store import Store

from ..helpers import count, wait_until
from ..supervised import FAST, Supervised

#: The version before the claim was rebuilt (its schema ends at migration 029): the code users
#: run when they deploy this one.
PREVIOUS = "850e0df680a29f4c7b8063dd02fedb674b061a1e"
PREVIOUS_SCHEMA = 29
ROOT = Path(__file__).resolve().parents[2]
JOBS = 1200

APP = textwrap.dedent(
    """
    import time

    import miniqueue
    from miniqueue import App

    app = App()
    VERSION = "previous" if "previous" in miniqueue.__file__ else "current"


    @app.task("deploy_effect", queue="deploy", max_attempts=3)
    def deploy_effect(job):
        time.sleep(0.005)
        with job.transaction() as conn:
            conn.execute(
                "INSERT INTO deploy_effects (job_id, version, pid) VALUES (%s, %s, pg_backend_pid())",
                [job.id, VERSION],
            )
    """
)

#: The previous version's producer: half the jobs, enqueued by its own client.
PREVIOUS_PRODUCER = (
    "import os; from miniqueue import Client, JobSpec\n"
    "with Client(os.environ['DATABASE_URL']) as client:\n"
    f"    client.enqueue_many([JobSpec('deploy_effect', {{'n': n}}, queue='deploy') for n in range({JOBS // 2})])\n"
)


@pytest.fixture(scope="module")
def previous_version(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous version's package and migrations, unpacked from this repository's history."""
    if not (ROOT / ".git").exists():
        pytest.skip("the previous version comes from the repository's history: run it from a git checkout")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", PREVIOUS, "miniqueue", "migrations"],
        capture_output=True,
        check=False,
    )
    assert archive.returncode == 0, (
        f"commit {PREVIOUS[:7]} (the previous version) is not in this checkout: "
        f"{archive.stderr.decode(errors='replace').strip()} (a shallow clone? fetch its history)"
    )
    folder = tmp_path_factory.mktemp("previous")
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    return folder


@pytest.fixture
def deploy(fresh_database: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The test's database and a folder holding the app's module (``deploy_app``)."""
    (tmp_path / "deploy_app.py").write_text(APP, encoding="utf-8")
    yield fresh_database, tmp_path


def previous_env(previous: Path, dsn: str) -> dict[str, str]:
    """The environment that runs the previous version: its package first on the path."""
    return {**os.environ, "PYTHONPATH": str(previous), "DATABASE_URL": dsn}


def run_previous(previous: Path, dsn: str, cwd: Path, *args: str) -> str:
    """``python ARGS`` with the previous version's package; its output."""
    done = subprocess.run(
        [sys.executable, *args],
        env=previous_env(previous, dsn),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def supervise(dsn: str, folder: Path, cwd: Path, name: str, env: dict[str, str] | None = None) -> Supervised:
    args = ["--app", "deploy_app:app", "--workers", "2", "--queues", "deploy", *FAST]
    return Supervised(dsn, args, folder / name, cwd, env=env)


def effects(conn: Connection) -> dict[str, int]:
    """How many effects each version's workers committed."""
    rows = conn.execute("SELECT version, count(*) FROM deploy_effects GROUP BY version").fetchall()
    return {str(version): int(n) for version, n in rows}


def test_a_rolling_deploy_from_the_previous_version_loses_nothing_and_runs_each_effect_once(
    previous_version: Path, deploy: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    dsn, app_folder = deploy
    logs = tmp_path_factory.mktemp("deploy-logs")
    said = run_previous(previous_version, dsn, app_folder, "-m", "miniqueue.cli", "migrate")
    with connect(dsn, purpose="test") as conn:
        assert Store().schema_version(conn) == PREVIOUS_SCHEMA, said
        conn.execute("CREATE TABLE deploy_effects (job_id bigint, version text, pid int)")
        # The old version's producers enqueue; its workers start draining.
        run_previous(previous_version, dsn, app_folder, "-c", PREVIOUS_PRODUCER)
        old = supervise(dsn, logs, app_folder, "previous", env=previous_env(previous_version, dsn))
        try:
            old.wait_ready(workers=2)
            wait_until(lambda: effects(conn).get("previous", 0) >= 50, timeout=30, what="the old workers draining")

            # The new version migrates while the old workers drain, and its producers enqueue.
            run_migrations(dsn)
            assert Store().schema_version(conn) == latest_version()
            with Client(dsn) as client:
                client.enqueue_many([JobSpec("deploy_effect", {"n": n}, queue="deploy") for n in range(JOBS // 2)])
            new = supervise(dsn, logs, app_folder, "current")
            try:
                new.wait_ready(workers=2)
                wait_until(lambda: effects(conn).get("current", 0) >= 50, timeout=30, what="the new workers draining")
                # Then TERM to the old supervisor: its jobs are finished or handed back, unspent.
                old.proc.send_signal(signal.SIGTERM)
                assert old.proc.wait(timeout=30) == 0, old.output()[-3000:]
                wait_until(
                    lambda: count(conn, "state = 'completed'") == JOBS,
                    timeout=90,
                    what=f"all {JOBS} jobs completed",
                )
            finally:
                new.stop()
        finally:
            old.stop()
        doubled = conn.execute(
            "SELECT count(*) FROM (SELECT job_id FROM deploy_effects GROUP BY job_id HAVING count(*) > 1) d"
        ).fetchone()
        assert doubled == (0,), "a transactional effect ran twice"
        assert conn.execute("SELECT count(DISTINCT job_id) FROM deploy_effects").fetchone() == (JOBS,)
        assert count(conn) == JOBS and count(conn, "state <> 'completed'") == 0, "a job was lost or went wrong"
        done_by = effects(conn)
        assert done_by.get("previous", 0) > 0 and done_by.get("current", 0) > 0, done_by
        for supervised in (old, new):
            assert "Traceback" not in supervised.output(), supervised.output()[-3000:]
