"""The result table (stdout), the offending job ids under it, the JSON copy, and the Markdown
report: the run's parameters, one line per invariant with its count, the faults (per kind, and
when), and two charts (chaos.svg) with a table of the same numbers per second."""

from __future__ import annotations

import collections
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .faults import Fault
from .options import ALL_SCENARIOS, BATCH_SIZE, LIMIT_KEYS, MODES, Options
from .svg import Mark, Series, chart
from .timeline import COLUMNS, Timeline
from .verify import Verdict

WIDTH_LABEL = 66
WIDTH_VALUE = 44


def table(title: list[str], verdict: Verdict) -> str:
    lines = [*title, ""]
    lines.append(f"{'check':<{WIDTH_LABEL}} {'value':<{WIDTH_VALUE}} rule")
    lines.append(f"{'-' * WIDTH_LABEL} {'-' * WIDTH_VALUE} {'-' * 16}")
    for row in verdict.rows:
        mark = "" if row.ok is None else ("ok" if row.ok else "FAIL")
        rule = f"{row.rule} {mark}".strip()
        lines.append(f"{row.label:<{WIDTH_LABEL}} {row.value:<{WIDTH_VALUE}} {rule}".rstrip())
    lines.append("")
    for row in verdict.rows:
        if row.ok is None and row.offenders:
            lines.append(f"note: {row.label.strip()}:")
            lines += [f"    {entry}" for entry in row.offenders]
    failed = [row for row in verdict.rows if row.ok is False]
    if not failed:
        lines.append("RESULT: PASS (every rule held)")
        return "\n".join(lines)
    lines.append(f"RESULT: FAIL ({len(failed)} rule(s) broken)")
    for row in failed:
        lines.append(f"- {row.label.strip()}: {len(row.offenders)}")
        for offender in row.offenders[:50]:
            lines.append(f"    {offender}")
        if len(row.offenders) > 50:
            lines.append(f"    ... and {len(row.offenders) - 50} more (see the JSON)")
    return "\n".join(lines)


def write_json(path: Path, title: list[str], verdict: Verdict, extra: dict[str, Any]) -> None:
    document = {
        "title": title,
        "ok": verdict.ok,
        "rows": [asdict(row) for row in verdict.rows],
        **verdict.data,
        **extra,
    }
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")


# -- the Markdown report -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Invariant:
    """One line of the report's invariants: what it counts, from the verdict's data (lists whose
    entries are the offences), and the mode it needs (None: every run)."""

    name: str
    paths: tuple[str, ...]
    mode: str | None = None


#: The invariants, one line each: every one must count 0. A path is a key of the verdict's data,
#: or ``key.subkey``.
INVARIANTS = (
    Invariant("lost jobs", ("lost",)),
    Invariant("jobs completed more than once", ("completed_more_than_once", "durable_completed_twice")),
    Invariant("duplicate transactional effects", ("duplicated_effects", "durable_effect_problems")),
    Invariant("effects not written by the completing attempt", ("effect_mismatches",)),
    Invariant("attempts executed twice", ("executed_twice",)),
    Invariant("transitions the contracts forbid", ("odd_transitions", "repeated_fences")),
    Invariant("dead jobs (but one planned to die)", ("dead",)),
    Invariant("unexplained re-executions (attempts lost to no injected fault)", ("unexplained",)),
    Invariant("re-claimed leases forgotten by a live worker", ("forgotten_leases",)),
    Invariant("charged retries put off past their backoff", ("late_retries",)),
    Invariant("late completions of a frozen worker that stood", ("late_completions",)),
    Invariant("limit overruns", ("limit_exceeded",), "limits"),
    Invariant("recorded steps re-run", ("durable_replayed_steps", "durable_stale_steps"), "durable"),
    Invariant("durable sleeps or waits that spent an attempt", ("durable_spent_attempts",), "durable"),
    Invariant("durable jobs not completed", ("durable_not_completed",), "durable"),
    Invariant(
        "unique-key violations",
        (
            "unique.held_at_once",
            "unique.overlaps",
            "unique.wrong_duplicates",
            "unique.not_completed_once",
            "unique.failed_enqueues",
        ),
        "unique",
    ),
    Invariant(
        "sequence-order violations",
        (
            "sequences.early",
            "sequences.out_of_order",
            "sequences.overlaps",
            "sequences.misnumbered",
            "sequences.release_problems",
            "sequences.not_completed_once",
            "sequences.failed_enqueues",
            "blocked.problems",
        ),
        "sequences",
    ),
    Invariant(
        "workflow violations",
        (
            "workflow.lost",
            "workflow.not_completed_once",
            "workflow.release_problems",
            "workflow.claimed_before_parents",
            "workflow.wrong_parent_results",
        ),
        "workflow",
    ),
    Invariant("batch violations", ("batches.oversize", "batches.not_alone_next"), "batches"),
    Invariant("fair-key violations", ("fair_limit_exceeded",), "fair"),
    Invariant("process problems, zombies and orphans left", ("process_problems", "zombies_left", "orphans_left")),
)


