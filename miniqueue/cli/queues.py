"""Commands on queues: ``stats``, ``queues`` (pause, resume, limit, list) and ``limits``."""

from __future__ import annotations

from typing import Any

import click

from ..core.records import QueueStats, State
from .database import database_option, open_client
from .errors import friendly_errors
from .output import ids_line, to_json


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as a JSON array, one object per queue.")
@click.option(
    "--recount",
    is_flag=True,
    help="First recount finished jobs from the table (a repair after migrating with workers running; reads every row).",
)
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
            click.echo(
                f"note: no worker has ever served queue {q.queue!r}, where {q.stranded} job(s) wait "
                '(see "Tasks and their options" in docs/guides/tasks.md)',
                err=True,
            )


def _stats_dict(q: QueueStats) -> dict[str, Any]:
    return {
        "queue": q.queue,
        **{s.value: n for s, n in q.counts.items()},
        "scheduled": q.scheduled,
        "oldest_available_seconds": q.oldest_available_seconds,
        "expired_leases": q.expired_leases,
        "served": q.served,
    }


@click.group()
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


@click.command("limits")
@click.option("--json", "as_json", is_flag=True, help="Print the limits as a JSON array.")
@click.option(
    "--limit",
    "count",
    type=click.IntRange(1, 10_000),
    default=100,
    show_default=True,
    help="Show at most this many limits (those with the most jobs waiting, then slots held).",
)
@database_option
@friendly_errors
def limits(as_json: bool, count: int, database_url: str | None) -> None:
    """The limits jobs wait on or hold slots of: for each, the due jobs that name it, and its
    slots held and by which jobs, or its tokens left (see docs/guides/limits.md)."""
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
                state += f" by job{'s' if len(w.holders) > 1 else ''} {ids_line(w.holders)}"
        elif w.rate is not None:
            state = f"{w.rate:g}/s, {w.tokens or 0:.1f} tokens left"
        else:
            state = "no limit row (enqueue again to create it)"
        click.echo(f"{w.scope:<48} {w.waiting:>8}  {state}")
