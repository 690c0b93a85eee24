"""``python -m bench``: run the suite, print the table, write the JSON."""

from __future__ import annotations

import dataclasses

import click

from . import cpu
from .measure import Sample
from .plans import QUEUED_JOBS, TINY_QUEUED_JOBS, check_plans
from .registry import Benchmark, select
from .report import render_checks, render_table, write_json
from .server import describe_machine, server_dsn
from .suite import BENCHMARKS, TINY_JOBS, Progress, run_suite
from .targets import cpu_ratios, evaluate, render_cpu_table, render_verdicts

LEGEND = (
    "Latency is per call (one enqueue, one enqueue_many, one claim + complete), and for latency-* rows "
    "from a job's created_at to its handler's start. drain-* and cpu-* rows are timed from the enqueue's "
    "commit to the last completion. RSS is the peak of the largest bench worker process, and for drain-*, "
    "latency-* and cpu-* rows the largest miniqueue worker's RSS at the end of the run. Load is the 1-minute "
    "load average as each run ended."
)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--database-url",
    metavar="URL",
    help="A server to benchmark (each run creates and drops its own database, so the user needs "
    "CREATEDB). Default: an embedded PostgreSQL in a temporary directory.",
)
@click.option(
    "--runs", type=click.IntRange(min=1), default=3, show_default=True, help="Runs per row; the table shows medians."
)
@click.option(
    "--only", metavar="NAME[,NAME]", help="Run only these rows (names or globs such as 'claim-*'); see --list."
)
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    help="Jobs per run for the enqueue and per-job claim rows; batch-claim rows use five times as many. "
    f"[default: 10,000; {TINY_JOBS} with --tiny]",
)
@click.option(
    "--plan-check/--no-plan-check",
    default=True,
    show_default=True,
    help=f"EXPLAIN the claim, complete_many and enqueue_many at {QUEUED_JOBS:,} queued jobs.",
)
@click.option(
    "--tiny",
    is_flag=True,
    help="Run every chosen row once at a tiny size, only to see that it runs: the figures mean nothing.",
)
@click.option("--list", "list_only", is_flag=True, help="List the rows and exit.")
def main(
    database_url: str | None,
    runs: int,
    only: str | None,
    jobs: int | None,
    plan_check: bool,
    tiny: bool,
    list_only: bool,
) -> None:
    """Benchmark miniqueue against a real PostgreSQL and print one table of medians."""
    chosen = _choose(only)
    jobs = jobs or (TINY_JOBS if tiny else 10_000)
    runs = 1 if tiny else runs
    if list_only:
        for b in chosen:
            click.echo(f"{b.name:30} {b.operation} ({b.workers} worker{'s' if b.workers > 1 else ''})")
        return
    with server_dsn(database_url) as (dsn, server):
        machine = describe_machine(dsn, server)
        click.echo(f"miniqueue bench: {machine.header()}", err=True)
        rows = run_suite(dsn, chosen, runs=runs, jobs=jobs, progress=_progress(runs), tiny=tiny)
        checks = check_plans(dsn, tiny=tiny) if plan_check else []
    # A tiny run's figures mean nothing: no target is set against them.
    ratios, verdicts, calibration = cpu_ratios(rows), [] if tiny else evaluate(rows), cpu.calibrated()
    extra = {
        "cpu_calibration": dataclasses.asdict(calibration) if calibration else None,
        "cpu_ratios": {r.row.benchmark.name: r.ratio for r in ratios},
        "targets": [dataclasses.asdict(v) for v in verdicts],
    }
    path = write_json(machine, {"runs": runs, "jobs": jobs, "only": only, "tiny": tiny}, rows, checks, extra)
    click.echo(f"\nminiqueue bench: {machine.header()}")
    if tiny:
        click.echo("TINY RUN: every row once at a tiny size, to see that it runs. The figures mean nothing.")
    click.echo(f"Medians of {runs} run{'s' if runs > 1 else ''}. {LEGEND}\n")
    click.echo(render_table(rows))
    if ratios:
        click.echo("\n" + render_cpu_table(ratios, calibration))
    if verdicts:
        click.echo("\n" + render_verdicts(verdicts))
    if checks:
        click.echo("\n" + render_checks(checks, TINY_QUEUED_JOBS if tiny else QUEUED_JOBS))
    click.echo(f"\nJSON: {path}")


def _choose(only: str | None) -> list[Benchmark]:
    patterns = [p.strip() for p in (only or "").split(",") if p.strip()]
    try:
        return select(BENCHMARKS, patterns)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--only") from None


def _progress(runs: int) -> Progress:
    def show(run: int, benchmark: Benchmark, sample: Sample) -> None:
        if benchmark.throughput:
            figure = f"{sample.jobs_per_s:>10,.0f} jobs/s"
        else:
            figure = f"p50 {sample.p50_ms or 0:,.2f} ms, p99 {sample.p99_ms or 0:,.2f} ms"
        click.echo(f"  run {run}/{runs}  {benchmark.name:30} {figure}", err=True)

    return show