def invariant_counts(options: Options, data: dict[str, Any]) -> list[tuple[str, int | None]]:
    """Each invariant's count (None: its mode was not run)."""
    counts: list[tuple[str, int | None]] = []
    for invariant in INVARIANTS:
        if invariant.mode is not None and not getattr(options, invariant.mode):
            counts.append((invariant.name, None))
            continue
        counts.append((invariant.name, sum(len(_at(data, path)) for path in invariant.paths)))
    return counts


def _at(data: dict[str, Any], path: str) -> list[Any]:
    """The list at ``path`` in the verdict's data ([] where the run recorded nothing)."""
    found: Any = data
    for part in path.split("."):
        found = found.get(part) if isinstance(found, dict) else None
    return list(found) if isinstance(found, list) else []


def write_report(
    path: Path,
    title: list[str],
    verdict: Verdict,
    options: Options,
    faults: list[Fault],
    timeline: Timeline,
    origin: float,
) -> list[Path]:
    """Write the Markdown report to ``path`` and its two charts beside it (``<stem>-throughput.svg``,
    ``<stem>-recovery.svg``); the files written. Times count from ``origin``, the chaos's start
    (this host's epoch seconds)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    throughput = path.with_name(f"{path.stem}-throughput.svg")
    recovery = path.with_name(f"{path.stem}-recovery.svg")
    seconds = _seconds(timeline, faults, origin)
    marks = [Mark(f.at - origin, f.kind, f.detail) for f in faults]
    per_second = [Series("completions per second", [(s.at, float(s.completions)) for s in seconds])]
    throughput.write_text(chart("Throughput", per_second, marks, "seconds since the chaos began", "completions / s"))
    states = [
        Series(name, [(s.at, None if s.counts is None else float(s.counts[i])) for s in seconds])
        for i, name in enumerate(("running", "available (due)", "scheduled", "waiting"))
        if name != "scheduled"
    ]
    recovery.write_text(chart("Recovery: jobs by state", states, marks, "seconds since the chaos began", "jobs"))
    lines = [
        f"# Chaos report: {'PASS' if verdict.ok else 'FAIL'}",
        "",
        *[f"    {line}" for line in title],
        "",
        "## Parameters",
        "",
        "| parameter | value |",
        "| --- | --- |",
        *[f"| {name} | {value} |" for name, value in _parameters(options)],
        "",
        "## Invariants",
        "",
        "Each must count 0; `not run` where its mode was off.",
        "",
        "| invariant | count |",
        "| --- | --- |",
        *[
            f"| {name} | {'not run' if count is None else count} |"
            for name, count in invariant_counts(options, verdict.data)
        ],
        "",
        "## Faults",
        "",
        f"{len(faults)} injected; times in seconds since the chaos began.",
        "",
        "| fault | count | at |",
        "| --- | --- | --- |",
        *_fault_lines(faults, origin),
        "",
        "## Throughput",
        "",
        f"![completions per second, faults marked]({throughput.name})",
        "",
        "## Recovery",
        "",
        f"![jobs running, available and waiting, faults marked]({recovery.name})",
        "",
        "<details><summary>Per second</summary>",
        "",
        f"| s | completions | {' | '.join(COLUMNS)} | faults |",
        "| ---: | ---: | " + " | ".join("---:" for _ in COLUMNS) + " | --- |",
        *[
            f"| {s.at:g} | {s.completions} | "
            + " | ".join("-" if s.counts is None else str(n) for n in (s.counts or (None,) * len(COLUMNS)))
            + f" | {', '.join(s.faults)} |"
            for s in seconds
        ],
        "",
        "</details>",
        "",
        "<details><summary>Every fault</summary>",
        "",
        "| at | fault | lasted | detail |",
        "| ---: | --- | ---: | --- |",
        *[
            f"| {f.at - origin:.2f} | {f.kind} | {f.until - f.at:.1f}s | {_cell(f.detail)} |"
            for f in sorted(faults, key=lambda f: f.at)
        ],
        "",
        "</details>",
        "",
        "## Every check",
        "",
        "```text",
        table(title, verdict),
        "```",
        "",
    ]
    path.write_text("\n".join(lines))
    return [path, throughput, recovery]


@dataclass(frozen=True)
class Second:
    """One second of the run: its start (since the chaos began), completions in it, the last
    sample's counts in it (None: no database answered), the faults injected in it."""

    at: float
    completions: int
    counts: tuple[int, ...] | None
    faults: tuple[str, ...]


