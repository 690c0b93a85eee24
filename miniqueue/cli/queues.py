"""Commands on queues: ``stats``, ``queues`` (pause, resume, limit, age, list) and ``limits``."""

from __future__ import annotations

from typing import Any

import click

from ..client.client import Client
from ..client.inspection import LimitWait
from ..client.merging import TOTAL, QueueSetting, answered, total_settings, total_waits, unreachable
from ..client.sharded import ShardedClient, summed
from ..core.errors import DatabaseUnavailable
from ..core.records import QueueStats, State
from ..core.shard_map import ShardMap
from ..core.validation import MAX_DELAY_SECONDS
from .database import client_command, current_schema, database_option, open_client
from .errors import friendly_errors
from .output import ids_line, to_json
from .params import Seconds
from .shards import database_or_map_command, finish_map, load_map, open_map


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as a JSON array, one object per queue.")
@click.option(
    "--recount",
    is_flag=True,
    help="First recount finished jobs from the table (a repair after migrating with workers running; reads every row).",
)
@database_or_map_command
def stats(as_json: bool, recount: bool, database_url: str | None, shards_source: str | None) -> None:
    """Per queue: jobs by state, the oldest waiting job's age, running and expired leases; with
    a shard map, per database and in total (a database that does not answer is named, exit 1).

    Finished jobs are counted as they finish, so this costs the same at any table size."""
    if shards_source:
        _sharded_stats(load_map(shards_source), as_json, recount)
        return
    with open_client(database_url) as client:
        if recount:
            client.recount()
        queues = client.queue_stats()
    if as_json:
        click.echo(to_json([_stats_dict(q) for q in queues]))
        return
    _print_table([("", q) for q in queues])
    for q in queues:
        if q.stranded:
            click.echo(
                f"note: no worker has ever served queue {q.queue!r}, where {q.stranded} job(s) wait "
                '(see "Tasks and their options" in docs/guides/tasks.md)',
                err=True,
            )
        if q.unrun_task is not None:
            click.echo(
                f"note: no live worker runs task {q.unrun_task!r}, whose job is next in queue {q.queue!r}: "
                "the queue's live workers declare other tasks (see `miniqueue jobs why`)",
                err=True,
            )


def _sharded_stats(shards: ShardMap, as_json: bool, recount: bool) -> None:
    """``stats`` over every database of a map: each database's rows, then each queue's total."""
    with ShardedClient(shards, schema=current_schema()) as client:
        if recount:
            for name in shards.databases:
                client.client(name).recount()
        by_database = client.queue_stats_by_database()
    rows: list[tuple[str, QueueStats]] = []
    totals: dict[str, QueueStats] = {}
    down = {name: str(found) for name, found in by_database.items() if isinstance(found, DatabaseUnavailable)}
    for name, found in by_database.items():
        for q in [] if isinstance(found, DatabaseUnavailable) else found:
            rows.append((name, q))
            totals[q.queue] = q if q.queue not in totals else summed(totals[q.queue], q)
    rows += [("total", totals[queue]) for queue in sorted(totals)]
    if as_json:
        found_rows = [{"database": name, **_stats_dict(q)} for name, q in rows]
        click.echo(to_json(found_rows + [{"database": name, "unreachable": why} for name, why in down.items()]))
    else:
        _print_table(rows)
        for name, why in down.items():
            click.echo(f"database {name}: unreachable ({why}): its queues are not counted above", err=True)
    if down:
        raise SystemExit(1)


