"""The dashboard as the network sees it: which Host names it answers for, where it agrees to
listen, and what ``ps`` shows of ``miniqueue web``. Against a real PostgreSQL and, for the
command, a real process."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx2
import psutil
import pytest
from psycopg.conninfo import make_conninfo
from starlette.testclient import TestClient

from miniqueue import Client, ConfigError
from miniqueue.core.db import Connection
from miniqueue.store.store import Store
from miniqueue.web import create_app
from miniqueue.web.logins import FREE_FAILURES, LOGIN_IDLE, LoginThrottle, client_key
from miniqueue.web.security import LOCAL_HOSTS
from miniqueue.web.server import check_bind, served_hosts

from ..helpers import wait_until
from ..supervised import free_port

EVIL = "rebind.evil.example"
PASSWORD = "pw-f7a1c9e2-not-for-ps"


WebProcess = tuple[subprocess.Popen[bytes], int, Path]


def browser(client: Client, base_url: str, allowed_hosts: Iterable[str] = LOCAL_HOSTS) -> TestClient:
    """A browser on a page at ``base_url``: its requests name that host in Host."""
    return TestClient(create_app(client, allowed_hosts=allowed_hosts), base_url=base_url)


# -- Host allow-list ----------------------------------------------------------------------------


def test_a_page_for_another_host_gets_no_page_and_no_csrf_token(client: Client) -> None:
    with browser(client, f"http://{EVIL}:8080") as rebound:
        for path in ["/", "/jobs", "/queues", "/static/style.css"]:
            response = rebound.get(path)
            assert response.status_code == 400, path
            assert f"does not answer for host '{EVIL}'" in response.text and "--allowed-host" in response.text
            assert "set-cookie" not in response.headers and "csrf" not in response.text
        assert response.headers["x-frame-options"] == "DENY"  # refusals get the security headers too


def test_a_post_for_another_host_changes_nothing_even_with_a_valid_token(
    client: Client, store: Store, conn: Connection
) -> None:
    app = create_app(client)
    with TestClient(app, base_url="http://127.0.0.1:8080") as local:
        local.get("/")
        good = local.cookies["miniqueue_csrf"]
        # The same token, from a page whose name now resolves to 127.0.0.1.
        refused = local.post("/queues/emails/pause", headers={"Host": EVIL, "X-CSRF-Token": good})
        assert refused.status_code == 400
        assert store.paused_queues(conn) == []
        accepted = local.post("/queues/emails/pause", headers={"X-CSRF-Token": good}, follow_redirects=False)
        assert accepted.status_code == 303
    assert store.paused_queues(conn) == ["emails"]


@pytest.mark.parametrize(
    "base_url",
    ["http://localhost", "http://localhost:8080", "http://LocalHost.:9", "http://127.0.0.1:65535", "http://[::1]"],
)
def test_localhost_names_are_served_on_any_port(client: Client, base_url: str) -> None:
    with browser(client, base_url) as local:
        assert local.get("/jobs").status_code == 200


@pytest.mark.parametrize("host", ["", "[::1", "::1", "localhost:80:80", "localhost:http", "local host", "[]"])
def test_a_malformed_host_header_is_refused(client: Client, host: str) -> None:
    with browser(client, "http://localhost") as web:
        response = web.get("/jobs", headers={"Host": host})
    assert response.status_code == 400 and "Host header" in response.text


def test_allowed_hosts_replace_the_localhost_default(client: Client) -> None:
    hosts = ["Dash.Example.com", "[::1]"]
    with browser(client, "https://dash.example.com:8443", hosts) as named:
        assert named.get("/jobs").status_code == 200
    with browser(client, "http://[::1]:8080", hosts) as local:
        assert local.get("/jobs").status_code == 200
    with browser(client, "http://localhost", hosts) as local:
        assert local.get("/jobs").status_code == 400
    with browser(client, f"http://{EVIL}", ["*"]) as anyone:  # a proxy in front checks Host
        assert anyone.get("/jobs").status_code == 200


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        (["dash.example.com:8443"], "has a port: give the name alone"),
        (["https://dash.example.com"], "is not a host name"),
        ([" "], "is not a host name"),
        ("dash.example.com", "is one string: pass a list"),
    ],
)
def test_bad_allowed_hosts_fail_when_the_app_is_created(client: Client, hosts: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        create_app(client, allowed_hosts=hosts)


def test_serve_answers_for_localhost_the_address_it_listens_on_and_the_names_given() -> None:
    assert served_hosts("127.0.0.1") == ["localhost", "127.0.0.1", "::1"]
    assert served_hosts("10.1.2.3", ["dash.example.com"]) == [
        "localhost",
        "127.0.0.1",
        "::1",
        "10.1.2.3",
        "dash.example.com",
    ]
    assert served_hosts("0.0.0.0") == served_hosts("::") == ["localhost", "127.0.0.1", "::1"]


# -- where it listens -------------------------------------------------------------------------------


def web_env(**extra: str) -> dict[str, str]:
    """The environment of a ``miniqueue web`` with no authentication and no DATABASE_URL."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "MINIQUEUE_WEB_USER"}}
    return {**env, "MINIQUEUE_WEB_USER": "", "MINIQUEUE_WEB_PASSWORD": "", **extra}


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "dash.example.com"])
def test_miniqueue_web_refuses_to_listen_beyond_loopback_without_authentication(dsn: str, host: str) -> None:
    command = [
        sys.executable,
        "-m",
        "miniqueue.cli",
        "web",
        "--host",
        host,
        "--port",
        str(free_port()),
        "--database-url",
        dsn,
    ]
    # Today's refusal comes before anything is bound; a server that starts instead hits the timeout.
    result = subprocess.run(command, env=web_env(), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"Error: refusing to serve the dashboard on {host} without authentication")
    assert "MINIQUEUE_WEB_USER" in line and "--insecure-bind-public" in line


