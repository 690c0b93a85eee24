"""Helpers the parts of the store share to shape what they send and what they read."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from psycopg.types.numeric import Int4, Int8

from ..core.steps import Query, Steps

# A monitoring query must answer quickly or not at all: it never holds up what called it.
MONITORING_TIMEOUT = "SET LOCAL statement_timeout = '5s'"


def bigints(values: Iterable[int]) -> list[int]:
    """``values`` as a list psycopg sends as ``bigint[]``, whatever their size.

    psycopg types a list of ints by its largest (``int2[]``, ``int4[]``, ``int8[]``), and a
    statement that casts the parameter (``%(ids)b::bigint[]``) and reads it per row (``= ANY``
    as a filter, ``width_bucket``, a subscript) converts the whole array again on every row: a
    completion of 1,000 jobs whose ids were in the ``int4`` range spent 13 of its 20 ms so.
    Sent as the type the statement names, the cast costs nothing."""
    return [Int8(value) for value in values]


def ints(values: Iterable[int]) -> list[int]:
    """``values`` as a list psycopg sends as ``int[]`` (see :func:`bigints`)."""
    return [Int4(value) for value in values]


def columns(leases: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """``(job id, attempt)`` pairs as two aligned columns, in ascending id order: the statements
    find an id's attempt by binary search over ``ids`` (width_bucket), which needs them sorted.
    Typed as the statements name them (:func:`bigints`)."""
    pairs = sorted(dict(leases).items())
    return bigints(p[0] for p in pairs), ints(p[1] for p in pairs)


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
