"""Two apps on one database and one queue, each under a real miniqueue-supervise: a worker never
spends an attempt on a job of a task its app does not declare. It hands the job back, uncharged,
for the app that declares it; and ``miniqueue jobs why`` names a task no live worker declares."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from miniqueue import Client, JobSpec
from miniqueue.cli.main import main
from miniqueue.core.db import Connection

from ..helpers import count, wait_until
from ..supervised import Fleet, StartSupervisor


@pytest.fixture
def supervise(dsn: str, conn: Connection, tmp_path: Path, repo_root: Path) -> Iterator[StartSupervisor]:
    conn.execute("DROP TABLE IF EXISTS runs")
    conn.execute("CREATE TABLE runs (job_id BIGINT, app TEXT, task TEXT)")
    with Fleet(dsn, tmp_path, repo_root, "tests.apps.two_apps:app_a") as fleet:
        yield fleet.start


def test_two_apps_on_one_queue_run_only_their_own_tasks_and_charge_nothing_for_the_others(
    dsn: str, supervise: StartSupervisor, client: Client, conn: Connection
) -> None:
    tasks = ["a1", "a2", "b1"]
    client.enqueue_many([JobSpec(tasks[n % 3], {"n": n}, queue="shared", max_attempts=3) for n in range(3000)])
    first = supervise(app="tests.apps.two_apps:app_a", workers=1)
    second = supervise(app="tests.apps.two_apps:app_b", workers=1)
    first.wait_ready(1)
    second.wait_ready(1)
    wait_until(lambda: count(conn, "state = 'completed'") == 3000, timeout=120, what="every job completed")
    runs = conn.execute("SELECT app, task, count(*), count(DISTINCT job_id) FROM runs GROUP BY 1, 2 ORDER BY 1, 2")
    assert runs.fetchall() == [("a", "a1", 1000, 1000), ("a", "a2", 1000, 1000), ("b", "b1", 1000, 1000)]
    charged = "attempt_budget - (max_attempts - attempt)"
    assert count(conn, f"{charged} <> 1") == 0, "each job was charged its one run, none for a hand-back"
    # No error but a hand-back of a prefetched job (a loaded machine's handlers outlive the
    # prefetch budget), which charges nothing.
    failed = "EXISTS (SELECT FROM jsonb_array_elements(errors) e WHERE e::text NOT LIKE '%attempt not charged%')"
    assert count(conn, f"state = 'dead' OR errors IS NOT NULL AND {failed}") == 0

    orphan = client.enqueue("c1", queue="shared").id
    wait_until(
        lambda: conn.execute("SELECT count(*) FROM miniqueue_processes WHERE tasks IS NOT NULL").fetchone() == (2,),
        what="both workers registered with their tasks",
    )
    said = CliRunner().invoke(main, ["jobs", "why", str(orphan), "--database-url", dsn], env={"DATABASE_URL": None})
    assert said.exit_code == 0, said.output
    assert "No live worker runs task 'c1': the 2 live workers of queue 'shared' declare 'a1', 'a2', 'b1'" in said.output

    stats = CliRunner().invoke(main, ["stats", "--database-url", dsn], env={"DATABASE_URL": None})
    assert stats.exit_code == 0, stats.output
    assert "no live worker runs task 'c1', whose job is next in queue 'shared'" in stats.output

    enqueue = ["enqueue", "--queue", "shared", "--strict", "--database-url", dsn]
    refused = CliRunner().invoke(main, [*enqueue[:1], "c2", *enqueue[1:]], env={"DATABASE_URL": None})
    assert refused.exit_code == 1, refused.output
    assert "task 'c2' is declared by no app on this database: nothing enqueued" in refused.output
    assert count(conn, "task = 'c2'") == 0
    accepted = CliRunner().invoke(main, [*enqueue[:1], "a1", *enqueue[1:]], env={"DATABASE_URL": None})
    assert accepted.exit_code == 0 and "enqueued" in accepted.output, accepted.output
