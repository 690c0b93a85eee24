"""The one-line protocol children speak to the supervisor over their pipe: encoded and decoded
here, and nowhere else.

Each report is one line of space-separated words, the kind first:

- ``beat 1|0|-``: the child is alive; a worker says whether its LISTEN connection is up;
- ``serves queue|task <name>``: a queue a worker claims from, a task its app declares (one
  line each, before ``ready``: the process registry lists them);
- ``ready <id>``: booted (a worker gives its worker id);
- ``start <job> <attempt> <timeout|-> <task>`` and ``end <job>``: a job the supervisor should
  time (still running at a flush, or with a hard timeout) began or finished;
- ``done <outcome> <count> <seconds> <buckets> <queue> <task>``: a :class:`Tally` of the jobs
  finished since the last flush;
- ``error <text>``: why the child is about to exit (a boot error, a traceback);
- ``queue <name> <available> <running> <completed> <failed> <dead> <cancelled> <scheduled>
  <oldest|-> <expired>`` per queue, then ``gauges 1|0``: the reaper's periodic reading of the
  queue gauges (``0``: the database did not answer), which ``/metrics`` serves; before ``gauges``,
  ``limit <waiting> <scope>`` per limit that jobs wait on;
- ``backlog <due> <walked> <oldest> <running> <desired|->``: the reaper's reading of the served
  queues' backlog for autoscaling, with ``miniqueue_desired_workers`` (``-``: not read).

Text is escaped (backslash and newline) so that a report never spans lines, and a line is at
most :data:`LINE_LIMIT` bytes, so that a write of one arrives whole (below ``PIPE_BUF``) even
with several threads writing: a longer report has its text cut, never its line ending.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from ..core.records import QueueStats, State
from ..core.scaling import Backlog

#: The longest report line, and the most written at once (below PIPE_BUF, 4096 on Linux).
LINE_LIMIT = 4000
_CUT = " [cut]"

#: Upper bounds (seconds) of the job duration histogram's buckets.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, float("inf"))


@dataclass
class Tally:
    """Jobs of one (outcome, queue, task) finished since a worker's last report: how many, their
    total run time, and how many fell in each duration bucket. A worker reports a tally per
    flush, not a line per job, so the supervisor's work does not grow with the job rate."""

    count: int = 0
    seconds: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * len(DURATION_BUCKETS))

    def add(self, seconds: float) -> None:
        self.count += 1
        self.seconds += seconds
        self.buckets[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1

    def merge(self, other: Tally) -> None:
        self.count += other.count
        self.seconds += other.seconds
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]


class Beat(NamedTuple):
    listening: bool | None  # None: the child does not listen (the reaper, --poll-only)


class Ready(NamedTuple):
    ident: str


class Serves(NamedTuple):
    kind: str  # "queue" or "task"
    name: str


class Start(NamedTuple):
    job_id: int
    attempt: int
    timeout: float | None
    task: str


class End(NamedTuple):
    job_id: int


class Done(NamedTuple):
    outcome: str
    queue: str
    task: str
    tally: Tally


class Error(NamedTuple):
    text: str


class QueueGauges(NamedTuple):
    stats: QueueStats


class LimitGauge(NamedTuple):
    """Jobs waiting on one limit (its scope name), as the reaper read them."""

    scope: str
    waiting: int


class SequenceGauge(NamedTuple):
    """A sequence key that a failed or dead job blocks, and how many jobs wait behind it."""

    key: str
    job_id: int
    waiting: int


class HorizonGauge(NamedTuple):
    """One thing that holds the MVCC horizon back (see miniqueue.store.horizon), and for how long."""

    kind: str
    pid: int | None
    name: str | None
    seconds: float | None


class DeadRowsGauge(NamedTuple):
    """The jobs table's dead rows, as the server's statistics count them."""

    dead_rows: int


class GaugesSent(NamedTuple):
    database_up: bool


class BacklogReading(NamedTuple):
    """The served queues' backlog, as the reaper read it for autoscaling, and the worker
    processes ``miniqueue_desired_workers`` calls for (None: not read)."""

    backlog: Backlog
    desired: int | None


Report = (
    Beat
    | Ready
    | Serves
    | Start
    | End
    | Done
    | Error
    | QueueGauges
    | LimitGauge
    | SequenceGauge
    | HorizonGauge
    | DeadRowsGauge
    | GaugesSent
    | BacklogReading
)
#: A queue line's counts, one per state in the order State declares them: the children are forked
#: from the supervisor, so both ends of the pipe read the same order.
_GAUGE_STATES = tuple(State)

_LISTENING = {True: "1", False: "0", None: "-"}


def encode(report: Report) -> bytes:
    """One report as one line (with its newline), at most LINE_LIMIT bytes."""
    line = _words(report).encode("utf-8", "surrogateescape")
    if len(line) < LINE_LIMIT:
        return line + b"\n"
    assert isinstance(report, Error), "only an error's text can be long"
    budget = LINE_LIMIT - len(b"error \n") - len(_CUT)
    escaped = _escape(report.text).encode("utf-8", "surrogateescape")[:budget]
    escaped = escaped.decode("utf-8", "ignore").encode()  # not half a character
    if (len(escaped) - len(escaped.rstrip(b"\\"))) % 2:
        escaped = escaped[:-1]  # not half an escape
    return b"error " + escaped + _CUT.encode() + b"\n"


