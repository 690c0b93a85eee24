"""Helpers the parts of the store share to shape what they send and what they read."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import psycopg
from psycopg import postgres
from psycopg.types.array import ListBinaryDumper
from psycopg.types.numeric import Int4, Int8

from ..core.steps import Query, Steps

# A monitoring query must answer quickly or not at all: it never holds up what called it.
MONITORING_TIMEOUT = "SET LOCAL statement_timeout = '5s'"


class _Bigints(list[int]):
    """A list of ints psycopg sends as ``bigint[]`` (see :func:`bigints`)."""


class _Ints(list[int]):
    """A list of ints psycopg sends as ``int[]``."""


class _BigintsDumper(ListBinaryDumper):
    oid = postgres.types["int8"].array_oid
    element_oid = postgres.types["int8"].oid


class _IntsDumper(ListBinaryDumper):
    oid = postgres.types["int4"].array_oid
    element_oid = postgres.types["int4"].oid


# For every connection made from now on (a connection made before keeps psycopg's list dumper,
# which types the list by its largest value: the same values, the statements cast them).
psycopg.adapters.register_dumper(_Bigints, _BigintsDumper)
psycopg.adapters.register_dumper(_Ints, _IntsDumper)


def bigints(values: Iterable[int]) -> list[int]:
    """``values`` as a list psycopg sends as ``bigint[]``, whatever their size.

    psycopg types a list of ints by its largest (``int2[]``, ``int4[]``, ``int8[]``), and a
    statement that casts the parameter (``%(ids)b::bigint[]``) and reads it per row (``= ANY``
    as a filter, ``width_bucket``, a subscript) converts the whole array again on every row: a
    completion of 1,000 jobs whose ids were in the ``int4`` range spent 13 of its 20 ms so.
    Sent as the type the statement names, the cast costs nothing. (A list whose dumper names
    its type: wrapping each value in psycopg's ``Int8`` cost a worker 0.6 us per job and array.)"""
    listed = _Bigints(values)
    return listed if _fits(listed, 63) else [Int8(value) for value in listed]


def ints(values: Iterable[int]) -> list[int]:
    """``values`` as a list psycopg sends as ``int[]`` (see :func:`bigints`)."""
    listed = _Ints(values)
    return listed if _fits(listed, 31) else [Int4(value) for value in listed]


def _fits(values: list[int], bits: int) -> bool:
    """Whether every value fits a signed integer of ``bits`` and a sign. One that does not goes
    wrapped, as psycopg's type of that name, which sends it as text: the server then refuses it
    with an error naming the value (InvalidInput), where the list's dumper would fail in psycopg."""
    return not values or (-(2**bits) <= min(values) and max(values) < 2**bits)


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