def test_listening_beyond_loopback_needs_authentication_or_the_unsafe_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINIQUEUE_WEB_USER", raising=False)
    monkeypatch.delenv("MINIQUEUE_WEB_PASSWORD", raising=False)
    for loopback in ["127.0.0.1", "127.0.0.2", "::1", "localhost"]:
        check_bind(loopback)
    with pytest.raises(ConfigError, match="--insecure-bind-public"):
        check_bind("0.0.0.0")
    check_bind("0.0.0.0", insecure_bind_public=True)
    monkeypatch.setenv("MINIQUEUE_WEB_USER", "alice")
    monkeypatch.setenv("MINIQUEUE_WEB_PASSWORD", "s3cret")
    check_bind("0.0.0.0")


# -- the process -----------------------------------------------------------------------------------


@pytest.fixture
def web_process(dsn: str, tmp_path: Path) -> Iterator[WebProcess]:
    """``miniqueue web`` on a free port, given a DSN with a password on its command line."""
    port, stderr = free_port(), tmp_path / "stderr.log"
    command = [
        sys.executable,
        "-m",
        "miniqueue.cli",
        "web",
        "--port",
        str(port),
        "--allowed-host",
        "dash.example",
        "--database-url",
        make_conninfo(dsn, password=PASSWORD),
    ]
    with stderr.open("wb") as log:
        server = subprocess.Popen(command, env=web_env(), stdout=log, stderr=log, start_new_session=True)
    try:
        yield server, port, stderr
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)


def test_miniqueue_web_takes_the_password_out_of_its_title_and_logs_as_web(web_process: WebProcess) -> None:
    server, port, stderr = web_process
    process = psutil.Process(server.pid)

    def title() -> str | None:
        assert server.poll() is None, stderr.read_text()
        shown = " ".join(process.cmdline()).strip()
        return shown if PASSWORD not in shown else None

    assert wait_until(title, timeout=20, what="the title to drop the password") == f"miniqueue web 127.0.0.1:{port}"
    wait_until(lambda: "answers for the hosts" in stderr.read_text(), timeout=20, what="the dashboard to start")
    assert f"[web {server.pid}]" in stderr.read_text() and "[supervisor" not in stderr.read_text()
    assert PASSWORD not in stderr.read_text()


def test_miniqueue_web_answers_for_its_allowed_hosts_only(web_process: WebProcess) -> None:
    server, port, stderr = web_process
    url = f"http://127.0.0.1:{port}/static/style.css"

    def status(host: str) -> int | None:
        try:
            return httpx2.get(url, headers={"Host": host}, timeout=2).status_code
        except httpx2.TransportError:
            assert server.poll() is None, stderr.read_text()
            return None

    assert wait_until(lambda: status("dash.example:8080"), timeout=20, what="miniqueue web to answer") == 200
    assert status("127.0.0.1") == status(f"localhost:{port}") == 200
    assert status(EVIL) == 400


# -- logins -----------------------------------------------------------------------------------------

AUDIT = "miniqueue.web.audit"


@pytest.fixture
def basic_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINIQUEUE_WEB_USER", "alice")
    monkeypatch.setenv("MINIQUEUE_WEB_PASSWORD", PASSWORD)


def login_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == AUDIT]


@pytest.mark.usefixtures("basic_auth")
def test_logins_and_failed_logins_are_audited_without_the_password(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=AUDIT)
    with TestClient(create_app(client), base_url="http://localhost", client=("10.0.0.7", 50000)) as web:
        assert web.get("/jobs").status_code == 401  # a browser's first request: no credentials, no attempt
        assert web.get("/jobs", auth=("mallory\nuser=alice", PASSWORD + "x")).status_code == 401
        assert web.get("/jobs", auth=("alice", "guess")).status_code == 401
        web.auth = ("alice", PASSWORD)
        assert web.get("/jobs").status_code == 200
        assert web.get("/jobs?partial=1").status_code == 200  # the same login: no second line
    assert login_lines(caplog) == [
        ("WARNING", "user=mallory\\nuser=alice@10.0.0.7 action=login failures=1 outcome=failed"),
        ("WARNING", "user=alice@10.0.0.7 action=login failures=2 outcome=failed"),
        ("INFO", "user=alice@10.0.0.7 action=login failures=2 outcome=ok"),
    ]
    assert PASSWORD not in caplog.text and "guess" not in caplog.text
    records = [r for r in caplog.records if r.name == AUDIT]
    assert records[-1].audit == {  # type: ignore[attr-defined]
        "user": "alice@10.0.0.7",
        "action": "login",
        "failures": 2,
        "outcome": "ok",
        "retry_after": 0,
    }


