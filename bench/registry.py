"""What a benchmark is: a named table row and the function that measures it once."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .measure import Sample


@dataclass(frozen=True)
class Context:
    """What one run of a benchmark gets: a freshly migrated database of its own, the job count
    (``--jobs``) and the number of worker processes its row names."""

    dsn: str
    jobs: int
    workers: int


@dataclass(frozen=True)
class Benchmark:
    """One row of the table.

    ``run`` measures the row once in the database it is given and returns a :class:`Sample`;
    the harness calls it ``--runs`` times, each time in a new database, and reports medians.
    ``throughput=False`` marks a row that measures latency only (its jobs/s is not shown).
    """

    name: str
    operation: str
    workers: int
    run: Callable[[Context], Sample]
    throughput: bool = True


def select(benchmarks: Sequence[Benchmark], patterns: Sequence[str]) -> list[Benchmark]:
    """The benchmarks whose name matches any of ``patterns`` (exact names or globs), in suite order.

    No patterns selects everything. A pattern that matches nothing raises ValueError naming it.
    """
    if not patterns:
        return list(benchmarks)
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(b.name, p) for b in benchmarks)]
    if unmatched:
        names = ", ".join(b.name for b in benchmarks)
        raise ValueError(f"no benchmark matches {', '.join(map(repr, unmatched))}: choose among {names}")
    return [b for b in benchmarks if any(fnmatch.fnmatchcase(b.name, p) for p in patterns)]
