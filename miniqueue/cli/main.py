"""Command line: ``miniqueue`` (migrate, enqueue, inspect, repair, demo) and ``miniqueue-supervise``.

This module only parses options and calls into the library. The database comes from
``--database-url`` or ``DATABASE_URL``; with neither, a private embedded PostgreSQL is started
in ``./.miniqueue/pgdata`` (or ``$MINIQUEUE_DATA_DIR``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

import click

from .. import embedded
from ..client.client import Client
from ..core.db import check_dsn, check_schema, mask_dsn
from ..core.errors import AppLoadError, InvalidInput, MiniqueueError
from ..core.records import JobRecord, QueueStats, State
from ..core.validation import JOB_ID_RANGE, parse_json
from ..store.migrate import run_migrations
from ..supervise.health import probe_database, probe_url
from ..tasks.app import load_app

F = TypeVar("F", bound=Callable[..., Any])

_database_url_option = click.option(
    "--database-url",
    envvar="DATABASE_URL",
    help="PostgreSQL URL (default: $DATABASE_URL, else an embedded server in ./.miniqueue).",
)

_SCHEMA = "miniqueue.schema"


def _remember_schema(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        ctx.meta[_SCHEMA] = check_schema(value)
    except MiniqueueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


_schema_option = click.option(
    "--schema",
    envvar="MINIQUEUE_SCHEMA",
    default="public",
    show_default=True,
    expose_value=False,
    callback=_remember_schema,
    help="The PostgreSQL schema of miniqueue's tables (every process of a deployment uses one).",
)


def database_option(command: F) -> F:
    """``--database-url`` and ``--schema``: where the queue lives."""
    return _database_url_option(_schema_option(command))


def current_schema() -> str:
    """The ``--schema`` of the command being run."""
    schema: str = click.get_current_context().meta.get(_SCHEMA, "public")
    return schema


def open_client(database_url: str | None) -> Client:
    """A Client on the command's database and schema."""
    return Client(resolve_database(database_url), schema=current_schema())



def resolve_database(url: str | None, announce: Callable[[str], None] | None = None) -> str:
    """The DSN to use: the given one (checked), or the embedded server's (started, migrated,
    and announced on stderr, or through ``announce``)."""
    if url:
        check_dsn(url)
        return url
    uri = embedded.start()
    run_migrations(uri, current_schema())
    message = (f"using the embedded PostgreSQL in {embedded.data_dir()}; it runs while this command does and "
               f"keeps its data for the next one (to look inside meanwhile: psql '{uri}')")  # fmt: skip
    (announce or functools.partial(click.echo, err=True))(message)
    return uri


class BadInput(click.ClickException):
    """A value broke a rule (nothing was stored), or the command line is wrong: one line, exit 2."""

    exit_code = 2


def friendly_errors(command: F) -> F:
    """Report miniqueue errors as one line, never a traceback: exit 2 for bad input (an app that
    does not load included), else 1."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (InvalidInput, AppLoadError) as exc:
            raise BadInput(str(exc)) from exc
        except MiniqueueError as exc:
            raise click.ClickException(str(exc)) from exc

    return wrapper  # type: ignore[return-value]


# Since click 8.2, a group given no command raises this to show its help: that stays as it is.
_SHOWS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


@contextlib.contextmanager
def usage_in_one_line() -> Iterator[None]:
    """Turn click's usage errors (a bad option value, a missing argument, an unknown option or
    command) into one line that names the problem and where the help is, exit 2, instead of
    click's usage block."""
    try:
        yield
    except click.UsageError as exc:
        if isinstance(exc, _SHOWS_HELP):
            raise
        message = " ".join(exc.format_message().splitlines()).rstrip(".")
        if exc.ctx is not None:
            message += f" (see '{exc.ctx.command_path} --help')"
        raise BadInput(message) from exc


