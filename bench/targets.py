"""The targets (bench/README.md, "Targets"), set against the medians of the rows that ran, and
the CPU table's ratios.

Targets are what the table is read against, never assertions: the harness prints each with
the measured median and how far from the target it is, and exits 0 either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .aging import STREAM_PRIORITY
from .autoscale import BASELINE as AUTOSCALE_BASELINE
from .autoscale import TARGETS as AUTOSCALE
from .batch import TARGETS as BATCH_TARGETS
from .claim import FLOOR_DRAIN
from .cpu import BASELINE, Calibration
from .durable import TARGETS as DURABLE_TARGETS
from .fair_share import FAIR_SHARE_FACTOR, WEIGHT_TOLERANCE, WEIGHTS
from .fair_share import TARGETS as FAIR_TARGETS
from .fairness import ROWS as FAIRNESS_ROWS
from .history import TARGETS as HISTORY_TARGETS
from .keys import TARGETS as KEYED_TARGETS
from .limits import TARGETS as LIMIT_TARGETS
from .report import RowResult, markdown_table
from .shards import ROUTING_TARGETS, routed_share
from .shards import TARGETS as SHARD_TARGETS

#: Rows whose RSS is a miniqueue worker process's (the others measure the bench's own workers).
SUPERVISED_PREFIXES = ("drain-", "latency-", "cpu-", "fairness", "batch-")


@dataclass(frozen=True)
class Verdict:
    """One target: what was asked, what was measured (and where), met or not, and by how much."""

    target: str
    measured: str
    met: bool
    margin: str


@dataclass(frozen=True)
class Ratio:
    """One CPU-bound row against ``--workers 1``."""

    row: RowResult
    ratio: float | None


def evaluate(rows: Sequence[RowResult]) -> list[Verdict]:
    """Every target whose rows ran."""
    by_name = {row.benchmark.name: row for row in rows}
    verdicts: list[Verdict] = []

    def best(prefix: str) -> RowResult | None:
        # The keyed rows have targets of their own, against their baselines: never the best plain row.
        found = [
            r
            for r in rows
            if r.benchmark.name.startswith(prefix)
            and r.benchmark.name not in KEYED_TARGETS
            and r.benchmark.name not in HISTORY_TARGETS
            and r.benchmark.name not in DURABLE_TARGETS
            and r.benchmark.name not in SHARD_TARGETS
            and r.benchmark.name not in ROUTING_TARGETS
        ]
        return max(found, key=lambda row: row.jobs_per_s) if found else None

    if drain := best("drain-"):
        verdicts.append(
            _at_least(
                "end-to-end drain, no-op jobs, best worker count", drain.jobs_per_s, 30_000, _rate, drain.benchmark.name
            )
        )
    default, tuned = by_name.get("drain-2-default"), by_name.get("drain-2")
    if default and tuned and tuned.jobs_per_s:
        verdicts.append(
            _at_least(
                "default drain, 2 workers / --prefetch 1000 drain (same run)",
                default.jobs_per_s / tuned.jobs_per_s,
                0.9,
                lambda v: f"{v:.2f}x",
                "drain-2-default / drain-2",
            )
        )
    for name in FAIRNESS_ROWS:  # the same target for an app of def handlers and for a mixed one
        if (fair := by_name.get(name)) is None:
            continue
        last, first_long = fair.median_of("seconds"), fair.median_of("long_first_ms")
        if last is not None:
            verdicts.append(_at_most(f"{name}: the last short job completes", last * 1000, 1000.0, _ms, name))
        if last is not None and first_long is not None:
            verdicts.append(
                _at_least(
                    f"{name}: first long job's completion / last short job's",
                    first_long / (last * 1000),
                    1.0,
                    lambda v: f"{v:.2f}x",
                    name,
                )
            )
    verdicts += _autoscaling(by_name)
    verdicts += _aging(by_name)
    verdicts += _fair_share(by_name)
    if (reads := by_name.get("scale-reads")) is not None:
        for label, field, limit in (
            ("miniqueue stats, end to end", "p50_ms", 300.0),
            ("a /metrics scrape", "scrape_ms", 50.0),
            ("the dashboard overview", "overview_ms", 300.0),
        ):
            value = reads.median_of(field)
            if value is not None:
                verdicts.append(_at_most(f"{label} at 10M finished rows", value, limit, _ms, "scale-reads"))
    base = by_name.get("drain-2-default")
    for name, share in (("drain-backlog-2", 0.9), ("drain-pruning-2", 0.8)):
        row = by_name.get(name)
        if row and base and base.jobs_per_s:
            verdicts.append(
                _at_least(
                    f"{name} / drain-2-default (same run)",
                    row.jobs_per_s / base.jobs_per_s,
                    share,
                    lambda v: f"{v:.2f}x",
                    f"{name} / drain-2-default",
                )
            )
    for workers in (2, 4):
        limited, unlimited = by_name.get(f"limits-keys-{workers}"), by_name.get(f"drain-{workers}-default")
        if limited and unlimited and unlimited.jobs_per_s:
            verdicts.append(
                _at_least(
                    f"limits-keys-{workers} / drain-{workers}-default (same run)",
                    limited.jobs_per_s / unlimited.jobs_per_s,
                    0.7,
                    lambda v: f"{v:.2f}x",
                    f"limits-keys-{workers} / drain-{workers}-default",
                )
            )
    same_run = {
        **KEYED_TARGETS,
        **HISTORY_TARGETS,
        **DURABLE_TARGETS,
        **SHARD_TARGETS,
        **BATCH_TARGETS,
        **LIMIT_TARGETS,
        **FAIR_TARGETS,
    }
    for name, (baseline, share) in same_run.items():
        keyed, plain = by_name.get(name), by_name.get(baseline)
        if keyed and plain and plain.jobs_per_s:
            verdicts.append(
                _at_least(
                    f"{name} / {baseline} (same run)",
                    keyed.jobs_per_s / plain.jobs_per_s,
                    share,
                    lambda v: f"{v:.2f}x",
                    f"{name} / {baseline}",
                )
            )
    for name, share in ROUTING_TARGETS.items():
        if (row := by_name.get(name)) and (value := routed_share(row)) is not None:
            verdicts.append(
                _at_least(f"{name}: routed / plain enqueue_many (same run)", value, share, lambda v: f"{v:.2f}x", name)
            )
    if (debounced := by_name.get("debounce")) and (runs := debounced.median_of("jobs")) is not None:
        # 100 enqueues over 5 s, a wait of 1 s and a max_wait of 3 s: the first run is due 3 s
        # after the first enqueue (max_wait), the second after the burst.
        verdicts.append(_at_most("debounce: runs in the burst", runs, 2, lambda v: f"{v:.0f}", "debounce"))
        if (run_at := debounced.median_of("p50_ms")) is not None:
            verdicts.append(_at_most("debounce: first run-at after the first enqueue", run_at, 3200, _ms, "debounce"))
    if many := best("enqueue-many-"):
        verdicts.append(_at_least("enqueue_many", many.jobs_per_s, 60_000, _rate, many.benchmark.name))
    one, floor = by_name.get("enqueue"), by_name.get("floor-enqueue")
    if one and floor and floor.jobs_per_s:
        verdicts.append(
            _at_least(
                "one-by-one enqueue / SQL floor (within 20%)",
                one.jobs_per_s / floor.jobs_per_s,
                0.8,
                lambda v: f"{v:.2f}x",
                "enqueue / floor-enqueue",
            )
        )
    drain_floor = by_name.get(FLOOR_DRAIN)
    if default and drain_floor and drain_floor.jobs_per_s:
        verdicts.append(
            _at_least(
                "default drain / SQL floor (within 20%)",
                default.jobs_per_s / drain_floor.jobs_per_s,
                0.8,
                lambda v: f"{v:.2f}x",
                f"drain-2-default / {FLOOR_DRAIN}",
            )
        )
    if (notify := by_name.get("latency-notify")) is not None:
        for label, field, limit in (("p50", "p50_ms", 5.0), ("p99", "p99_ms", 50.0)):
            value = notify.median_of(field)
            if value is not None:
                verdicts.append(_at_most(f"NOTIFY wake latency {label}", value, limit, _ms, "latency-notify"))
    supervised = [row for row in rows if row.benchmark.name.startswith(SUPERVISED_PREFIXES)]
    sized = [(rss, row) for row in supervised if (rss := row.median_of("rss_mb")) is not None]
    if sized:
        rss, row = max(sized, key=lambda pair: pair[0])
        verdicts.append(_at_most("worker RSS (largest worker, supervised rows)", rss, 60.0, _mb, row.benchmark.name))
    ratios = {r.row.benchmark.name: r.ratio for r in cpu_ratios(rows)}
    if (two := ratios.get("cpu-2")) is not None:
        verdicts.append(_at_least("CPU-bound: 2 processes vs 1", two, 1.8, lambda v: f"{v:.2f}x", "cpu-2 / cpu-1"))
    return verdicts


def cpu_ratios(rows: Sequence[RowResult]) -> list[Ratio]:
    """The CPU-bound rows, each with its throughput relative to the ``--workers 1`` row."""
    cpu = [row for row in rows if row.benchmark.name.startswith("cpu-")]
    base = next((row.jobs_per_s for row in cpu if row.benchmark.name == BASELINE), None)
    return [Ratio(row, row.jobs_per_s / base if base else None) for row in cpu]


def render_cpu_table(ratios: Sequence[Ratio], calibration: Calibration | None) -> str:
    """The CPU-bound rows as a table of their own, with the ratio to ``--workers 1``."""
    work = (
        f"a loop of {calibration.loop:,} iterations, {calibration.ms_per_job:.1f} ms of CPU in the bench process"
        if calibration
        else "calibrated loop"
    )
    columns = ("name", "workers", "operation", "jobs/s", "min-max jobs/s", f"vs {BASELINE}", "worker cores", "load")
    cells = []
    for r in ratios:
        rates = [s.jobs_per_s for s in r.row.samples]
        cores, load = r.row.median_of("worker_cores"), r.row.median_of("load_1m")
        cells.append(
            (
                r.row.benchmark.name,
                str(r.row.benchmark.workers),
                r.row.benchmark.operation,
                f"{r.row.jobs_per_s:,.1f}",
                f"{min(rates):,.1f}-{max(rates):,.1f}",
                "-" if r.ratio is None else f"{r.ratio:.2f}x",
                "-" if cores is None else f"{cores:.2f}",
                "-" if load is None else f"{load:.1f}",
            )
        )
    table = markdown_table(columns, cells, frozenset(columns[3:]) | {"workers"})
    return (
        f"CPU-bound jobs ({work} per job), processes vs threads. 'worker cores' is the CPU time the "
        f"worker processes used per second of the run: how many cores they actually got.\n\n{table}"
    )


def _autoscaling(by_name: dict[str, RowResult]) -> list[Verdict]:
    """The autoscaling rows' targets (see :mod:`bench.autoscale`)."""
    burst, fixed = by_name.get("autoscale-burst"), by_name.get(AUTOSCALE_BASELINE)
    if burst is None:
        return []
    found = []
    if fixed is not None and fixed.jobs_per_s:
        share = burst.jobs_per_s / fixed.jobs_per_s
        found.append(
            _at_least(
                f"autoscale-burst / {AUTOSCALE_BASELINE} (same run)",
                share,
                AUTOSCALE["share"],
                lambda v: f"{v:.2f}x",
                f"autoscale-burst / {AUTOSCALE_BASELINE}",
            )
        )
    for label, field in (
        ("a second worker, from the commit", "scale_up_ms"),
        ("back at one, from the drain's end", "scale_down_ms"),
    ):
        value = burst.median_of(field)
        limit = AUTOSCALE[field]
        found.append(
            _at_most(
                f"autoscale-burst: {label}", float("inf") if value is None else value, limit, _ms, "autoscale-burst"
            )
        )
    if (peak := burst.median_of("peak_workers")) is not None:
        found.append(
            _at_most(
                "autoscale-burst: the most workers (2 cores)",
                peak,
                AUTOSCALE["peak_workers"],
                lambda v: f"{v:.0f}",
                "autoscale-burst",
            )
        )
    return found


