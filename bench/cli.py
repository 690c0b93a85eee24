"""``python -m bench``: run the suite, print the table, write the JSON."""

from __future__ import annotations

import dataclasses

import click

from . import cpu
from .measure import Sample
from .plans import QUEUED_JOBS, check_plans
from .registry import Benchmark, select
from .report import render_checks, render_table, write_json
from .server import describe_machine, server_dsn
from .suite import BENCHMARKS, Progress, run_suite
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
    default=10_000,
    show_default=True,
    help="Jobs per run for the enqueue and per-job claim rows; batch-claim rows use five times as many.",
)
@click.option(
    "--plan-check/--no-plan-check",
    default=True,
    show_default=True,
    help=f"EXPLAIN the claim, complete_many and enqueue_many at {QUEUED_JOBS:,} queued jobs.",
)
@click.option("--list", "list_only", is_flag=True, help="List the rows and exit.")
def main(database_url: str | None, runs: int, only: str | None, jobs: int, plan_check: bool, list_only: bool) -> None:
    """Benchmark miniqueue against a real PostgreSQL and print one table of medians."""
    chosen = _choose(only)
    if list_only:
        for b in chosen:
            click.echo(f"{b.name:30} {b.operation} ({b.workers} worker{'s' if b.workers > 1 else ''})")
        return
    with server_dsn(database_url) as (dsn, server):
        machine = describe_machine(dsn, server)
        click.echo(f"miniqueue bench: {machine.header()}", err=True)
        rows = run_suite(dsn, chosen, runs=runs, jobs=jobs, progress=_progress(runs))
        checks = check_plans(dsn) if plan_check else []
    ratios, verdicts, calibration = cpu_ratios(rows), evaluate(rows), cpu.calibrated()
    extra = {
        "cpu_calibration": dataclasses.asdict(calibration) if calibration else None,
        "cpu_ratios": {r.row.benchmark.name: r.ratio for r in ratios},
        "targets": [dataclasses.asdict(v) for v in verdicts],
    }
    path = write_json(machine, {"runs": runs, "jobs": jobs, "only": only}, rows, checks, extra)
    click.echo(f"\nminiqueue bench: {machine.header()}")
    click.echo(f"Medians of {runs} run{'s' if runs > 1 else ''}. {LEGEND}\n")
    click.echo(render_table(rows))
    if ratios:
        click.echo("\n" + render_cpu_table(ratios, calibration))
    if verdicts:
        click.echo("\n" + render_verdicts(verdicts))
    if checks:
        click.echo("\n" + render_checks(checks, QUEUED_JOBS))
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
