"""harness, which every process test, the benchmarks and the chaos harness start
supervisors with: ready when the supervisor says READY=1, a clear failure with the log's tail
otherwise, nothing left behind after a stop."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import SupervisorFailed, SupervisorProcess

from ..helpers import wait_until
from ..supervised import FAST

APP = "tests.apps.supervised:app"


def test_ready_is_the_supervisors_own_notification_and_a_stop_leaves_nothing(
    dsn: str, tmp_path: Path, repo_root: Path
) -> None:
    sup = SupervisorProcess(["--app", APP, "--workers", "2", *FAST], log=tmp_path / "log", dsn=dsn, cwd=repo_root)
    try:
        sup.wait_ready(20)
        assert sup.ready and "READY=1" in sup.notifications()
        wait_until(lambda: len(sup.worker_pids()) == 2 and sup.reaper_pid(), what="two workers and a reaper")
        children = [*sup.worker_pids(), sup.reaper_pid()]
    finally:
        sup.stop()
    assert sup.proc.returncode == 0  # SIGTERM first: the idle supervisor drains and exits 0
    assert "STOPPING=1" in sup.notifications()
    assert not sup.notify_socket.exists()
    assert "supervisor stopped" in sup.output()
    assert all(pid not in sup.titles() for pid in children)


def test_a_supervisor_that_exits_before_it_is_ready_fails_with_its_log(
    dsn: str, tmp_path: Path, repo_root: Path
) -> None:
    sup = SupervisorProcess(["--app", APP, "--workers", "0"], log=tmp_path / "log", dsn=dsn, cwd=repo_root)
    try:
        before_ready = r"(?s)exited with \d+ before it was ready.*Invalid value for '--workers': '0'"
        with pytest.raises(SupervisorFailed, match=before_ready):
            sup.wait_ready(20)
        assert not sup.ready
    finally:
        sup.stop()


def test_a_missed_deadline_fails_with_its_log_and_the_supervisor_may_still_get_ready(
    dsn: str, tmp_path: Path, repo_root: Path
) -> None:
    sup = SupervisorProcess(["--app", APP, "--workers", "1", *FAST], log=tmp_path / "log", dsn=dsn, cwd=repo_root)
    try:
        with pytest.raises(SupervisorFailed, match="not ready within 0 s"):
            sup.wait_ready(0)  # an interpreter alone takes longer than that to start
        sup.wait_ready(20)
    finally:
        sup.stop(grace=0)
    assert sup.proc.returncode == -9