def _fair_share(by_name: dict[str, RowResult]) -> list[Verdict]:
    """The fair-share rows' targets besides their rates (see :mod:`bench.fair_share`)."""
    found = []
    if (fair := by_name.get("fair-2")) is not None:
        last, share = fair.median_of("fair_last_ms"), fair.median_of("fair_share_ms")
        if last is not None and share:
            found.append(
                _at_most(
                    "fair-2: the small tenants' last job / their fair share's time",
                    last / share,
                    FAIR_SHARE_FACTOR,
                    lambda v: f"{v:.2f}x",
                    "fair-2",
                )
            )
    if (weights := by_name.get("fair-weights-2")) is not None and (ratio := weights.median_of("weight_ratio")):
        off = abs(ratio - WEIGHTS) / WEIGHTS
        found.append(
            _at_most(
                f"fair-weights-2: completions {WEIGHTS:g}:1, off by",
                off * 100,
                WEIGHT_TOLERANCE * 100,
                lambda v: f"{v:.1f}%",
                "fair-weights-2",
            )
        )
    return found


def render_verdicts(verdicts: Sequence[Verdict]) -> str:
    """One line per target: met or MISSED, the measured median and the margin."""
    lines = ["Targets, against the medians above:"]
    for v in verdicts:
        lines.append(f"  [{'ok' if v.met else 'MISSED'}] {v.target}: {v.measured}; {v.margin}")
    return "\n".join(lines)