class OneLineCommand(click.Command):
    """A command whose usage errors are one line (see :func:`usage_in_one_line`), including
    those of its subcommands when it is a group."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any
    ) -> click.Context:
        with usage_in_one_line():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with usage_in_one_line():
            return super().invoke(ctx)


class OneLineGroup(OneLineCommand, click.Group):
    """:class:`OneLineCommand` for a group: ``miniqueue`` itself."""


class JsonText(click.ParamType):  # type: ignore[type-arg]
    """A JSON document given on the command line (a payload)."""

    name = "json"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return parse_json(value)
        except InvalidInput as exc:
            self.fail(str(exc), param, ctx)


class Seconds(click.FloatRange):
    """A number of seconds within a range (click's FloatRange lets NaN through: it compares false)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if math.isnan(seconds):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds


#: A job id: the column is a BIGINT from a sequence starting at 1, so anything else is a typo
#: (and a larger number would reach the database only to fail there).
JOB_ID = click.IntRange(*JOB_ID_RANGE)


def to_json(value: Any) -> str:
    """``value`` as JSON text, timestamps in ISO 8601 (``2026-01-02T09:30:00.123456+00:00``)."""
    return json.dumps(value, default=_json_default)


def _json_default(value: object) -> object:
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    return str(value)


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="miniqueue")
def main() -> None:
    """miniqueue: a PostgreSQL-backed job queue.

    Exit status: 0 on success, 1 when the command failed (database unreachable, a job in the
    wrong state), 2 for bad input (nothing was changed). With --json, a command prints one JSON
    document: an object for one item, an array for a list; timestamps are ISO 8601 with offset.
    """


@main.command()
@database_option
@friendly_errors
def migrate(database_url: str | None) -> None:
    """Create or upgrade the queue's tables (safe to run concurrently)."""
    dsn = resolve_database(database_url)
    applied = run_migrations(dsn, current_schema())
    names = ", ".join(f"{m.version:03d}_{m.name}" for m in applied)
    click.echo(f"applied {len(applied)} migration(s){': ' + names if names else ''} to {mask_dsn(dsn)}")


@main.command()
@click.argument("task")
@click.option("--queue", help="Default: the queue the task declares (else 'default').")
@click.option("--payload", type=JsonText(), default="{}", show_default=True, help="The job's payload, as JSON.")
@click.option("--priority", type=int, help="Higher runs first. Default: the task's (else 0).")
@click.option("--delay", type=float, help="Run no sooner than this many seconds from now.")
@click.option(
    "--run-at",
    type=click.DateTime(["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%d %H:%M:%S%z"]),
    help="Run no sooner than this time (with a UTC offset, e.g. 2026-01-01T09:00:00+00:00).",
)
@click.option("--max-attempts", type=int, help="Default: the task's (else 5).")
@click.option("--idempotency-key")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@database_option
@friendly_errors
def enqueue(
    task: str,
    queue: str | None,
    payload: Any,
    priority: int | None,
    delay: float | None,
    run_at: dt.datetime | None,
    max_attempts: int | None,
    idempotency_key: str | None,
    as_json: bool,
    database_url: str | None,
) -> None:
    """Enqueue one job of TASK, with the options its task declares unless given here (see the
    README's "Tasks and their options")."""
    with open_client(database_url) as client:
        result = client.enqueue(
            task,
            payload,
            queue=queue,
            priority=priority,
            delay=delay,
            run_at=run_at,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
        )
    if as_json:
        click.echo(to_json({"id": result.id, "duplicate": result.duplicate}))
    else:
        click.echo(f"job {result.id} {'already existed (same idempotency key)' if result.duplicate else 'enqueued'}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as a JSON array, one object per queue.")