def _words(report: Report) -> str:
    if isinstance(report, Beat):
        return f"beat {_LISTENING[report.listening]}"
    if isinstance(report, Ready):
        return f"ready {_escape(report.ident)}"
    if isinstance(report, Serves):
        return f"serves {report.kind} {_escape(report.name)}"
    if isinstance(report, Start):
        timeout = "-" if report.timeout is None else f"{report.timeout:g}"
        return f"start {report.job_id} {report.attempt} {timeout} {_escape(report.task)}"
    if isinstance(report, End):
        return f"end {report.job_id}"
    if isinstance(report, QueueGauges):
        q = report.stats
        oldest = "-" if q.oldest_available_seconds is None else f"{q.oldest_available_seconds:.3f}"
        counts = " ".join(str(q.counts.get(state, 0)) for state in _GAUGE_STATES)
        return f"queue {_escape(q.queue)} {counts} {q.scheduled} {oldest} {q.expired_leases} {q.signal_waits}"
    if isinstance(report, GaugesSent):
        return f"gauges {int(report.database_up)}"
    if isinstance(report, LimitGauge):
        return f"limit {report.waiting} {_escape(report.scope)}"
    if isinstance(report, SequenceGauge):
        return f"sequence {report.job_id} {report.waiting} {_escape(report.key)}"
    if isinstance(report, HorizonGauge):
        seconds = "-" if report.seconds is None else f"{report.seconds:.3f}"
        pid = "-" if report.pid is None else str(report.pid)
        return f"horizon {seconds} {pid} {_escape(report.kind)} {_escape(report.name or '')}"
    if isinstance(report, DeadRowsGauge):
        return f"deadrows {report.dead_rows}"
    if isinstance(report, BacklogReading):
        b, desired = report.backlog, "-" if report.desired is None else str(report.desired)
        return f"backlog {b.due} {b.walked} {b.oldest_seconds:.3f} {b.running} {desired}"
    if isinstance(report, Done):
        tally = report.tally
        buckets = ",".join(map(str, tally.buckets))
        return (
            f"done {_escape(report.outcome)} {tally.count} {tally.seconds:.6f} {buckets} "
            f"{_escape(report.queue)} {_escape(report.task)}"
        )
    return f"error {_escape(report.text)}"


def decode(line: bytes) -> Report:
    """The report of one line (without its newline); ValueError for a line that is not one."""
    kind, _, rest = line.decode("utf-8", "replace").partition(" ")
    if kind == "beat":
        return Beat({"1": True, "0": False}.get(rest))
    if kind == "ready":
        return Ready(_unescape(rest))
    if kind == "serves":
        what, name = rest.split(" ", 1)
        return Serves(what, _unescape(name))
    if kind == "start":
        job_id, attempt, timeout, task = rest.split(" ", 3)
        return Start(int(job_id), int(attempt), None if timeout == "-" else float(timeout), _unescape(task))
    if kind == "end":
        return End(int(rest))
    if kind == "done":
        outcome, count, seconds, buckets, queue, task = rest.split(" ", 5)
        tally = Tally(int(count), float(seconds), [int(n) for n in buckets.split(",")])
        return Done(_unescape(outcome), _unescape(queue), _unescape(task), tally)
    if kind == "error":
        return Error(_unescape(rest))
    if kind == "queue":
        name, *counts, scheduled, oldest, expired, signal_waits = rest.split(" ")
        stats = QueueStats(
            queue=_unescape(name),
            counts=dict(zip(_GAUGE_STATES, map(int, counts), strict=True)),
            scheduled=int(scheduled),
            oldest_available_seconds=None if oldest == "-" else float(oldest),
            expired_leases=int(expired),
            signal_waits=int(signal_waits),
        )
        return QueueGauges(stats)
    if kind == "gauges":
        return GaugesSent(rest == "1")
    if kind == "limit":
        waiting, scope = rest.split(" ", 1)
        return LimitGauge(_unescape(scope), int(waiting))
    if kind == "horizon":
        seconds, pid, what, name = rest.split(" ", 3)
        held = None if seconds == "-" else float(seconds)
        return HorizonGauge(_unescape(what), None if pid == "-" else int(pid), _unescape(name) or None, held)
    if kind == "deadrows":
        return DeadRowsGauge(int(rest))
    if kind == "backlog":
        due, walked, oldest, running, desired = rest.split(" ")
        backlog = Backlog(int(due), int(walked), float(oldest), int(running))
        return BacklogReading(backlog, None if desired == "-" else int(desired))
    if kind == "sequence":
        job_id, waiting, key = rest.split(" ", 2)
        return SequenceGauge(_unescape(key), int(job_id), int(waiting))
    raise ValueError(f"not a report: {line[:80]!r}")


def _escape(text: str) -> str:
    """No space or newline left: every field is one word, whatever it holds."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace(" ", "\\s")


_ESCAPED = re.compile(r"\\(.)")
_UNESCAPES = {"n": "\n", "s": " ", "\\": "\\"}


def _unescape(text: str) -> str:
    return _ESCAPED.sub(lambda m: _UNESCAPES.get(m.group(1), m.group(1)), text)


def write(fd: int, reports: Iterable[Report]) -> None:
    """Send reports in as few writes as possible, each at most LINE_LIMIT bytes so that it
    arrives whole; a supervisor that is gone is ignored. Callers that write from several
    threads serialise their calls."""
    chunk = b""
    for report in reports:
        line = encode(report)
        if len(chunk) + len(line) > LINE_LIMIT:
            _write(fd, chunk)
            chunk = b""
        chunk += line
    _write(fd, chunk)


def _write(fd: int, data: bytes) -> None:
    if data:
        with contextlib.suppress(OSError):
            os.write(fd, data)


class Reader:
    """Turns the bytes read from a child's pipe into reports, keeping a partial last line."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[Report]:
        """The complete reports in ``data`` (with what was left over before); a line that is
        not a report is skipped."""
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        reports = []
        for line in lines:
            with contextlib.suppress(ValueError):
                reports.append(decode(line))
        return reports
