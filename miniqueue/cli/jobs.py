"""Commands on jobs: ``enqueue``, ``jobs list``, ``jobs show``, ``jobs why``, ``requeue`` and
``cancel`` (``jobs list`` and ``jobs show`` over a shard map too: ``--shards``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import click

from ..client.client import Client
from ..core.records import Debounce, JobRecord, State
from .database import client_command, database_option, open_client
from .errors import friendly_errors
from .output import ids_line, to_json
from .params import JOB_ID, JsonText
from .shards import database_or_map_command, finish_map, open_map


@click.command()
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
@click.option("--unique-key", help="Conflict with the job holding this key (see docs/guides/keys.md).")
@click.option(
    "--unique-states",
    help="Comma-separated states the key conflicts in: waiting,scheduled,available[,running]. Default: all four.",
)
@click.option("--unique-window", type=float, help="Also conflict with the key's first job for this many seconds.")
@click.option("--on-conflict", type=click.Choice(["keep", "replace", "debounce"]), help="Default: keep.")
@click.option("--debounce-wait", type=float, help="With --on-conflict debounce: run this long after the last enqueue.")
@click.option("--debounce-max-wait", type=float, help="... but never later than this after the first.")
@click.option("--sequence-key", help="Run one at a time with the other jobs of this key, in enqueue order.")
@click.option("--on-failure", type=click.Choice(["block", "continue"]), help="What a failed job does to its sequence.")
@click.option("--expires-in", type=float, help="Never start later than this many seconds from now (then: expired).")
@click.option(
    "--rate-cost",
    type=int,
    help="Tokens the job takes from its task's rate limit (see docs/guides/limits.md). Default: the task's (else 1).",
)
@click.option(
    "--fair-key", help="Take turns with the other fair jobs of the queue by this key (docs/guides/fairness.md)."
)
@click.option(
    "--strict",
    is_flag=True,
    help="Refuse a task no app has declared on this database (rather than enqueue it, with a note, "
    "where no worker may run it).",
)
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
    unique_key: str | None,
    unique_states: str | None,
    unique_window: float | None,
    on_conflict: str | None,
    debounce_wait: float | None,
    debounce_max_wait: float | None,
    sequence_key: str | None,
    on_failure: str | None,
    expires_in: float | None,
    rate_cost: int | None,
    fair_key: str | None,
    strict: bool,
    as_json: bool,
    database_url: str | None,
) -> None:
    """Enqueue one job of TASK, with the options its task declares unless given here (see
    "Tasks and their options" in docs/guides/tasks.md)."""
    conflict = _on_conflict(on_conflict, debounce_wait, debounce_max_wait)
    states = None if unique_states is None else [s.strip() for s in unique_states.split(",") if s.strip()]
    with open_client(database_url) as client:
        if strict and not client.declares(task):
            raise click.ClickException(
                f"task {task!r} is declared by no app on this database: nothing enqueued (start a worker of its "
                'app once, or publish its declarations; see "Tasks and their options" in docs/guides/tasks.md)'
            )
        result = client.enqueue(
            task,
            payload,
            queue=queue,
            priority=priority,
            delay=delay,
            run_at=run_at,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
            unique_key=unique_key,
            unique_states=states,
            unique_window=unique_window,
            on_conflict=conflict,
            sequence_key=sequence_key,
            on_failure=on_failure,
            rate_cost=rate_cost,
            expires_in=expires_in,
            fair_key=fair_key,
        )
    if as_json:
        click.echo(to_json({"id": result.id, "duplicate": result.duplicate, "replaced": result.replaced}))
    elif result.replaced:
        click.echo(f"job {result.id} already held the key: it took this payload")
    elif result.duplicate:
        click.echo(f"job {result.id} already existed (same idempotency key or unique key): nothing stored")
    else:
        click.echo(f"job {result.id} enqueued")


def _on_conflict(mode: str | None, wait: float | None, max_wait: float | None) -> str | Debounce | None:
    """``--on-conflict`` with its debounce options, checked together."""
    if mode != "debounce":
        if wait is not None or max_wait is not None:
            raise click.UsageError("--debounce-wait and --debounce-max-wait go with --on-conflict debounce")
        return mode
    if wait is None or max_wait is None:
        raise click.UsageError("--on-conflict debounce needs --debounce-wait and --debounce-max-wait")
    return Debounce(wait, max_wait)


@click.group()
def jobs() -> None:
    """Inspect jobs."""


#: A line of `jobs list`: id (as wide as the widest, 10 at least), state, queue, task, attempt,
#: created, last error or parents.
_JOB_LINE = "{:>{id}}  {:<9}  {:<16} {:<24} {:>9}  {:<19}  {}"


@jobs.command("list")
@click.option("--queue")
@click.option("--state", type=click.Choice([s.value for s in State]))
@click.option("--task")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option("--before", "before_id", type=JOB_ID, help="Only jobs listed after this job id (the next page).")
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as a JSON array, newest first.")
@database_or_map_command
def list_jobs(
    queue: str | None,
    state: str | None,
    task: str | None,
    limit: int,
    before_id: int | None,
    as_json: bool,
    database_url: str | None,
    shards_source: str | None,
) -> None:
    """Jobs matching the filters, newest first (a waiting job: the parents it waits for); with a
    shard map, over every database by creation time, each job with its database (a database
    that does not answer is named, exit 1)."""
    filters: dict[str, Any] = {"state": State(state) if state else None, "queue": queue, "task": task}
    if shards_source:
        with open_map(shards_source) as sharded:
            page = sharded.jobs_page(before_id=before_id, limit=limit, **filters)
        rows = [(sharded.shards.database_of(job.id).name, job) for job in page.jobs]
        if as_json:
            finish_map(page.unreachable, [{"database": name, **_job_dict(job)} for name, job in rows], "jobs")
            return
        _print_jobs(rows)
        finish_map(page.unreachable, None, "jobs")
        return
    with open_client(database_url) as client:
        found = client.list_jobs(before_id=before_id, limit=limit, **filters)
    if as_json:
        click.echo(to_json([_job_dict(job) for job in found]))
        return
    _print_jobs([("", job) for job in found])


def _print_jobs(rows: Sequence[tuple[str, JobRecord]]) -> None:
    """The table of ``jobs list``, with a database column when the rows name databases."""
    sharded = any(name for name, _ in rows)
    width = max([len("DATABASE"), *(len(name) for name, _ in rows)])
    ids = max([10, *(len(str(job.id)) for _, job in rows)])
    header = _JOB_LINE.format("ID", "STATE", "QUEUE", "TASK", "ATTEMPT", "CREATED", "LAST ERROR OR PARENTS", id=ids)
    click.echo((f"{'DATABASE':<{width}}  {header}" if sharded else header).rstrip())
    for name, job in rows:
        note = (job.last_error or "").strip().splitlines()[-1:] or [""]
        if job.state is State.WAITING and job.sequence_key is not None:
            note = [f"waiting its turn in sequence {job.sequence_key}"]
        elif job.state is State.WAITING:
            note = [f"waiting on {job.pending_parents} of {len(job.parents)} parents: {ids_line(job.parents)}"]
        fields = (
            job.id,
            job.state.value,
            job.queue,
            job.task,
            f"{job.charged_attempts}/{job.attempt_budget}",
            f"{job.created_at:%Y-%m-%d %H:%M:%S}",
            note[0][:80],
        )
        line = _JOB_LINE.format(*fields, id=ids)
        click.echo((f"{name:<{width}}  {line}" if sharded else line).rstrip())


@jobs.command("show")
@click.argument("job_id", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@database_or_map_command
def show_job(job_id: int, as_json: bool, database_url: str | None, shards_source: str | None) -> None:
    """Every field of one job (its result, parents and dependents too), with its error history;
    with a shard map, from the database its id names (shown first)."""
    where: dict[str, Any] = {}
    if shards_source:
        with open_map(shards_source) as sharded:
            database, job = sharded.find(job_id)
            progress = sharded.read_on(database, lambda client: client.progress(job_id)).progress
        where = {"database": database.name}
    else:
        with open_client(database_url) as client:
            job = client.get(job_id)
            progress = client.progress(job_id).progress
    fields = {**where, **_job_dict(job), "progress": None if progress is None else progress.__dict__}
    if as_json:
        click.echo(to_json(fields))
        return
    history = fields.pop("errors")
    del fields["steps"]
    # Attempts as people read them, charged of the budget (the run counts every run: the fencing token).
    fields = {key: value for key, value in fields.items() if key not in ("max_attempts", "attempt_budget", "aged_from")}
    fields["attempt"] = job.describe_attempts().removeprefix("attempt ")
    fields["priority"] = job.describe_priority()
    fields["progress"] = "-" if progress is None else f"{progress.describe()} at {progress.at}"
    for key, value in fields.items():
        shown = to_json(value) if key in ("payload", "result", "parents", "dependents") else value
        click.echo(f"{key:>16}: {shown}")
    for number, step in enumerate(job.steps, 1):
        click.echo(f"{'step ' + str(number):>16}: {step.describe()} (run {step.attempt})")
    for entry in history:  # attempts numbered as counted above; a run handed back by its run
        click.echo(f"--- {_history_heading(entry)}\n{entry['error']}")


@jobs.command("why")
@click.argument("job_id", type=JOB_ID)
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis as JSON.")
@client_command
def why_job(job_id: int, as_json: bool, client: Client) -> None:
    """Why job JOB_ID has not run: each cause that holds it back, most decisive first (its
    deadline, a blocked sequence, a paused queue, no worker, parents, a signal, its turn, a
    schedule, a full limit, an expired lease), or that it ran, runs, or is due."""
    diagnosis = client.why(job_id)
    if as_json:
        click.echo(to_json(diagnosis.to_dict()))
        return
    click.echo(
        f"job {job_id} ({diagnosis.task}, queue {diagnosis.queue}): {diagnosis.state.value}, {diagnosis.attempts}"
    )
    for cause in diagnosis.causes:
        click.echo(f"- {cause.message}")


def _history_heading(entry: dict[str, Any]) -> str:
    """One history entry's heading in ``jobs show``: a requeue, or a run and how it ended."""
    if entry["requeued"]:
        return f"requeued at {entry['at']} (it was {entry['requeued']} since {entry['finished']})"
    name = f"run {entry['run']}, not charged" if entry["attempt"] is None else f"attempt {entry['attempt']}"
    started = f" (run {entry['run']}, started {entry['started']})" if entry["attempt"] is not None else ""
    if entry["attempt"] is None and entry["started"]:
        started = f" (started {entry['started']})"
    return f"{name} ended at {entry['at']}{started} on {entry['worker']}"


def _job_dict(job: JobRecord) -> dict[str, Any]:
    fields = {k: v for k, v in job.__dict__.items() if k != "errors"}
    fields["state"] = job.state.value
    fields["charged_attempts"] = job.charged_attempts
    fields["errors"] = [e.__dict__ for e in job.errors]
    fields["steps"] = [s.__dict__ for s in job.steps]
    return fields


@click.command()
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


@click.command()
@click.argument("job_ids", type=JOB_ID, nargs=-1, required=True)
@client_command
def cancel(job_ids: tuple[int, ...], client: Client) -> None:
    """Cancel available or running jobs (a running handler is told at its next heartbeat)."""
    cancelled = client.cancel(list(job_ids))
    click.echo(f"cancelled {len(cancelled)} job(s)")
