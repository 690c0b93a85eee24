"""Helpers the parts of the store share to shape what they send and what they read."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..core.steps import Query, Steps

# A monitoring query must answer quickly or not at all: it never holds up what called it.
MONITORING_TIMEOUT = "SET LOCAL statement_timeout = '5s'"


def columns(leases: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """``(job id, attempt)`` pairs as two aligned columns, in ascending id order: the statements
    find an id's attempt by binary search over ``ids`` (width_bucket), which needs them sorted."""
    pairs = sorted(dict(leases).items())
    return [p[0] for p in pairs], [p[1] for p in pairs]


def aligned(ids: list[int], results: Mapping[int, str] | None) -> list[str | None]:
    """``results`` as a list aligned with ``ids``; empty when no job has one (the common case)."""
    if not results:
        return []
    return [results.get(job_id) for job_id in ids]


def monitoring(query: Query) -> Steps[Any]:
    """A monitoring query, which must answer quickly or not at all (run it atomically: the
    timeout is the transaction's)."""
    yield Query(MONITORING_TIMEOUT)
    result = yield query
    return result
