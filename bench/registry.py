"""What a benchmark is: a named table row and the function that measures it once."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from .measure import Sample

T = TypeVar("T")


@dataclass(frozen=True)
class Context:
    """What one run of a benchmark gets: a freshly migrated database of its own, the job count
    (``--jobs``) and the number of worker processes its row names.

    ``tiny`` (``--tiny``) asks for a run that only shows the row still runs: every count and
    duration the row fixes itself (a backlog, a seed of history, a number of timed jobs, a
    window) shrinks to a few, through :meth:`sized`; what the row runs does not change.
    """

    dsn: str
    jobs: int
    workers: int
    tiny: bool = False

    def sized(self, full: T, tiny: T) -> T:
        """``full`` when measuring, ``tiny`` in a tiny run."""
        return tiny if self.tiny else full


@dataclass(frozen=True)
class Benchmark:
    """One row of the table.

    ``run`` measures the row once in the database it is given and returns a :class:`Sample`;
    the harness calls it ``--runs`` times, each time in a new database, and reports medians.
    ``throughput=False`` marks a row that measures latency only (its jobs/s is not shown).
    ``baselines`` names the rows its target is a ratio to, measured in the same invocation:
    choosing the row chooses them too (see :func:`select`).
    """

    name: str
    operation: str
    workers: int
    run: Callable[[Context], Sample]
    throughput: bool = True
    baselines: tuple[str, ...] = ()


def select(benchmarks: Sequence[Benchmark], patterns: Sequence[str]) -> list[Benchmark]:
    """The benchmarks whose name matches any of ``patterns`` (exact names or globs), and the
    baselines those name (``Benchmark.baselines``), in suite order.

    No patterns selects everything. A pattern that matches nothing raises ValueError naming it.
    """
    if not patterns:
        return list(benchmarks)
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(b.name, p) for b in benchmarks)]
    if unmatched:
        names = ", ".join(b.name for b in benchmarks)
        raise ValueError(f"no benchmark matches {', '.join(map(repr, unmatched))}: choose among {names}")
    chosen = {b.name for b in benchmarks if any(fnmatch.fnmatchcase(b.name, p) for p in patterns)}
    chosen |= {base for b in benchmarks if b.name in chosen for base in b.baselines}
    return [b for b in benchmarks if b.name in chosen]
