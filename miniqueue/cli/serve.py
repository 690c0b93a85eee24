"""The commands that run until stopped: ``web`` (the dashboard) and ``supervise`` (the workers,
also installed as ``miniqueue-supervise``).

Each imports what it runs when it starts, so that the other commands load without the
dashboard's or the supervisor's modules.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..core.scaling import CPU_SATURATED, DEFAULT_SCALE_COOLDOWN, DEFAULT_SCALE_TARGET
from .database import current_schema, database_option, resolve_database
from .errors import OneLineCommand, friendly_errors
from .params import CpuCeiling, Seconds, WorkerCount
from .shards import database_or_map_command, load_map, shards_option

F = TypeVar("F", bound=Callable[..., Any])


@click.command()
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
@database_or_map_command
def web(
    host: str,
    port: int,
    allowed_hosts: tuple[str, ...],
    insecure_bind_public: bool,
    read_only: bool,
    app_ref: str | None,
    database_url: str | None,
    shards_source: str | None,
) -> None:
    """Serve the dashboard (needs the `web` extra: pip install '.[web]' from a checkout); with a
    shard map, over every database of the map (see docs/operations/dashboard.md)."""
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
        load_map(shards_source) if shards_source else resolve_database(database_url),
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
@click.option(
    "--workers",
    type=WorkerCount(),
    show_default="the host's CPUs",
    help="Worker processes: a number, or MIN:MAX to scale between them with the backlog "
    "(see docs/operations/autoscaling.md).",
)
@click.option(
    "--scale-target",
    type=Seconds(min=0, min_open=True),
    default=DEFAULT_SCALE_TARGET,
    show_default=True,
    help="With --workers MIN:MAX: add a worker while the due jobs would take longer than this many seconds to drain.",
)
@click.option(
    "--scale-cooldown",
    type=Seconds(min=0),
    default=DEFAULT_SCALE_COOLDOWN,
    show_default=True,
    help="With --workers MIN:MAX: retire a worker after this many seconds idle with nothing due.",
)
@click.option(
    "--scale-cpu-ceiling",
    type=CpuCeiling(),
    default=f"{CPU_SATURATED:g}",
    show_default=True,
    help="With --workers MIN:MAX: add no worker while the host's CPU is at least this busy (0 to 1), "
    "or 'off' to add workers whatever the CPU.",
)
@click.option("--queues", help="Comma-separated queues to claim from (default: every queue of the app's tasks).")
@click.option(
    "--concurrency",
    type=int,
    default=1,
    show_default=True,
    help="Per worker: handler threads for def tasks, and coroutines for async def tasks (each up to this).",
)
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
    "--vacuum/--no-vacuum",
    default=True,
    show_default=True,
    help="The reaper vacuums the jobs table as claims churn it, between autovacuum's visits.",
)
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
    "--metrics-interval",
    type=float,
    default=5.0,
    show_default=True,
    help="Seconds between the reaper's readings of the queue gauges that /metrics serves.",
)
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@shards_option
@database_option
@friendly_errors
def supervise(
    app_ref: str,
    workers: tuple[int, int | None] | None,
    scale_target: float,
    scale_cooldown: float,
    scale_cpu_ceiling: float,
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
    shards_source: str | None,
) -> None:
    """Run worker processes and a reaper under a prefork supervisor (with a shard map: one
    supervisor per database, the workers shared by weight; see docs/guides/shards.md).

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

    low, high = workers or (os.cpu_count() or 1, None)
    configure_logging(log_level, log_format)
    worker = WorkerConfig(
        queues=[q.strip() for q in queues.split(",") if q.strip()] if queues else None,
        concurrency=concurrency,
        prefetch=parse_prefetch(prefetch),
        prefetch_budget=prefetch_budget,
        lease_duration=lease_duration,
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
        workers=low,
        max_workers=high,
        scale_target=scale_target,
        scale_cooldown=scale_cooldown,
        scale_cpu_ceiling=scale_cpu_ceiling,
        worker=worker,
        reaper=ReaperConfig(interval=reaper_interval, vacuum=vacuum),
        max_jobs_per_child=max_jobs_per_child,
        max_memory_mb=max_memory_per_child,
        preload=preload,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        metrics_interval=metrics_interval,
    ).validated()
    if shards_source:
        from ..supervise.shard_supervisor import ShardedSupervisor

        sys.exit(ShardedSupervisor(config, load_map(shards_source)).run())
    announce = logging.getLogger("miniqueue.embedded").warning
    config = dataclasses.replace(config, dsn=resolve_database(database_url, announce))
    sys.exit(Supervisor(config).run())
