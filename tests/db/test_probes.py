"""Health probes, the process registry and systemd notifications, against a running supervisor."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from miniqueue import Client
from miniqueue.core.db import Connection

from ..helpers import row, wait_until
from ..serving import run_miniqueue
from ..supervised import FAST, Supervised, free_port

APP = "tests.apps.supervised:app"
CROWD = 20  # connections at once: well over the HTTP server's cap


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def status(port: int, path: str) -> int | None:
    """The status of one quick GET, or None if the server refused, dropped or did not answer it in 1 s."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=1) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, http.client.HTTPException):
        return None


def holder(conn: Connection, job_id: int) -> int | None:
    """The pid of the worker holding a running job."""
    leased_by = row(conn, job_id)["leased_by"]
    return int(leased_by.split(":")[1]) if leased_by else None


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server ends the connection within 5 s (a reset counts)."""
    sock.settimeout(5)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


class SlowClient:
    """Keeps a request head trickling into the metrics port, one byte every 0.3 s, never ending
    it; reconnects whenever the server cuts it off, and counts the cuts."""

    def __init__(self, port: int) -> None:
        self.port, self.sent, self.cuts = port, 0, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.trickle, daemon=True)
        self.thread.start()

    def trickle(self) -> None:
        while not self.done.is_set():
            with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
                sock.sendall(b"GET /livez HTTP/1.1\r\nX-Slow: ")
                sock.settimeout(0.3)
                try:
                    while not self.done.is_set():
                        try:
                            sock.recv(1)  # data or EOF: the server stopped waiting for us
                            break
                        except TimeoutError:
                            sock.sendall(b"a")
                            self.sent += 1
                except OSError:
                    pass
            if not self.done.is_set():
                self.cuts += 1

    def stop(self) -> None:
        self.done.set()
        self.thread.join(5)


@pytest.fixture
def supervised(dsn: str, tmp_path: Path, repo_root: Path, executions: Connection) -> Iterator[tuple[Supervised, int]]:
    conn = executions
    conn.execute("TRUNCATE miniqueue_processes")
    port = free_port()
    sup = Supervised(
        dsn,
        ["--app", APP, "--workers", "2", "--metrics-port", str(port), "--metrics-interval", "0.2", *FAST],
        tmp_path / "supervisor",
        repo_root,
        env={**os.environ, "WATCHDOG_USEC": "1000000"},
    )
    sup.wait_ready(2)
    yield sup, port
    sup.stop()


def test_livez_and_readyz_are_200_when_running(supervised: tuple[Supervised, int]) -> None:
    _, port = supervised
    assert get(port, "/livez") == (200, "ok\n")
    assert wait_until(lambda: get(port, "/readyz") == (200, "ok\n"), what="ready")


def test_a_slow_client_holds_up_neither_recovery_nor_livez(
    supervised: tuple[Supervised, int], client: Client, conn: Connection
) -> None:
    """The HTTP endpoints live off the supervisor's loop: while a client trickles a request into
    the metrics port, a SIGKILLed worker is still replaced and its job released at once (the
    reaper would take the 5 s lease and more), and the slow client is cut off at the deadline."""
    sup, port = supervised
    job_id = client.enqueue("work", {"sleep_on": [1], "seconds": 30}).id
    pid = wait_until(lambda: holder(conn, job_id), what="the job running")
    slow = SlowClient(port)
    try:
        wait_until(lambda: slow.sent >= 2, what="the slow client trickling")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: len(sup.workers()) == 2 and pid not in sup.workers(), timeout=5, what="worker replaced")
        stored = wait_until(lambda: (r := row(conn, job_id))["errors"] and r, timeout=5, what="the job released")
        assert stored["errors"][0]["error"] == f"worker process died: SIGKILL (pid {pid})"
        assert stored["state"] in ("available", "running", "completed")
        assert get(port, "/livez") == (200, "ok\n")
        wait_until(lambda: slow.cuts >= 1, timeout=5, what="the slow client cut off")
    finally:
        slow.stop()


def test_more_connections_than_the_cap_do_not_stall_livez(supervised: tuple[Supervised, int]) -> None:
    """Connections over the cap are closed at once, the rest at the request deadline: /livez gets
    through within seconds however many idle connections are open."""
    _, port = supervised
    crowd = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(CROWD)]
    try:
        wait_until(lambda: status(port, "/livez") == 200, timeout=5, what="/livez through the crowd")
        assert all(closed_by_server(sock) for sock in crowd)
    finally:
        for sock in crowd:
            sock.close()


def test_a_scrape_never_waits_on_the_database(supervised: tuple[Supervised, int], dsn: str, conn: Connection) -> None:
    """/metrics serves the reaper's latest reading of the queue gauges: while the jobs table is
    locked, scrapes and /livez still answer at once, and the gauges say the database is down."""
    _, port = supervised
    wait_until(lambda: "miniqueue_database_up 1.0" in get(port, "/metrics")[1], what="a first reading")
    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE miniqueue_jobs IN ACCESS EXCLUSIVE MODE")
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'miniqueue:gauges' "
            "AND wait_event_type = 'Lock'"
        )
        wait_until(lambda: conn.execute(waiting).fetchone() == (1,), what="the reaper's reading waiting on the lock")
        status, body = get(port, "/metrics")
        assert status == 200 and "miniqueue_processes" in body
        assert get(port, "/livez") == (200, "ok\n")
        # Its statement_timeout (5 s) ends the reading; the last one stays, marked as stale.
        wait_until(lambda: "miniqueue_database_up 0.0" in get(port, "/metrics")[1], timeout=15, what="database down")
        locker.rollback()
    wait_until(lambda: "miniqueue_database_up 1.0" in get(port, "/metrics")[1], timeout=15, what="database back")


def test_a_database_outage_turns_readyz_503_while_livez_stays_200(
    supervised: tuple[Supervised, int], server_dsn: str, dsn: str
) -> None:
    _, port = supervised
    name = conninfo_to_dict(dsn)["dbname"]
    wait_until(lambda: get(port, "/readyz")[0] == 200, what="ready before the outage")
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        try:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name])
            # The workers' LISTEN connections drop at once; the registry refresh notices the database.
            wait_until(lambda: get(port, "/readyz")[0] == 503, what="503 once connections drop")
            wait_until(lambda: "database unreachable" in get(port, "/readyz")[1], timeout=20, what="db unreachable")
            assert get(port, "/livez")[0] == 200
        finally:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    wait_until(lambda: get(port, "/readyz")[0] == 200, timeout=20, what="ready again after the outage")


def test_draining_turns_readyz_503(supervised: tuple[Supervised, int], client: Client, conn: Connection) -> None:
    sup, port = supervised
    job_id = client.enqueue("work", {"sleep_on": [1], "seconds": 3}).id
    wait_until(lambda: row(conn, job_id)["state"] == "running", what="job running")
    sup.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: get(port, "/readyz") == (503, "draining\n"), what="draining")
    assert sup.proc.wait(20) == 0


def test_supervisor_registers_its_processes(supervised: tuple[Supervised, int], conn: Connection) -> None:
    sup, _ = supervised

    def registered() -> list[tuple[str, int]]:
        return conn.execute("SELECT kind, pid FROM miniqueue_processes ORDER BY kind, pid").fetchall()

    expected = sorted(
        [("supervisor", sup.proc.pid), ("reaper", sup.reaper() or 0)] + [("worker", pid) for pid in sup.workers()]
    )
    wait_until(lambda: sorted(registered()) == expected, what=f"registry rows {expected}")
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(20) == 0
    assert registered() == [], "a stopping supervisor removes its rows"


def test_registry_shows_running_jobs_and_counts_finished_ones(
    supervised: tuple[Supervised, int], client: Client, conn: Connection
) -> None:
    """Workers tell the supervisor of a job only if it is still running at their next report,
    and send a tally of the jobs they finished: the registry shows both."""
    sup, _ = supervised
    quick = [client.enqueue("work").id for _ in range(25)]
    wait_until(lambda: all(row(conn, i)["state"] == "completed" for i in quick), what="the quick jobs")
    long = client.enqueue("work", {"sleep_on": [1], "seconds": 30}).id
    wait_until(lambda: row(conn, long)["state"] == "running", what="the long job running")

    def workers() -> list[tuple[int, list[int]]]:
        return conn.execute("SELECT jobs_done, current_jobs FROM miniqueue_processes WHERE kind = 'worker'").fetchall()

    wait_until(
        lambda: sorted(current for _, current in workers()) == [[], [long]],
        timeout=20,
        what="the long job in the registry",
    )
    wait_until(lambda: sum(done for done, _ in workers()) == 25, timeout=20, what="25 jobs done")
    client.cancel([long])  # its heartbeat finds the lease gone and tells the handler to stop
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(20) == 0


def test_systemd_hears_ready_status_watchdog_and_stopping(supervised: tuple[Supervised, int]) -> None:
    sup, _ = supervised
    wait_until(lambda: "WATCHDOG=1" in sup.notifications(), what="a watchdog ping")
    assert "READY=1" in sup.notifications()
    assert any(m.startswith("STATUS=") for m in sup.notifications())
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(20) == 0
    wait_until(lambda: "STOPPING=1" in sup.notifications(), timeout=2, what="STOPPING=1")


def test_healthcheck_command_exit_codes(supervised: tuple[Supervised, int], dsn: str) -> None:
    _, port = supervised

    def healthcheck(*args: str) -> int:
        return run_miniqueue("healthcheck", *args, dsn=dsn).returncode

    assert healthcheck() == 0
    wait_until(lambda: get(port, "/readyz")[0] == 200, what="ready")  # its workers start after the fixture
    assert healthcheck("--url", f"http://127.0.0.1:{port}/readyz") == 0
    assert healthcheck("--url", f"http://127.0.0.1:{port}/nope") == 1
    assert healthcheck("--url", f"http://127.0.0.1:{free_port()}/readyz", "--timeout", "1") == 1
