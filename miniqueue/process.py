"""Process plumbing shared by the supervisor and its children: titles, signal names, parent death,
and the one-line report protocol children speak to the supervisor over a pipe."""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import datetime as dt
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass, field

import setproctitle

#: Exit code of a child that could not boot (bad app, bad config): do not respawn blindly.
EXIT_BOOT_ERROR = 3

_PR_SET_PDEATHSIG = 1

_label = "supervisor"


def set_title(text: str) -> None:
    """Name this process ``miniqueue <text>`` in ps/top (never put a DSN here)."""
    setproctitle.setproctitle(f"miniqueue {text}")


def set_label(label: str) -> None:
    """Name this process in its log lines (``worker-3``, ``reaper``, ``supervisor``)."""
    global _label
    _label = label


class _LabelFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.mq_process = _label
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (ISO 8601 UTC, ``2026-01-02T09:30:00.123Z``), level,
    process label and pid, logger, message; and ``job`` (id, task, queue, attempt,
    max_attempts, outcome, error) on the line a failed attempt leaves."""

    def format(self, record: logging.LogRecord) -> str:
        # UTC with its "Z": a log shipper must not guess the host's time zone.
        moment = dt.datetime.fromtimestamp(record.created, dt.timezone.utc)
        entry = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "process": getattr(record, "mq_process", _label),
            "pid": record.process,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        job = getattr(record, "job", None)
        if job is not None:
            entry["job"] = job
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str = "INFO", log_format: str = "text") -> None:
    """Log to stderr, each line naming the process (label and pid): as text, or as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_LabelFilter())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s [%(mq_process)s %(process)d] %(levelname)s %(name)s: %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9, and so on."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(status: int) -> str:
    """Turn a ``waitpid`` status into words: ``killed by SIGKILL``, ``exited with code 3``."""
    if os.WIFSIGNALED(status):
        return f"killed by {signal_name(os.WTERMSIG(status))}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the parent-pid check in the child still catches an orphaned child


def report_line(*words: object) -> str:
    """One line of the child-to-supervisor protocol (newlines escaped)."""
    return " ".join(str(w).replace("\n", "\\n") for w in words) + "\n"


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

    def line(self, outcome: str, queue: str, task: str) -> str:
        """The ``done`` report line (the task name last: it may hold spaces)."""
        buckets = ",".join(map(str, self.buckets))
        return report_line("done", outcome, self.count, f"{self.seconds:.6f}", buckets, queue, task)

    @classmethod
    def parse(cls, rest: str) -> tuple[str, str, str, Tally]:
        """Read a ``done`` line (without its first word): outcome, queue, task and the tally."""
        outcome, count, seconds, buckets, queue, task = rest.split(" ", 5)
        return outcome, queue, task, cls(int(count), float(seconds), [int(n) for n in buckets.split(",")])


#: The longest report line, and the most written at once: below PIPE_BUF (4096 on Linux), so a
#: write arrives whole even with several threads writing.
_LINE_LIMIT = 4000


def write_lines(fd: int, lines: list[str]) -> None:
    """Send report lines to the supervisor in as few writes as possible, each below PIPE_BUF so
    that it arrives whole; a supervisor that is gone is ignored. Callers that write from
    several threads serialise their calls."""
    chunk = b""
    for line in lines:
        data = line.encode("utf-8", "replace")
        if len(data) > _LINE_LIMIT:  # cut the payload, never the line ending that delimits it
            data = data[: _LINE_LIMIT - 4] + b"...\n"
        if len(chunk) + len(data) > _LINE_LIMIT:
            _write(fd, chunk)
            chunk = b""
        chunk += data
    _write(fd, chunk)


def write_report(fd: int, *words: object) -> None:
    """Send one report line to the supervisor."""
    write_lines(fd, [report_line(*words)])


def _write(fd: int, data: bytes) -> None:
    if data:
        with contextlib.suppress(OSError):
            os.write(fd, data)