def _print_table(rows: list[tuple[str, QueueStats]]) -> None:
    """The stats table, with a database column when the rows name databases."""
    sharded = any(name for name, _ in rows)
    headers = ["queue", *(s.value for s in State), "scheduled", "oldest waiting (s)", "expired leases"]
    table = [["database", *headers] if sharded else headers]
    for name, q in rows:
        oldest = "-" if q.oldest_available_seconds is None else f"{q.oldest_available_seconds:.1f}"
        cells = [q.queue, *(str(q.counts[s]) for s in State), str(q.scheduled), oldest, str(q.expired_leases)]
        table.append([name, *cells] if sharded else cells)
    headers = table[0]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]
    for row in table:
        click.echo(
            "  ".join(
                cell.ljust(w) if i <= int(sharded) else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )


def _stats_dict(q: QueueStats) -> dict[str, Any]:
    return {
        "queue": q.queue,
        **{s.value: n for s, n in q.counts.items()},
        "scheduled": q.scheduled,
        "oldest_available_seconds": q.oldest_available_seconds,
        "expired_leases": q.expired_leases,
        "served": q.served,
        "unrun_task": q.unrun_task,
    }


@click.group()
def queues() -> None:
    """Pause, resume and cap queues."""


create_option = click.option(
    "--create", is_flag=True, help="Also accept a queue not seen yet (no job waiting or running, never paused)."
)


def _pause_command(verb: str, paused: bool, doc: str) -> click.Command:
    """``queues pause`` or ``queues resume``: one command, but for the verb."""

    @queues.command(verb, help=doc)
    @click.argument("names", nargs=-1, required=True)
    @create_option
    @client_command
    def switch(names: tuple[str, ...], create: bool, client: Client) -> None:
        switched = (client.pause_queues if paused else client.resume_queues)(names, create=create)
        click.echo(f"{verb}d {', '.join(switched)}")

    return switch


pause_queues = _pause_command(
    "pause", True, "Stop every worker, on every host, from claiming jobs of these queues (all or none)."
)
resume_queues = _pause_command("resume", False, "Let workers claim jobs of these queues again (all or none).")


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


@queues.command("age")
@click.argument("name")
@click.argument("seconds", type=Seconds(min=0, min_open=True, max=MAX_DELAY_SECONDS), required=False)
@click.option("--off", is_flag=True, help="Stop aging the queue's jobs (they keep the priorities they reached).")
@create_option
@database_option
@friendly_errors
def age_queue(name: str, seconds: float | None, off: bool, create: bool, database_url: str | None) -> None:
    """Age the jobs of queue NAME: each due job's priority rises one step per SECONDS it has been
    due, up to the highest priority among the queue's waiting jobs, so that a stream of
    high-priority jobs never starves the rest (or stop with --off). The reaper raises them: see
    "Priority aging" in docs/guides/fairness.md."""
    if (seconds is None) == (not off):
        raise click.UsageError("give either SECONDS or --off")
    with open_client(database_url) as client:
        client.age_queue(name, seconds, create=create)
    click.echo(f"queue {name}: {_aging(seconds)}")


def _aging(seconds: float | None) -> str:
    return "no aging" if seconds is None else f"priority rises a step per {seconds:g}s due"


@queues.command("list")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print the queues as a JSON array of {"queue", "paused", "max_running", "age_after"}.',
)
@database_or_map_command
def list_queues(as_json: bool, database_url: str | None, shards_source: str | None) -> None:
    """Every queue that has jobs, is paused, capped or aging: whether it is paused, its cap and its
    aging; with a shard map, per database (each holds its own cap) and each queue's total (a
    database that does not answer is named, exit 1)."""
    if shards_source:
        _sharded_queues(shards_source, as_json)
        return
    with open_client(database_url) as client:
        found = client.list_queues()
        caps = client.queue_limits()
        aging = client.queue_aging()
    names = sorted(set(found) | set(caps) | set(aging))
    if as_json:
        rows = [
            {"queue": n, "paused": found.get(n, False), "max_running": caps.get(n), "age_after": aging.get(n)}
            for n in names
        ]
        click.echo(to_json(rows))
        return
    for name in names:
        cap = f"at most {caps[name]} running" if name in caps else "no cap"
        ages = f", {_aging(aging[name])}" if name in aging else ""
        click.echo(f"{name:<32} {'paused' if found.get(name) else 'active':<8} {cap}{ages}")


