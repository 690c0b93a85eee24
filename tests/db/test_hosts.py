"""Several hosts, one database: two supervisors with different host identities drain one queue,
and one of them is SIGKILLed with all its children mid-run (a host lost whole). Nothing is lost,
nothing completes twice, and the survivor's reaper returns the lost host's jobs at lease expiry."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from miniqueue import Client, JobSpec
from miniqueue.core.db import Connection

from ..helpers import count, wait_until
from ..supervised import FAST, Supervised

APP = "tests.apps.supervised:app"
JOBS = 300


def start(dsn: str, host: str, folder: Path, cwd: Path) -> Supervised:
    env = {**os.environ, "MINIQUEUE_HOST": host}
    return Supervised(dsn, ["--app", APP, "--workers", "2", *FAST], folder / host, cwd, env=env)


@pytest.mark.timeout(90)
def test_a_host_lost_whole_mid_run_loses_nothing(
    dsn: str, tmp_path: Path, repo_root: Path, client: Client, executions: Connection
) -> None:
    conn = executions
    hosts = {name: start(dsn, name, tmp_path, repo_root) for name in ("host-a", "host-b")}
    try:
        for supervised in hosts.values():
            supervised.wait_ready(2)
        wait_until(
            lambda: conn.execute("SELECT count(DISTINCT host) FROM miniqueue_processes").fetchone() == (2,),
            what="both hosts in the process registry",
        )
        client.enqueue_many([JobSpec("work", {"sleep_on": [1], "seconds": 0.05}) for _ in range(JOBS)])
        running_on_a = "state = 'running' AND leased_by LIKE 'host-a:%%'"
        wait_until(
            lambda: count(conn, running_on_a) > 0 and count(conn, "state = 'completed'") >= 50, what="host-a mid-run"
        )
        hosts["host-a"].stop()  # SIGKILL to the supervisor and every child: the host is gone
        wait_until(lambda: count(conn, "state = 'completed'") == JOBS, timeout=60, what="the survivor finished")
    finally:
        for supervised in hosts.values():
            supervised.stop()
    assert count(conn, "true") == JOBS and count(conn, "state <> 'completed'") == 0
    per_attempt = conn.execute("SELECT job_id, attempt, count(*) FROM executions GROUP BY 1, 2 HAVING count(*) > 1")
    assert per_attempt.fetchall() == [], "an attempt ran twice"
    # The jobs the lost host held: the survivor's reaper returned each at lease expiry.
    recovered = {
        row[0]
        for row in conn.execute(
            "SELECT id FROM miniqueue_jobs WHERE EXISTS"
            " (SELECT 1 FROM jsonb_array_elements(errors) e WHERE e->>'error' LIKE 'worker lost%%')"
        )
    }
    assert recovered, "the kill found host-a holding jobs"
    rerun = {row[0] for row in conn.execute("SELECT job_id FROM executions GROUP BY 1 HAVING count(*) > 1")}
    assert rerun <= recovered, "a job ran again only because its host was lost"
    # (host-b's history may hold prefetched jobs it handed back unstarted: that is not a loss.)
    losers = conn.execute(
        "SELECT DISTINCT e->>'worker' FROM miniqueue_jobs, jsonb_array_elements(errors) e"
        " WHERE e->>'error' LIKE 'worker lost%%'"
    )
    assert {row[0].split(":")[0] for row in losers} == {"host-a"}, "only the lost host's leases were lost"
