"""Commands on jobs: ``enqueue``, ``jobs list``, ``jobs show``, ``requeue`` and ``cancel``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import click

from ..core.records import Debounce, JobRecord, State
from .database import database_option, open_client
from .errors import friendly_errors
from .output import ids_line, to_json
from .params import JOB_ID, JsonText


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
    as_json: bool,
    database_url: str | None,
) -> None:
    """Enqueue one job of TASK, with the options its task declares unless given here (see
    "Tasks and their options" in docs/guides/tasks.md)."""
    conflict = _on_conflict(on_conflict, debounce_wait, debounce_max_wait)
    states = None if unique_states is None else [s.strip() for s in unique_states.split(",") if s.strip()]
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
            unique_key=unique_key,
            unique_states=states,
            unique_window=unique_window,
            on_conflict=conflict,
            sequence_key=sequence_key,
            on_failure=on_failure,
            expires_in=expires_in,
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
def list_jobs(
    queue: str | None,
    state: str | None,
    task: str | None,
    limit: int,
    before_id: int | None,
    as_json: bool,
    database_url: str | None,
) -> None:
    """Jobs matching the filters, newest first (a waiting job: the parents it waits for)."""
    with open_client(database_url) as client:
        found = client.list_jobs(
            state=State(state) if state else None, queue=queue, task=task, before_id=before_id, limit=limit
        )
    if as_json:
        click.echo(to_json([_job_dict(job) for job in found]))
        return
    click.echo(_JOB_LINE.format("ID", "STATE", "QUEUE", "TASK", "ATTEMPT", "CREATED", "LAST ERROR OR PARENTS").rstrip())
    for job in found:
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
        click.echo(_JOB_LINE.format(*fields).rstrip())


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
@database_option
@friendly_errors
def cancel(job_ids: tuple[int, ...], database_url: str | None) -> None:
    """Cancel available or running jobs (a running handler is told at its next heartbeat)."""
    with open_client(database_url) as client:
        cancelled = client.cancel(list(job_ids))
    click.echo(f"cancelled {len(cancelled)} job(s)")