def _sharded_queues(shards_source: str, as_json: bool) -> None:
    """``queues list`` over every database of a map: each database's queues, then each queue's
    total (paused on which databases, and the sum of the caps)."""
    with open_map(shards_source) as client:
        answers = client.queue_settings_by_database()
    found = answered(answers)
    rows = [(name, setting) for name, settings in found.items() for setting in settings]
    rows += [(TOTAL, total) for total in total_settings(found)]
    if as_json:
        finish_map(unreachable(answers), [_setting_dict(name, s) for name, s in rows], "queues")
        return
    width = max([len("DATABASE"), *(len(name) for name, _ in rows)])
    click.echo(f"{'DATABASE':<{width}}  {'QUEUE':<32} {'STATE':<16} CAP")
    for name, setting in rows:
        paused = "paused" if setting.paused else "active"
        if setting.paused_on and not setting.paused:
            paused = f"paused on {', '.join(setting.paused_on)}"
        cap = "no cap" if setting.max_running is None else f"at most {setting.max_running} running"
        if name == TOTAL and setting.max_running is not None:
            cap += " in all"
        click.echo(f"{name:<{width}}  {setting.queue:<32} {paused:<16} {cap}")
    finish_map(unreachable(answers), None, "queues")


def _setting_dict(name: str, setting: QueueSetting) -> dict[str, Any]:
    found = {"database": name, "queue": setting.queue, "paused": setting.paused, "max_running": setting.max_running}
    return {**found, "paused_on": list(setting.paused_on)} if name == TOTAL else found


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
@database_or_map_command
def limits(as_json: bool, count: int, database_url: str | None, shards_source: str | None) -> None:
    """The limits jobs wait on or hold slots of: for each, the due jobs that name it, and its
    slots held and by which jobs, or its tokens left (see docs/guides/limits.md); with a shard
    map, per database (each enforces its own) and in total (a database that does not answer is
    named, exit 1)."""
    if shards_source:
        _sharded_limits(shards_source, count, as_json)
        return
    with open_client(database_url) as client:
        waits = client.limit_waits(count)
    if as_json:
        click.echo(to_json([_wait_dict(w) for w in waits]))
        return
    if not waits:
        click.echo("no job is waiting on a limit or holding a slot")
        return
    click.echo(f"{'LIMIT':<48} {'WAITING':>8}  STATE")
    for w in waits:
        click.echo(f"{w.scope:<48} {w.waiting:>8}  {_wait_state(w)}")


def _wait_dict(w: LimitWait) -> dict[str, Any]:
    """A limit as ``limits --json`` shows it: ``paused_until`` and ``paused_by`` only while it
    is paused (back-pressure)."""
    found = w._asdict()
    if w.paused_until is None:
        del found["paused_until"], found["paused_by"]
    return found


def _wait_state(w: LimitWait) -> str:
    """A limit's state as ``limits`` shows it: slots held and by whom, or tokens left; and
    until when it is paused, by which job (back-pressure)."""
    state = _room_state(w)
    if w.paused_until is not None:
        state += f"; paused until {w.paused_until.isoformat(timespec='seconds')} by job {w.paused_by}"
    return state


def _room_state(w: LimitWait) -> str:
    """Slots held and by whom, or tokens left."""
    if w.max_running is not None:
        state = f"{w.held or 0}/{w.max_running} slots held"
        if w.holders:
            state += f" by job{'s' if len(w.holders) > 1 else ''} {ids_line(w.holders)}"
        return state
    if w.rate is not None:
        return f"{w.rate:g}/s, {w.tokens or 0:.1f} tokens left"
    return "no limit row (enqueue again to create it)"


def _sharded_limits(shards_source: str, count: int, as_json: bool) -> None:
    """``limits`` over every database of a map: each limit's row on each database, then its
    total (the fleet's slots and tokens are the sums: each database enforces it alone)."""
    with open_map(shards_source) as client:
        answers = client.limit_waits_by_database(count)
    found = answered(answers)
    totals = total_waits(found, count)
    shown = {w.scope for w in totals}
    rows = [(name, w) for name, waits in found.items() for w in waits if w.scope in shown]
    rows += [(TOTAL, w) for w in totals]
    if as_json:
        finish_map(unreachable(answers), [{"database": name, **w._asdict()} for name, w in rows], "limits")
        return
    if not rows:
        click.echo("no job is waiting on a limit or holding a slot")
    else:
        width = max([len("DATABASE"), *(len(name) for name, _ in rows)])
        click.echo(f"{'DATABASE':<{width}}  {'LIMIT':<48} {'WAITING':>8}  STATE")
        for name, w in rows:
            click.echo(f"{name:<{width}}  {w.scope:<48} {w.waiting:>8}  {_wait_state(w)}")
    finish_map(unreachable(answers), None, "limits")
