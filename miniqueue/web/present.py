"""Turning store records into what the pages show: worker ids, timelines, the throughput chart,
human-readable ages and sizes. Pure functions, no I/O."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..core.records import AttemptError, JobRecord, State

Redact = Callable[[Any], Any]
FAILED_STATES = (State.FAILED, State.DEAD)
BLANK = "\u2013"  # an en dash: shown for a missing value


@dataclass(frozen=True)
class WorkerRef:
    """A worker id (``host:pid:suffix``) taken apart; ``pid`` is None when the id has another shape."""

    raw: str
    host: str
    pid: int | None
    suffix: str


def parse_worker_id(raw: str | None) -> WorkerRef | None:
    """Split ``host:pid:suffix``; a host name has no colon, but a custom worker id may have any shape."""
    if not raw:
        return None
    host, sep, rest = raw.partition(":")
    pid_text, _, suffix = rest.partition(":")
    if sep and pid_text.isdigit():
        return WorkerRef(raw, host, int(pid_text), suffix)
    return WorkerRef(raw, raw, None, "")


@dataclass(frozen=True)
class Event:
    """One line of a job's timeline."""

    at: dt.datetime
    kind: str  # created, scheduled, started, failed, handed-back, requeued, running, completed, dead, ...
    label: str
    detail: str = ""
    worker: WorkerRef | None = None


def timeline(job: JobRecord) -> list[Event]:
    """Created, scheduled, each run that ended without completing (when it started, who ran it,
    why it ended), each requeue (and the end it undid), the run now, finished. Attempts are
    numbered as ``jobs show`` counts them; a run handed back uncharged is named by its run."""
    enqueued_priority = job.priority if job.aged_from is None else job.aged_from  # before aging raised it
    events = [Event(job.created_at, "created", "Created", f"queue {job.queue}, priority {enqueued_priority}")]
    if job.state is State.AVAILABLE or job.scheduled_at != job.created_at:
        events.append(Event(job.scheduled_at, "scheduled", "Scheduled", "runnable from this time"))
    for entry in job.errors:
        events += _history_events(entry)
    last_run = f"Attempt {job.attempt}" if job.run else ""
    if job.state is State.RUNNING and job.lease_expires_at is not None:
        worker = parse_worker_id(job.leased_by)
        if job.started_at is not None:
            events.append(Event(job.started_at, "started", f"{last_run} started", f"run {job.run}", worker))
        events.append(
            Event(
                job.lease_expires_at,
                "running",
                f"{last_run} running",
                "lease expires at this time unless renewed",
                worker,
            )
        )
    if job.finished_at is not None:
        if job.started_at is not None and job.state is State.COMPLETED:
            events.append(Event(job.started_at, "started", f"{last_run} started", f"run {job.run}"))
        kind = "failed-final" if job.state is State.FAILED else job.state.value
        events.append(Event(job.finished_at, kind, job.state.value.capitalize(), _finish_detail(job)))
    # At equal times, a failure comes before the retry it schedules.
    rank = {"created": 0, "started": 1, "failed": 2, "handed-back": 2, "requeued": 3, "scheduled": 4, "running": 5}
    return sorted(events, key=lambda e: (e.at, rank.get(e.kind, 6)))


def _history_events(entry: AttemptError) -> list[Event]:
    """The timeline's events of one history entry: a requeue (and the end it undid), or a run
    (its start, and how it ended)."""
    if entry.requeued:
        undone = [Event(entry.finished, entry.requeued, entry.requeued.capitalize(), "")] if entry.finished else []
        return [
            *undone,
            Event(entry.at, "requeued", "Requeued", f"it was {entry.requeued}: a fresh budget of attempts"),
        ]
    worker = parse_worker_id(entry.worker)
    name = f"Attempt {entry.attempt}" if entry.attempt is not None else f"Run {entry.run}"
    started = [Event(entry.started, "started", f"{name} started", f"run {entry.run}", worker)] if entry.started else []
    if entry.attempt is None:
        return [*started, Event(entry.at, "handed-back", f"{name} handed back", summary(entry.error), worker)]
    return [*started, Event(entry.at, "failed", f"{name} failed", summary(entry.error), worker)]


