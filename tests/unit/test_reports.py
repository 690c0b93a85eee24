"""The child-to-supervisor report protocol: every report survives its line, long ones are cut
in their text and never in their line ending, and a pipe delivers them whole."""

from __future__ import annotations

import contextlib
import datetime as dt
import os

import pytest

from miniqueue import App
from miniqueue.core.records import Lease
from miniqueue.supervise import reports
from miniqueue.supervise.child import ChildSpec, _Progress
from miniqueue.supervise.reports import (
    DURATION_BUCKETS,
    LINE_LIMIT,
    Beat,
    Done,
    End,
    Error,
    Reader,
    Ready,
    Start,
    Tally,
)
from miniqueue.tasks.job import Job
from miniqueue.worker.inflight import InflightBoard
from miniqueue.worker.worker import Outcome


def tally_of(*seconds: float) -> Tally:
    tally = Tally()
    for s in seconds:
        tally.add(s)
    return tally


@pytest.mark.parametrize(
    "report",
    [
        Beat(True),
        Beat(False),
        Beat(None),
        Ready("host:4242:a1b2c3"),
        Ready("-"),
        Start(12, 3, None, "send_email"),
        Start(12, 3, 0.5, "reports.nightly:v2"),
        End(9_223_372_036_854_775_807),
        Error("Traceback (most recent call last):\n  File \"app.py\", line 3\nKeyError: 'api_key'"),
        Error("a backslash \\n is not a newline, \\\\ nor a space \\s"),
        Error(""),
    ],
)
def test_a_report_survives_its_line(report: reports.Report) -> None:
    line = reports.encode(report)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert reports.decode(line[:-1]) == report


def test_a_tally_survives_its_line_with_inclusive_bounds() -> None:
    report = Done("retried", "emails", "send welcome mail", tally_of(0.0005, 0.001, 0.0011, 7.0, 1e9))
    decoded = reports.decode(reports.encode(report)[:-1])
    assert isinstance(decoded, Done)
    assert (decoded.outcome, decoded.queue, decoded.task) == ("retried", "emails", "send welcome mail")
    assert decoded.tally.count == 5 and decoded.tally.seconds == pytest.approx(1e9 + 7.0021)
    assert dict(zip(DURATION_BUCKETS, decoded.tally.buckets, strict=True)) == {
        **dict.fromkeys(DURATION_BUCKETS, 0),
        0.001: 2,
        0.005: 1,
        10: 1,
        float("inf"): 1,
    }


@pytest.mark.parametrize("text", ["x" * 5000, "é" * 3000, "\\" * 4500, "a\nb " * 2000])
def test_an_error_over_the_limit_is_cut_in_its_text_not_its_line_ending(text: str) -> None:
    line = reports.encode(Error(text))
    assert len(line) <= LINE_LIMIT and line.endswith(b"\n") and line.count(b"\n") == 1
    decoded = reports.decode(line[:-1])
    assert isinstance(decoded, Error)
    assert decoded.text.endswith(" [cut]")
    kept = decoded.text.removesuffix(" [cut]")
    assert text.startswith(kept) and len(kept) > 1000


def test_a_pipe_delivers_a_long_boot_error_whole_among_other_reports() -> None:
    read_fd, write_fd = os.pipe()
    try:
        sent: list[reports.Report] = [Ready("w1"), Error("boom " + "x" * 6000), Beat(True)]
        sent += [End(n) for n in range(500)]
        reports.write(write_fd, sent)
        os.close(write_fd)
        reader, received = Reader(), []
        while chunk := os.read(read_fd, 7):  # small reads: lines arrive in pieces
            received += reader.feed(chunk)
    finally:
        os.close(read_fd)
    assert len(received) == len(sent)
    assert received[0] == Ready("w1") and received[2:] == sent[2:]
    error = received[1]
    assert isinstance(error, Error) and error.text.startswith("boom xxx") and error.text.endswith("[cut]")


def test_a_line_that_is_not_a_report_is_skipped() -> None:
    reader = Reader()
    assert reader.feed(b"nonsense here\nstart x y z t\nend 7\nbeat 1\npartial") == [End(7), Beat(True)]
    assert reader.feed(b" line\n") == []
    with pytest.raises(ValueError, match="not a report"):
        reports.decode(b"hello")


def test_a_worker_reports_a_job_running_only_while_its_handler_runs() -> None:
    # A handler that returned is no longer running, though its outcome waits for the next
    # claim to be recorded: a drain of fast jobs sends the supervisor counts, not a line per job.
    now = dt.datetime.now(dt.timezone.utc)
    lease = Lease(7, "default", "t", {}, 0, 1, 5, now, now, now)
    fast, slow = Job(lease, worker_id="w"), Job(lease._replace(id=8), worker_id="w")
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    board = InflightBoard(2)
    progress = _Progress(ChildSpec("worker-1", "postgresql://", write_fd, 1.0), App(), board)

    def flushed() -> list[reports.Report]:
        progress.flush()
        reader = Reader()
        with contextlib.suppress(BlockingIOError):
            return reader.feed(os.read(read_fd, 65536))
        return []

    try:
        for job in (fast, slow):
            progress.handler_started(job)
        assert set(board.running()) == {7, 8}, "the board holds every running handler"
        progress.handler_ended(fast)
        assert flushed() == [Start(8, 1, None, "t")]
        assert set(board.running()) == {8}
        progress.job_ended(fast, Outcome("completed", duration=0.001))
        progress.handler_ended(slow)
        progress.job_ended(slow, Outcome("completed", duration=2.0))
        sent = flushed()
        assert sent[0] == End(8) and len(sent) == 2 and not board.running()
        assert isinstance(sent[1], Done) and sent[1].tally.count == 2
    finally:
        os.close(read_fd)
        os.close(write_fd)