def _aging(by_name: dict[str, RowResult]) -> list[Verdict]:
    """aging-2: the priority-0 job behind the stream starts within its bound (see :mod:`bench.aging`)."""
    row = by_name.get("aging-2")
    waited, bound = (row.median_of("p50_ms"), row.median_of("p99_ms")) if row else (None, None)
    if waited is None or not bound:
        return []
    label = f"aging-2: a priority-0 job's wait behind priority {STREAM_PRIORITY} / its bound"
    return [_at_most(label, waited / bound, 1.0, lambda v: f"{v:.2f}x", "aging-2")]


def _at_least(target: str, value: float, goal: float, show: Callable[[float], str], where: str) -> Verdict:
    margin = f"{value / goal:.1%} of the target" + ("" if value >= goal else f", {show(goal - value)} short")
    return Verdict(f"{target} >= {show(goal)}", f"{show(value)} ({where})", value >= goal, margin)


def _at_most(target: str, value: float, limit: float, show: Callable[[float], str], where: str) -> Verdict:
    margin = f"{value / limit:.1%} of the limit" + ("" if value <= limit else f", {show(value - limit)} over")
    return Verdict(f"{target} <= {show(limit)}", f"{show(value)} ({where})", value <= limit, margin)


def _rate(value: float) -> str:
    return f"{value:,.0f} jobs/s"


def _ms(value: float) -> str:
    return f"{value:,.2f} ms"


def _mb(value: float) -> str:
    return f"{value:.0f} MB"
