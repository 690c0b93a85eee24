"""The table, the plan checks and the JSON file."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .measure import Sample, median
from .plans import PlanCheck
from .registry import Benchmark
from .server import Machine

RESULTS_DIR = Path(__file__).resolve().parent / "results"
COLUMNS = ("name", "operation", "workers", "jobs", "jobs/s", "min-max jobs/s", "p50 ms", "p99 ms", "RSS MB", "load")
NUMERIC = frozenset(COLUMNS[2:])


@dataclass(frozen=True)
class RowResult:
    """Every sample of one benchmark, and the medians the table shows."""

    benchmark: Benchmark
    samples: list[Sample]

    @property
    def jobs_per_s(self) -> float:
        """Median throughput over the runs."""
        return median([s.jobs_per_s for s in self.samples]) or 0.0

    def median_of(self, field: str) -> float | None:
        """The median of one Sample field over the runs (``p50_ms``, ``p99_ms``, ``rss_mb``, ...)."""
        return median([getattr(s, field) for s in self.samples])

    def cells(self) -> tuple[str, ...]:
        """This row's table cells, in COLUMNS order."""
        rates = [s.jobs_per_s for s in self.samples]
        throughput = self.benchmark.throughput
        return (
            self.benchmark.name,
            self.benchmark.operation,
            str(self.benchmark.workers),
            f"{self.samples[0].jobs:,}",
            f"{self.jobs_per_s:,.0f}" if throughput else "-",
            f"{min(rates):,.0f}-{max(rates):,.0f}" if throughput else "-",
            _ms(self.median_of("p50_ms")),
            _ms(self.median_of("p99_ms")),
            _mb(self.median_of("rss_mb")),
            _load(self.median_of("load_1m")),
        )


def render_table(rows: Sequence[RowResult]) -> str:
    """A Markdown table (it reads in a terminal and pastes into docs/figures.md)."""
    return markdown_table(COLUMNS, [row.cells() for row in rows], NUMERIC)


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]], numeric: Collection[str]) -> str:
    """A Markdown table with aligned columns; ``numeric`` columns are right-aligned."""
    cells = [columns, *rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]

    def line(values: Sequence[str]) -> str:
        padded = (v.rjust(w) if c in numeric else v.ljust(w) for v, w, c in zip(values, widths, columns, strict=True))
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join(("-" * (w + 1)) + (":" if c in numeric else "-") for w, c in zip(widths, columns, strict=True))
        + "|"
    )
    return "\n".join([line(columns), rule, *(line(c) for c in rows)])


def render_checks(checks: Sequence[PlanCheck], queued: int) -> str:
    """The plan checks: each statement's top plan line and a verdict."""
    lines = [f"Plan checks, EXPLAIN (ANALYZE, BUFFERS) at {queued:,} queued jobs:"]
    for check in checks:
        took = f"{check.execution_ms:.2f} ms" if check.execution_ms is not None else "time unknown"
        lines.append(f"  [{'ok' if check.ok else 'CHECK'}] {check.label}: {check.verdict}; executed in {took}")
        lines.append(f"       {check.top_line.strip()}")
    return "\n".join(lines)


def write_json(
    machine: Machine,
    options: dict[str, Any],
    rows: Sequence[RowResult],
    checks: Sequence[PlanCheck],
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write every sample and plan (and ``extra`` sections) to ``bench/results/<UTC timestamp>.json``."""
    now = dt.datetime.now(dt.timezone.utc)
    document = {
        "measured_at": now.isoformat(timespec="seconds"),
        "machine": dataclasses.asdict(machine),
        "options": options,
        "rows": [_row_json(row) for row in rows],
        "plan_checks": [dataclasses.asdict(check) for check in checks],
        **(extra or {}),
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{now:%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return path


def _row_json(row: RowResult) -> dict[str, Any]:
    return {
        "name": row.benchmark.name,
        "operation": row.benchmark.operation,
        "workers": row.benchmark.workers,
        "median": {
            "jobs_per_s": row.jobs_per_s if row.benchmark.throughput else None,
            "p50_ms": row.median_of("p50_ms"),
            "p99_ms": row.median_of("p99_ms"),
            "rss_mb": row.median_of("rss_mb"),
            "load_1m": row.median_of("load_1m"),
            "worker_cores": row.median_of("worker_cores"),
        },
        "samples": [{**dataclasses.asdict(s), "jobs_per_s": s.jobs_per_s} for s in row.samples],
    }


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 10 else f"{value:,.1f}"


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _load(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
