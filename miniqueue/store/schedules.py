"""Periodic schedules created at run time (migration 026): their definitions, and the claim of a
slot that re-checks the definition the scheduler read.

The table is named through ``{schema}`` (the queue's schema): its definitions are the only rows,
and each schedule's state (enabled, last slot) is its row in the periodic table, shared with the
schedules of the code. Creating a schedule takes that row first, so a name a scheduler or an
operator already gave a code schedule is refused in the same statement.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from psycopg.types.json import Jsonb

from ..core.db import Connection
from ..core.records import Schedule
from ..core.steps import Query, Steps, run
from .base import Statement, StoreBase

# What a schedule reads as: its definition and its state, by column name (see Schedule).
_COLUMNS = """s.name, s.cron, s.task, s.payload, s.timezone, s.catch_up, s.grace,
       coalesce(p.enabled, true) AS enabled, p.last_slot, s.created_at, s.updated_at"""

# Every schedule made at run time, by name. The reaper runs it once a pass: a small table.
_SCHEDULES = f"""
SELECT {_COLUMNS}
  FROM {{schema}}.miniqueue_schedules s LEFT JOIN {{periodic}} p USING (name)
 ORDER BY s.name
"""

# One schedule made at run time.
_SCHEDULE = f"""
SELECT {_COLUMNS}
  FROM {{schema}}.miniqueue_schedules s LEFT JOIN {{periodic}} p USING (name)
 WHERE s.name = %(name)s
"""

# Create a schedule: take its name in the periodic table (its first slot is the next one after
# now), then store its definition. No row: the name is taken, by this table or by the code.
_CREATE_SCHEDULE = """
WITH taken AS (
    INSERT INTO {periodic} (name, last_slot, enabled) VALUES (%(name)s, now(), %(enabled)s)
    ON CONFLICT (name) DO NOTHING
    RETURNING name
)
INSERT INTO {schema}.miniqueue_schedules (name, cron, task, payload, timezone, catch_up, grace)
SELECT name, %(cron)s, %(task)s, %(payload)s, %(timezone)s, %(catch_up)s, %(grace)s FROM taken
RETURNING name
"""

# Lock a schedule's definition for a change (read, merged with the change and validated, then written).
_LOCK_SCHEDULE = """
SELECT cron, task, payload, timezone, catch_up, grace FROM {schema}.miniqueue_schedules
 WHERE name = %(name)s
   FOR UPDATE
"""

# Write a changed definition; updated_at moves, so a scheduler that read the old one claims nothing.
_CHANGE_SCHEDULE = """
UPDATE {schema}.miniqueue_schedules
   SET cron = %(cron)s, payload = %(payload)s, timezone = %(timezone)s, updated_at = clock_timestamp()
 WHERE name = %(name)s
"""

# Delete a schedule and its state (so its name can be taken again); says whether it existed.
_DELETE_SCHEDULE = """
WITH gone AS (
    DELETE FROM {schema}.miniqueue_schedules WHERE name = %(name)s RETURNING name
), state AS (
    DELETE FROM {periodic} WHERE name IN (SELECT name FROM gone)
)
SELECT name FROM gone
"""

# Claim a runtime schedule's slot: as a code schedule's (see the periodic table's claim), and only
# while its definition is still the one the scheduler read. Returns a row only for the winner.
_CLAIM_STORED_SLOT = """
INSERT INTO {periodic} (name, last_slot)
SELECT name, %(slot)s FROM {schema}.miniqueue_schedules WHERE name = %(name)s AND updated_at = %(revision)s
ON CONFLICT (name) DO UPDATE SET last_slot = excluded.last_slot, updated_at = now()
 WHERE {periodic}.last_slot < excluded.last_slot AND {periodic}.enabled
RETURNING name
"""


class StoredSchedules(StoreBase):
    """Periodic schedules created at run time."""

    _schedules = Statement(_SCHEDULES)
    _schedule = Statement(_SCHEDULE)
    _create_schedule = Statement(_CREATE_SCHEDULE)
    _lock_schedule = Statement(_LOCK_SCHEDULE)
    _change_schedule = Statement(_CHANGE_SCHEDULE)
    _delete_schedule = Statement(_DELETE_SCHEDULE)
    _claim_stored_slot = Statement(_CLAIM_STORED_SLOT)

    def stored_schedules(self, conn: Connection) -> list[Schedule]:
        """Every schedule created at run time, by name."""
        return run(conn, self.stored_schedules_steps())

    def stored_schedules_steps(self) -> Steps[list[Schedule]]:
        """:meth:`stored_schedules` as steps."""
        rows: list[dict[str, Any]] = yield Query(self._schedules, {}, named=True)
        return [Schedule(**row) for row in rows]

    def stored_schedule_steps(self, name: str) -> Steps[Schedule | None]:
        """Schedule ``name`` if it was created at run time, else None."""
        rows: list[dict[str, Any]] = yield Query(self._schedule, {"name": name}, named=True)
        return Schedule(**rows[0]) if rows else None

    def create_schedule_steps(self, definition: Mapping[str, Any], enabled: bool) -> Steps[bool]:
        """Store a schedule (validated), ``definition`` being its columns by name (a Periodic's
        fields); False if its name is taken (by the code or at run time)."""
        params = {**definition, "payload": _json(definition["payload"]), "enabled": enabled}
        rows: list[tuple[Any, ...]] = yield Query(self._create_schedule, params)
        return bool(rows)

    def lock_schedule_steps(self, name: str) -> Steps[dict[str, Any] | None]:
        """Schedule ``name``'s definition, locked until the transaction ends; None if there is none."""
        rows: list[dict[str, Any]] = yield Query(self._lock_schedule, {"name": name}, named=True)
        return rows[0] if rows else None

    def change_schedule_steps(self, name: str, cron: str, payload: Any, timezone: str) -> Steps[None]:
        """Write schedule ``name``'s changed definition (validated, and locked by :meth:`lock_schedule_steps`)."""
        params = {"name": name, "cron": cron, "payload": _json(payload), "timezone": timezone}
        yield Query(self._change_schedule, params)

    def delete_schedule_steps(self, name: str) -> Steps[bool]:
        """Delete runtime schedule ``name`` and its state; False if there was none."""
        rows: list[tuple[Any, ...]] = yield Query(self._delete_schedule, {"name": name})
        return bool(rows)

    def claim_stored_slot(self, conn: Connection, name: str, slot: dt.datetime, revision: dt.datetime) -> bool:
        """Advance runtime schedule ``name`` to ``slot`` if its definition is still ``revision``
        (its updated_at); True only for the one caller that did. Run it in the enqueue's transaction."""
        params = {"name": name, "slot": slot, "revision": revision}
        return bool(self._rows(conn, self._claim_stored_slot, params))


def _json(payload: Any) -> Jsonb | None:
    return None if payload is None else Jsonb(payload)