@pytest.mark.usefixtures("basic_auth")
def test_repeated_failed_logins_are_answered_429_with_retry_after(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=AUDIT)
    app = create_app(client)
    attacker = TestClient(app, base_url="http://localhost", client=("203.0.113.9", 50000))
    neighbour = TestClient(app, base_url="http://localhost", client=("203.0.113.10", 50000))
    statuses = [attacker.get("/jobs", auth=("alice", f"guess-{n}")).status_code for n in range(FREE_FAILURES)]
    assert statuses == [401] * FREE_FAILURES
    # The next attempt is refused before its credentials are checked, even the right ones.
    refused = attacker.get("/jobs", auth=("alice", PASSWORD))
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert "too many failed logins" in refused.text
    assert neighbour.get("/jobs", auth=("alice", PASSWORD)).status_code == 200  # per client address
    assert login_lines(caplog)[FREE_FAILURES - 1] == (
        "WARNING",
        f"user=alice@203.0.113.9 action=login failures={FREE_FAILURES} outcome=failed retry_after=1",
    )


@pytest.mark.usefixtures("basic_auth")
def test_a_login_clears_the_failures_of_its_address(client: Client) -> None:
    with TestClient(create_app(client), base_url="http://localhost") as web:
        for _ in range(2):
            for _ in range(FREE_FAILURES - 1):
                assert web.get("/jobs", auth=("alice", "wrong")).status_code == 401
            assert web.get("/jobs", auth=("alice", PASSWORD)).status_code == 200
        for _ in range(FREE_FAILURES):
            assert web.get("/jobs", auth=("alice", "wrong")).status_code == 401
        assert web.get("/jobs", auth=("alice", PASSWORD)).status_code == 429


def test_a_custom_auth_is_not_throttled(client: Client) -> None:
    """Its rejections need not be guesses (no session yet): the app that logs users in owns that."""
    with TestClient(create_app(client, auth=lambda request: False), base_url="http://localhost") as web:
        statuses = {web.get("/jobs", headers={"Authorization": "Bearer x"}).status_code for _ in range(10)}
    assert statuses == {401}


def test_the_wait_doubles_after_each_failure_up_to_a_cap_and_a_login_clears_it() -> None:
    throttle = LoginThrottle(free_failures=3, first_wait=1.0, max_wait=10.0)
    now = 1000.0
    assert [throttle.failed("10.0.0.1", now) for _ in range(3)] == [(1, 0.0), (2, 0.0), (3, 1.0)]
    assert throttle.retry_after("10.0.0.1", now + 0.25) == 0.75
    assert throttle.retry_after("10.0.0.2", now) == 0.0
    waits = []
    for _ in range(5):
        now += throttle.retry_after("10.0.0.1", now)  # each attempt once the last wait is over
        waits.append(throttle.failed("10.0.0.1", now)[1])
    assert waits == [2.0, 4.0, 8.0, 10.0, 10.0]
    assert throttle.admitted("10.0.0.1", "alice", now + 10) == (True, 8)
    assert throttle.retry_after("10.0.0.1", now + 10) == 0.0
    assert throttle.failed("10.0.0.1", now + 10) == (1, 0.0)


def test_a_login_is_the_first_admission_of_a_user_at_an_address_or_after_a_pause() -> None:
    throttle = LoginThrottle()
    assert throttle.admitted("10.0.0.1", "alice", 0.0) == (True, 0)
    assert throttle.admitted("10.0.0.1", "alice", 2.0) == (False, 0)  # the page polling
    assert throttle.admitted("10.0.0.1", "bob", 4.0) == (True, 0)
    assert throttle.admitted("10.0.0.1", "bob", 4.0 + LOGIN_IDLE) == (True, 0)


def test_ipv6_addresses_count_per_64_and_few_addresses_are_kept() -> None:
    throttle = LoginThrottle(free_failures=1, max_addresses=3)
    throttle.failed("2001:db8:1:2::a", 0.0)
    assert throttle.retry_after("2001:db8:1:2:ffff::1", 0.0) == 1.0  # another host of the same /64
    assert throttle.retry_after("2001:db8:1:3::a", 0.0) == 0.0
    throttle.failed("::ffff:192.0.2.1", 0.0)
    assert throttle.retry_after("192.0.2.1", 0.0) == 1.0  # an IPv4 client seen through an IPv6 socket
    for n in range(2, 5):
        throttle.failed(f"192.0.2.{n}", 0.0)
    assert throttle.tracked == 3  # the least recently seen are forgotten
    assert throttle.retry_after("2001:db8:1:2::a", 0.0) == throttle.retry_after("192.0.2.1", 0.0) == 0.0
    assert client_key("testclient") == "testclient"