def _finish_detail(job: JobRecord) -> str:
    if job.state is State.DEAD:
        return f"attempts exhausted ({job.charged_attempts} of {job.attempt_budget})"
    if job.state is State.FAILED:
        return "permanent error: not retried"
    return f"after {job.charged_attempts} attempt(s)" if job.state is State.COMPLETED else ""


def summary(error: str | None) -> str:
    """The line of an error that says what went wrong: a traceback's last line."""
    lines = [line for line in (error or "").strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def render_payload(payload: Any, redact: Redact | None, *, indent: int | None = 2) -> str:
    """The payload as JSON text after the redact hook."""
    shown = redact(payload) if redact else payload
    return json.dumps(shown, indent=indent, sort_keys=True, ensure_ascii=False, default=str)


def preview(payload: Any, redact: Redact | None, width: int = 80) -> str:
    text = render_payload(payload, redact, indent=None)
    return text if len(text) <= width else text[: width - 1] + "…"


@dataclass(frozen=True)
class Bar:
    minute: dt.datetime
    completed: int
    failed: int
    x: int
    completed_height: float
    failed_height: float


@dataclass(frozen=True)
class Chart:
    """The last hour's finished jobs per minute, as SVG bar geometry (completed below, failed on top)."""

    bars: list[Bar]
    peak: int
    width: int
    height: int
    completed_total: int
    failed_total: int
    rows: list[tuple[dt.datetime, dict[State, int]]]


def throughput_chart(
    rows: Iterable[tuple[dt.datetime, State, int]], now: dt.datetime, *, bar: int = 10, height: int = 80
) -> Chart:
    """Sixty one-minute bars ending at ``now``'s minute; ``failed`` counts failed and dead jobs."""
    per_minute: dict[dt.datetime, dict[State, int]] = {}
    for minute, state, n in rows:
        per_minute.setdefault(minute.astimezone(dt.timezone.utc), {})[state] = n
    last = now.astimezone(dt.timezone.utc).replace(second=0, microsecond=0)
    minutes = [last - dt.timedelta(minutes=59 - i) for i in range(60)]
    counts = [(m, per_minute.get(m, {})) for m in minutes]
    peak = max((c.get(State.COMPLETED, 0) + sum(c.get(s, 0) for s in FAILED_STATES) for _, c in counts), default=0)
    scale = height / peak if peak else 0.0
    bars = []
    for i, (minute, c) in enumerate(counts):
        done, failed = c.get(State.COMPLETED, 0), sum(c.get(s, 0) for s in FAILED_STATES)
        bars.append(Bar(minute, done, failed, i * bar, done * scale, failed * scale))
    return Chart(
        bars,
        peak,
        bar * 60,
        height,
        sum(b.completed for b in bars),
        sum(b.failed for b in bars),
        [(m, c) for m, c in counts if c],
    )


def age(seconds: float | None) -> str:
    """``42s``, ``3m 12s``, ``5h 02m``, ``3d 4h``; ``BLANK`` for None."""
    if seconds is None:
        return BLANK
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def since(then: dt.datetime | None, now: dt.datetime) -> str:
    """How long ago ``then`` was, e.g. ``3m 12s ago`` (``in 5s`` for the future)."""
    if then is None:
        return BLANK
    delta = (now - then).total_seconds()
    return f"{age(delta)} ago" if delta >= 0 else f"in {age(-delta)}"


def size(n: int | None) -> str:
    """Bytes in binary units: ``512 B``, ``12.3 MiB``."""
    if n is None:
        return BLANK
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def timestamp(value: dt.datetime | None) -> str:
    """``2024-05-01 10:00:03 UTC``."""
    if value is None:
        return BLANK
    return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