def _seconds(timeline: Timeline, faults: list[Fault], origin: float) -> list[Second]:
    """The run second by second, from the first sample (or completion) to the last."""
    times = [s.at for s in timeline.samples] + timeline.completions
    if not times:
        return []
    first, last = math.floor(min(times) - origin), math.floor(max(times) - origin)
    done = collections.Counter(math.floor(t - origin) for t in timeline.completions)
    counts: dict[int, tuple[int, ...] | None] = {}
    for sample in timeline.samples:
        counts[math.floor(sample.at - origin)] = sample.counts if sample.answered else None
    hits: dict[int, list[str]] = collections.defaultdict(list)
    for fault in faults:
        hits[math.floor(fault.at - origin)].append(fault.kind)
    return [Second(float(s), done.get(s, 0), counts.get(s), tuple(hits.get(s, []))) for s in range(first, last + 1)]


def _parameters(options: Options) -> list[tuple[str, str]]:
    modes = [mode for mode in MODES if getattr(options, mode)]
    rows = [
        ("--everything", "yes" if options.everything else "no"),
        ("modes", ", ".join(modes) or "none"),
        ("databases", str(options.databases)),
        ("jobs", str(options.jobs)),
        ("workers x concurrency", f"{options.workers} x {options.concurrency}"),
        ("handlers", "async def" if options.async_handlers else "def"),
        ("chaos", f"{options.duration:g}s, a fault every {options.kill_interval[0]:g}-{options.kill_interval[1]:g}s"),
        ("seed", str(options.seed)),
        ("scenarios", ", ".join(options.scenarios)),
        (
            "lease, heartbeat, reaper",
            f"{options.lease_duration:g}s, {options.heartbeat:g}s, {options.reaper_interval:g}s",
        ),
        ("handler sleep", f"{options.sleep_ms[0]}-{options.sleep_ms[1]} ms"),
        ("transactional effects", f"{options.effect_share:.0%} of the jobs"),
    ]
    if options.limits:
        rows.append(("limits", f"{options.limit_share:.0%} of the jobs over {len(LIMIT_KEYS)} keys"))
    if options.workflow:
        rows.append(
            (
                "workflow",
                f"{options.groups} groups of {options.group_size} + callback, "
                f"{options.chains} chains of {options.chain_length}",
            )
        )
    if options.unique:
        rows.append(("unique keys", f"{options.unique_jobs} enqueues over {options.unique_keys} keys"))
    if options.sequences:
        rows.append(("sequences", f"{options.sequence_keys} keys x {options.sequence_length} jobs"))
    if options.durable:
        rows.append(("durable jobs", str(options.durable_jobs)))
    if options.batches:
        rows.append(("batch jobs", f"{options.batch_jobs} (batches of up to {BATCH_SIZE})"))
    rows.append(("fair keys", "not in miniqueue yet"))
    return rows


def _fault_lines(faults: list[Fault], origin: float) -> list[str]:
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for fault in sorted(faults, key=lambda f: f.at):
        by_kind[fault.kind].append(fault.at - origin)
    return [
        f"| {kind} | {len(by_kind[kind])} | {', '.join(f'{t:.1f}' for t in by_kind[kind])} |"
        for kind in ALL_SCENARIOS
        if by_kind.get(kind)
    ]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
