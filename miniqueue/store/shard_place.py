"""A database's place in a shard map: joining one (its id sequence set so that its ids carry its
index), and reading which database a connection is on (see :mod:`miniqueue.core.shard_map`)."""

from __future__ import annotations

from typing import Any

from psycopg import sql

from ..core.errors import ConfigError
from ..core.shard_map import ID_BASE, MODULUS
from ..core.steps import Query, Steps, atomic
from .base import Statement, StoreBase

# Which database of a map this is (no row: it joined none).
_SHARD = "SELECT name, idx FROM {shard}"

# Whether the database holds ids drawn before it joined a map (only a map's origin may).
_OLD_IDS = "SELECT EXISTS (SELECT 1 FROM {jobs} WHERE id < %(base)s)"

# Where the id sequence is: the next id it would draw (by one: it has not joined a map yet).
_NEXT_ID = "SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM {id_sequence}"

# The id sequence from `start` on, by MODULUS: every id it draws has the database's index as its
# residue. (A statement with literals, composed in sequence_steps: ALTER SEQUENCE takes no
# parameters.) START too, so that a restart (the testing kit's clean-up) stays on the residue.
_SET_SEQUENCE = "ALTER SEQUENCE {sequence} INCREMENT BY {step} MINVALUE 1 START WITH {start} RESTART WITH {start}"

_JOIN = "INSERT INTO {shard} (name, idx) VALUES (%(name)s, %(index)s)"


def first_id(next_id: int, index: int) -> int:
    """The first id from ``max(next_id, ID_BASE)`` on whose residue modulo MODULUS is ``index``."""
    start = max(next_id, ID_BASE)
    return start + (index - start) % MODULUS


class Shards(StoreBase):
    """Joining a shard map, and which database of a map a connection is on."""

    _shard = Statement(_SHARD)
    _old_ids = Statement(_OLD_IDS)
    _next_id = Statement(_NEXT_ID)
    _join = Statement(_JOIN)

    def shard_steps(self) -> Steps[tuple[str, int] | None]:
        """``(name, index)`` of this database in its map, or None if it joined none."""
        rows: list[tuple[Any, ...]] = yield Query(self._shard)
        return (str(rows[0][0]), int(rows[0][1])) if rows else None

    def join_map_steps(self, name: str, index: int, *, origin: bool) -> Steps[bool]:
        """Make this database ``name`` (index ``index``) of a map: its id sequence from then on
        draws ids with ``index`` as their residue. True if it joined now, False if it had already;
        ConfigError if it is another database of a map, or (``origin`` False) holds ids drawn
        before, which would route to the origin."""
        return (yield from atomic(self._join_in_one(name, index, origin)))

    def _join_in_one(self, name: str, index: int, origin: bool) -> Steps[bool]:
        joined = yield from self.shard_steps()
        if joined == (name, index):
            return False
        if joined is not None:
            raise ConfigError(
                f"this database is {joined[0]!r} (index {joined[1]}) of a shard map, not {name!r} (index {index}): "
                "a database keeps its place (its ids carry its index)"
            )
        if not origin:
            old: list[tuple[Any, ...]] = yield Query(self._old_ids, {"base": ID_BASE})
            if old[0][0]:
                raise ConfigError(
                    f"database {name!r} holds jobs with ids drawn before it joined a shard map: only the map's first "
                    "database (its origin) may, since those ids route to it; drain it, or make it the first"
                )
        rows: list[tuple[Any, ...]] = yield Query(self._next_id)
        start = first_id(int(rows[0][0]), index)
        statement = sql.SQL(_SET_SEQUENCE).format(
            sequence=sql.Identifier(self.schema, "miniqueue_jobs_id_seq"),
            step=sql.Literal(MODULUS),
            start=sql.Literal(start),
        )
        yield Query(statement.as_string())
        yield Query(self._join, {"name": name, "index": index})
        return True