@click.option(
    "--recount", is_flag=True,
    help="First recount finished jobs from the table (a repair after migrating with workers running; reads every row).",
)  # fmt: skip
@database_option
@friendly_errors
def stats(as_json: bool, recount: bool, database_url: str | None) -> None:
    """Per queue: jobs by state, the oldest waiting job's age, running and expired leases.

    Finished jobs are counted as they finish, so this costs the same at any table size."""
    with open_client(database_url) as client:
        if recount:
            client.recount()
        queues = client.queue_stats()
    if as_json:
        click.echo(to_json([_stats_dict(q) for q in queues]))
        return
    headers = ["queue", *(s.value for s in State), "scheduled", "oldest waiting (s)", "expired leases"]
    table = [headers]
    for q in queues:
        oldest = "-" if q.oldest_available_seconds is None else f"{q.oldest_available_seconds:.1f}"
        table.append([q.queue, *(str(q.counts[s]) for s in State), str(q.scheduled), oldest, str(q.expired_leases)])
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    for row in table:
        click.echo(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    for q in queues:
        if q.stranded:
            click.echo(f"note: no worker has ever served queue {q.queue!r}, where {q.stranded} job(s) wait "
                       "(see the README's \"Tasks and their options\")", err=True)  # fmt: skip


def _stats_dict(q: QueueStats) -> dict[str, Any]:
    return {"queue": q.queue, **{s.value: n for s, n in q.counts.items()}, "scheduled": q.scheduled,
            "oldest_available_seconds": q.oldest_available_seconds, "expired_leases": q.expired_leases,
            "served": q.served}  # fmt: skip


@main.group()
def jobs() -> None:
    """Inspect jobs."""


#: A line of `jobs list`: id, state, queue, task, attempt, created, last error or parents.
_JOB_LINE = "{:>10}  {:<9}  {:<16} {:<24} {:>9}  {:<19}  {}"


@jobs.command("list")
@click.option("--queue")
@click.option("--state", type=click.Choice([s.value for s in State]))
@click.option("--task")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--before", "before_id", type=JOB_ID, help="Only jobs with a smaller id (the next page).")
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as a JSON array, newest first.")
@database_option
@friendly_errors
def list_jobs(queue: str | None, state: str | None, task: str | None, limit: int, before_id: int | None,
              as_json: bool, database_url: str | None) -> None:  # fmt: skip
    """Jobs matching the filters, newest first (a waiting job: the parents it waits for)."""
    with open_client(database_url) as client:
        found = client.list_jobs(state=State(state) if state else None, queue=queue, task=task,
                                 before_id=before_id, limit=limit)  # fmt: skip
    if as_json:
        click.echo(to_json([_job_dict(job) for job in found]))
        return
    click.echo(_JOB_LINE.format("ID", "STATE", "QUEUE", "TASK", "ATTEMPT", "CREATED", "LAST ERROR OR PARENTS").rstrip())
    for job in found:
        note = (job.last_error or "").strip().splitlines()[-1:] or [""]
        if job.state is State.WAITING:
            note = [f"waiting on {job.pending_parents} of {len(job.parents)} parents: {_ids(job.parents)}"]
        fields = (job.id, job.state.value, job.queue, job.task, f"{job.charged_attempts}/{job.attempt_budget}",
                  f"{job.created_at:%Y-%m-%d %H:%M:%S}", note[0][:80])  # fmt: skip
        click.echo(_JOB_LINE.format(*fields).rstrip())


def _ids(ids: Sequence[int], shown: int = 10) -> str:
    """Job ids for one line: the first ``shown``, then how many more."""
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(map(str, ids[:shown])) + more


@jobs.command("show")
@click.argument("job_id", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@database_option
@friendly_errors
def show_job(job_id: int, as_json: bool, database_url: str | None) -> None:
    """Every field of one job (its result, parents and dependents too), with its error history."""
    with open_client(database_url) as client:
        job = client.get(job_id)
    fields = _job_dict(job)
    if as_json:
        click.echo(to_json(fields))
        return
    history = fields.pop("errors")
    # Attempts as people read them, charged of the budget (the attempt number is a fencing token).
    fields = {key: value for key, value in fields.items() if key not in ("max_attempts", "attempt_budget")}
    fields["attempt"] = job.describe_attempts().removeprefix("attempt ")
    for key, value in fields.items():
        shown = to_json(value) if key in ("payload", "result", "parents", "dependents") else value
        click.echo(f"{key:>16}: {shown}")
    for entry in history:  # each entry names the run it ended (the attempt number at the time)
        click.echo(f"--- run {entry['attempt']} at {entry['at']} on {entry['worker']}\n{entry['error']}")


def _job_dict(job: JobRecord) -> dict[str, Any]:
    fields = {k: v for k, v in job.__dict__.items() if k != "errors"}
    fields["state"] = job.state.value
    fields["charged_attempts"] = job.charged_attempts
    fields["errors"] = [e.__dict__ for e in job.errors]
    return fields


@main.command()
@click.argument("job_ids", type=JOB_ID, nargs=-1)
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(["dead", "failed", "cancelled"]),
    help="Requeue every job in this state (repeatable) instead of listing ids.",
)
@click.option("--queue", help="With --state: only this queue.")
@click.option("--task", help="With --state: only this task.")
@database_option
@friendly_errors
def requeue(
    job_ids: tuple[int, ...], states: tuple[str, ...], queue: str | None, task: str | None, database_url: str | None
) -> None:
    """Make dead, failed or cancelled jobs available again (ids, or an explicit --state filter)."""
    if bool(job_ids) == bool(states) or (job_ids and (queue or task)):
        raise click.UsageError("give job ids, or --state (with optional --queue/--task), but not both")
    with open_client(database_url) as client:
        if job_ids:
            click.echo(f"requeued {len(client.requeue(list(job_ids)))} job(s)")
        else:
            n = client.requeue_matching([State(s) for s in states], queue=queue, task=task)
            click.echo(f"requeued {n} job(s)")


@main.command()
@click.argument("job_ids", type=JOB_ID, nargs=-1, required=True)
@database_option
@friendly_errors
def cancel(job_ids: tuple[int, ...], database_url: str | None) -> None:
    """Cancel available or running jobs (a running handler is told at its next heartbeat)."""
    with open_client(database_url) as client:
        cancelled = client.cancel(list(job_ids))
    click.echo(f"cancelled {len(cancelled)} job(s)")


class Duration(click.ParamType):  # type: ignore[type-arg]
    """A duration such as 90s, 30m, 24h, 7d or 2w."""

    name = "duration"
    UNITS: ClassVar[dict[str, int]] = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        text = str(value).strip().lower()
        try:
            number, unit = (float(text[:-1]), text[-1]) if text[-1:] in self.UNITS else (float(text), "s")
        except ValueError:
            self.fail(f"{value!r} is not a duration: use a number with s, m, h, d or w (e.g. 7d)", param, ctx)
        if not number >= 0:
            self.fail(f"{value!r} is not a duration: it must not be negative", param, ctx)
        return number * self.UNITS[unit]


@main.command()
@click.option("--older-than", type=Duration(), required=True, help="Only jobs finished longer ago (e.g. 7d).")
@click.option("--state", "states", multiple=True, type=click.Choice(["completed", "cancelled", "failed", "dead"]),
              help="States to prune (repeatable; default: completed and cancelled).")  # fmt: skip
@database_option
@friendly_errors
def prune(older_than: float, states: tuple[str, ...], database_url: str | None) -> None:
    """Delete finished jobs older than --older-than (an explicit age is required)."""
    chosen = [State(s) for s in states] or [State.COMPLETED, State.CANCELLED]
    with open_client(database_url) as client:
        deleted = client.prune(chosen, older_than)
    click.echo(f"deleted {deleted} job(s) ({', '.join(s.value for s in chosen)}) finished over {older_than:g}s ago")


@main.group()
def periodic() -> None:
    """Periodic schedules."""


@periodic.command("list")
@click.option("--app", "app_ref", required=True, help="The app whose schedules to list, as module:attribute.")
@database_option
@friendly_errors
def list_periodic(app_ref: str, database_url: str | None) -> None:
    """Each schedule of the app: cron, task, enabled, last and next slot."""
    app = load_app(app_ref)
    with open_client(database_url) as client:
        state = client.periodic_state()
        now = client.now()
    for name, schedule in sorted(app.schedules.items()):
        last, enabled = state.get(name, (None, True))
        click.echo(f"{name:<24} {schedule.cron:<16} task {schedule.task:<20} {'enabled ' if enabled else 'disabled'} "
                   f"last {last or '-'}  next {schedule.next_slot(now)}")  # fmt: skip


schedule_app_option = click.option(
    "--app",
    "app_ref",
    help="The app that defines the schedule (module:attribute): needed for one no scheduler has run yet.",
)


@periodic.command("enable")
@click.argument("name")
@schedule_app_option
@database_option
@friendly_errors
def enable_periodic(name: str, app_ref: str | None, database_url: str | None) -> None:
    """Enable schedule NAME (a schedule a scheduler has run, or one of --app's)."""
    app = load_app(app_ref) if app_ref else None
    with open_client(database_url) as client:
        client.enable_schedule(name, app=app)
    click.echo(f"schedule {name} enabled")


@periodic.command("disable")
@click.argument("name")
@schedule_app_option
@database_option
@friendly_errors
def disable_periodic(name: str, app_ref: str | None, database_url: str | None) -> None:
    """Disable schedule NAME (its slots are skipped until enabled again)."""
    app = load_app(app_ref) if app_ref else None
    with open_client(database_url) as client:
        client.disable_schedule(name, app=app)
    click.echo(f"schedule {name} disabled")


@main.group()
def queues() -> None:
    """Pause, resume and cap queues."""


create_option = click.option(
    "--create", is_flag=True, help="Also accept a queue not seen yet (no job waiting or running, never paused)."
)


@queues.command("pause")
@click.argument("names", nargs=-1, required=True)
@create_option
@database_option
@friendly_errors
def pause_queues(names: tuple[str, ...], create: bool, database_url: str | None) -> None:
    """Stop every worker, on every host, from claiming jobs of these queues (all or none)."""
    with open_client(database_url) as client:
        paused = client.pause_queues(names, create=create)
    click.echo(f"paused {', '.join(paused)}")


@queues.command("resume")
@click.argument("names", nargs=-1, required=True)
@create_option
@database_option
@friendly_errors
def resume_queues(names: tuple[str, ...], create: bool, database_url: str | None) -> None:
    """Let workers claim jobs of these queues again (all or none)."""
    with open_client(database_url) as client:
        resumed = client.resume_queues(names, create=create)
    click.echo(f"resumed {', '.join(resumed)}")


@queues.command("limit")
@click.argument("name")
@click.argument("max_running", type=click.IntRange(1, 1_000_000), required=False)
@click.option("--remove", is_flag=True, help="Lift the queue's cap.")
@create_option
@database_option
@friendly_errors
def limit_queue(name: str, max_running: int | None, remove: bool, create: bool, database_url: str | None) -> None:
    """Cap the running jobs of queue NAME at MAX_RUNNING across every worker on every host
    (or lift the cap with --remove)."""
    if (max_running is None) == (not remove):
        raise click.UsageError("give either MAX_RUNNING or --remove")
    with open_client(database_url) as client:
        client.limit_queue(name, max_running, create=create)
    click.echo(f"queue {name}: at most {max_running} running" if max_running else f"queue {name}: no cap")


@queues.command("list")
@click.option(
    "--json", "as_json", is_flag=True, help='Print the queues as a JSON array of {"queue", "paused", "max_running"}.'
)
@database_option
@friendly_errors
def list_queues(as_json: bool, database_url: str | None) -> None:
    """Every queue that has jobs, is paused or capped: whether it is paused, and its cap."""
    with open_client(database_url) as client:
        found = client.list_queues()
        caps = client.queue_limits()
    names = sorted(set(found) | set(caps))
    if as_json:
        rows = [{"queue": n, "paused": found.get(n, False), "max_running": caps.get(n)} for n in names]
        click.echo(to_json(rows))
        return
    for name in names:
        cap = f"at most {caps[name]} running" if name in caps else "no cap"
        click.echo(f"{name:<32} {'paused' if found.get(name) else 'active':<8} {cap}")


@main.command("limits")
@click.option("--json", "as_json", is_flag=True, help="Print the limits as a JSON array.")
@click.option("--limit", "count", type=click.IntRange(1, 10_000), default=100, show_default=True,
              help="Show at most this many limits (those with the most jobs waiting, then slots held).")  # fmt: skip
@database_option
@friendly_errors
def limits(as_json: bool, count: int, database_url: str | None) -> None:
    """The limits jobs wait on or hold slots of: for each, the due jobs that name it, and its
    slots held and by which jobs, or its tokens left (see the README's "Limits")."""
    with open_client(database_url) as client:
        waits = client.limit_waits(count)
    if as_json:
        click.echo(to_json([w._asdict() for w in waits]))
        return
    if not waits:
        click.echo("no job is waiting on a limit or holding a slot")
        return
    click.echo(f"{'LIMIT':<48} {'WAITING':>8}  STATE")
    for w in waits:
        if w.max_running is not None:
            state = f"{w.held or 0}/{w.max_running} slots held"
            if w.holders:
                state += f" by job{'s' if len(w.holders) > 1 else ''} {_ids(w.holders)}"
        elif w.rate is not None:
            state = f"{w.rate:g}/s, {w.tokens or 0:.1f} tokens left"
        else:
            state = "no limit row (enqueue again to create it)"
        click.echo(f"{w.scope:<48} {w.waiting:>8}  {state}")


@main.command()
@click.option("--url", help="Probe this URL (e.g. http://127.0.0.1:9187/readyz) instead of the database.")
@click.option("--timeout", type=Seconds(0.1, 3600), default=5.0, show_default=True, help="Seconds.")
@database_option
@friendly_errors
def healthcheck(url: str | None, timeout: float, database_url: str | None) -> None:
    """Exit 0 if healthy, 1 if not (for exec probes): the supervisor's probe URL, or else the
    database's reachability and schema version."""
    if url:
        healthy, detail = probe_url(url, timeout)
    else:
        healthy, detail = probe_database(resolve_database(database_url), timeout, current_schema())
    click.echo(f"{'healthy' if healthy else 'unhealthy'}: {detail}")
    sys.exit(0 if healthy else 1)


@main.command()
@database_option
@friendly_errors
def demo(database_url: str | None) -> None:
    """Enqueue five jobs of different priorities and run them under a real supervisor with one
    worker: each prints a line as it is processed, highest priority first (FIFO within a priority)."""
    from .demo import DEMO_JOBS
    from .demo import app as demo_app

    dsn = resolve_database(database_url)
    with Client(dsn, schema=current_schema()) as client:
        ids = []
        for name, _priority in DEMO_JOBS:
            ids.append(demo_app.enqueue(client, name).id)
            click.echo(f"enqueued {name} (priority {_priority})")
        supervisor = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "miniqueue.cli",
                "supervise",
                "--schema",
                current_schema(),
                "--app",
                "miniqueue.cli.demo:app",
                "--workers",
                "1",
                "--log-level",
                "WARNING",
                "--poll-interval",
                "0.2",
            ],
            env={**os.environ, "DATABASE_URL": dsn},
        )
        try:
            deadline = time.monotonic() + 60
            while any(client.get(i).state != State.COMPLETED for i in ids):
                if supervisor.poll() is not None or time.monotonic() > deadline:
                    raise click.ClickException("the demo did not finish: see the supervisor's output above")
                time.sleep(0.1)
        finally:
            supervisor.send_signal(signal.SIGTERM)
            supervisor.wait(30)
    click.echo("all 5 demo jobs completed, in priority order (FIFO within a priority)")


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Also answer requests for this host name (repeatable; localhost and --host always). '*': any.",
)
@click.option(
    "--insecure-bind-public",
    is_flag=True,
    help="Listen beyond localhost without authentication (only behind a proxy that authenticates).",
)
@click.option("--read-only", is_flag=True, help="Show everything, change nothing.")
@click.option("--app", "app_ref", help="Your app (module:attribute): schedules' cron and next run, and run now.")
@database_option
@friendly_errors
def web(
    host: str,
    port: int,
    allowed_hosts: tuple[str, ...],
    insecure_bind_public: bool,
    read_only: bool,
    app_ref: str | None,
    database_url: str | None,
) -> None:
    """Serve the dashboard (needs the `web` extra: pip install '.[web]' from a checkout)."""
    from ..core.errors import ConfigError
    from ..core.process import set_label, set_title

    # --database-url may hold a password: out of ps before anything slow runs.
    set_title(f"web [{host}]:{port}" if ":" in host else f"web {host}:{port}")
    set_label("web")
    try:
        from ..web.server import check_bind, serve
    except ImportError as exc:
        needs = "the dashboard needs the web extra: pip install '.[web]' from a checkout"
        raise click.ClickException(f"{needs} ({exc})") from None
    try:
        check_bind(host, insecure_bind_public=insecure_bind_public)
    except ConfigError as exc:  # the command line asked for something unsafe: exit 2, as for a bad option
        click.echo(f"Error: {exc}", err=True)
        raise click.exceptions.Exit(2) from None
    serve(
        resolve_database(database_url),
        schema=current_schema(),
        host=host,
        port=port,
        read_only=read_only,
        app_ref=app_ref,
        allowed_hosts=allowed_hosts,
        insecure_bind_public=insecure_bind_public,
    )


def _seconds(name: str, default: float | None) -> Callable[[F], F]:
    return click.option(f"--{name}", type=float, default=default, show_default=True, help="Seconds.")


@click.command(
    cls=OneLineCommand, context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "MINIQUEUE"}
)
@click.option("--app", "app_ref", required=True, help="The app to run, as module:attribute.")
@click.option("--workers", type=int, default=os.cpu_count() or 1, show_default=True, help="Worker processes.")
@click.option("--queues", help="Comma-separated queues to claim from (default: every queue of the app's tasks).")
@click.option(
    "--concurrency", type=int, default=1, show_default=True,
    help="Per worker: handler threads for def tasks, and coroutines for async def tasks (each up to this).",
)  # fmt: skip
@click.option(
    "--prefetch",
    default="auto",
    show_default=True,
    help="Jobs claimed ahead of free threads: 'auto' (sized to finish within --prefetch-budget), a number, "
    "or 0 for one job per free thread.",
)
@click.option(
    "--prefetch-budget",
    type=float,
    default=0.1,
    show_default=True,
    help="Seconds of expected work 'auto' prefetch holds per thread; jobs stuck behind handlers past it go back.",
)
@_seconds("lease-duration", 30.0)
@_seconds("heartbeat-interval", None)
@_seconds("poll-interval", 1.0)
@_seconds("reaper-interval", 5.0)
@_seconds("shutdown-timeout", 10.0)
@click.option(
    "--vacuum/--no-vacuum", default=True, show_default=True,
    help="The reaper vacuums the jobs table as claims churn it, between autovacuum's visits.",
)  # fmt: skip
@click.option("--max-jobs-per-child", type=int, help="Recycle a worker after this many jobs.")
@click.option("--max-memory-per-child", type=float, help="Recycle a worker whose RSS passes this many MB.")
@click.option("--preload", is_flag=True, help="Import the app once before forking (copy-on-write).")
@click.option("--poll-only", is_flag=True, help="Do not LISTEN (for PgBouncer in transaction mode).")
@click.option(
    "--listen-url",
    envvar="MINIQUEUE_LISTEN_URL",
    help="LISTEN on this direct PostgreSQL URL (when the database URL is PgBouncer's in transaction mode).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    help="Serve /metrics (Prometheus), /livez and /readyz on this port.",
)
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="Address for --metrics-port.")
@click.option(
    "--metrics-interval", type=float, default=5.0, show_default=True,
    help="Seconds between the reaper's readings of the queue gauges that /metrics serves.",
)  # fmt: skip
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@database_option
@friendly_errors
def supervise(
    app_ref: str,
    workers: int,
    queues: str | None,
    concurrency: int,
    prefetch: str,
    prefetch_budget: float,
    lease_duration: float,
    heartbeat_interval: float | None,
    poll_interval: float,
    reaper_interval: float,
    shutdown_timeout: float,
    vacuum: bool,
    max_jobs_per_child: int | None,
    max_memory_per_child: float | None,
    preload: bool,
    poll_only: bool,
    listen_url: str | None,
    metrics_port: int | None,
    metrics_host: str,
    metrics_interval: float,
    log_format: str,
    log_level: str,
    database_url: str | None,
) -> None:
    """Run worker processes and a reaper under a prefork supervisor.

    Signals: TERM/INT drain and exit; a second INT or QUIT exits fast; HUP replaces the workers;
    TTIN/TTOU add or remove one worker.
    """
    # Imported here: the inspection commands run without the supervisor's modules (a quick CLI).
    from ..maintenance.reaper import ReaperConfig
    from ..observability.logs import configure_logging
    from ..supervise.config import SupervisorConfig
    from ..supervise.supervisor import Supervisor
    from ..worker.prefetch import parse_prefetch
    from ..worker.worker import WorkerConfig

    configure_logging(log_level, log_format)
    worker = WorkerConfig(
        queues=[q.strip() for q in queues.split(",") if q.strip()] if queues else None,
        concurrency=concurrency,
        prefetch=parse_prefetch(prefetch),
        prefetch_budget=prefetch_budget,
        lease_seconds=lease_duration,
        heartbeat_seconds=heartbeat_interval,
        poll_interval=poll_interval,
        shutdown_timeout=shutdown_timeout,
        poll_only=poll_only,
        listen_url=listen_url or None,
    )
    config = SupervisorConfig(
        dsn="",
        schema=current_schema(),
        app_ref=app_ref,
        workers=workers,
        worker=worker,
        reaper=ReaperConfig(interval=reaper_interval, vacuum=vacuum),
        max_jobs_per_child=max_jobs_per_child,
        max_memory_mb=max_memory_per_child,
        preload=preload,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        metrics_interval=metrics_interval,
    ).validated()
    announce = logging.getLogger("miniqueue.embedded").warning
    config = dataclasses.replace(config, dsn=resolve_database(database_url, announce))
    sys.exit(Supervisor(config).run())


main.add_command(supervise)


def supervise_main() -> None:
    """Entry point of ``miniqueue-supervise``."""
    supervise(prog_name="miniqueue-supervise")

