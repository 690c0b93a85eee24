"""What every part of the store shares: its schema's names, the statements made from them, and
running one statement on a sync connection.

Each part of the :class:`~miniqueue.store.store.Store` (a class per concern, in its own module)
declares its statements as :class:`Statement` attributes made from module-level SQL text. That
text is the statement as the store sends it, but for its ``{name}`` placeholders: each is one of
:data:`IDENTIFIERS` (a table or function of the queue's schema), a notification channel or
the job ids' sequence, and becomes that schema's quoted name (``"public"."miniqueue_jobs"``) or
the channel's (or sequence's) literal once,
when the store is made. Nothing else is substituted; every value is a bound parameter.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar, overload

from psycopg import sql
from psycopg.rows import dict_row

from ..core.db import FINISHED_CHANNEL, QUEUE_CHANNEL, Connection, check_schema, cursor_for, translate_errors
from ..core.steps import fetch

#: The placeholder of each table and function of a schema, and its name there.
IDENTIFIERS = {
    "jobs": "miniqueue_jobs",
    "live": "miniqueue_jobs_live",
    "done_default": "miniqueue_jobs_done_default",
    "failed_default": "miniqueue_jobs_failed_default",
    "legacy": "miniqueue_jobs_legacy",
    "idempotency_keys": "miniqueue_idempotency_keys",
    "history_partitions": "miniqueue_history_partitions",
    "migrations": "miniqueue_migrations",
    "periodic": "miniqueue_periodic",
    "queues": "miniqueue_queues",
    "processes": "miniqueue_processes",
    "counts": "miniqueue_counts",
    "finished_minutes": "miniqueue_finished_minutes",
    "limits": "miniqueue_limits",
    "pauses": "miniqueue_pauses",
    "tasks": "miniqueue_tasks",
    "served_queues": "miniqueue_served_queues",
    "settle": "miniqueue_settle",
    "retry_delay": "miniqueue_retry_delay",
    "sequences": "miniqueue_sequences",
    "unique_windows": "miniqueue_unique_windows",
    "signals": "miniqueue_signals",
    "shard": "miniqueue_shard",
    "id_sequence": "miniqueue_jobs_id_seq",
    "advance": "miniqueue_sequence_advance",
    "backlog": "miniqueue_backlog",
    "desired_workers": "miniqueue_desired_workers",
    "fair_keys": "miniqueue_fair_keys",
    "key_rules": "miniqueue_key_rules",
    "key_rule": "miniqueue_key_rule",
    "rank_fair": "miniqueue_rank_fair",
    "apply_key_rules": "miniqueue_apply_key_rules",
}

# A placeholder: a name in braces. SQL's own braces (an empty array, '{}') never match.
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")

T = TypeVar("T")


def qualify(text: str, names: Mapping[str, str]) -> str:
    """``text`` with each ``{name}`` replaced by ``names[name]``; a name not there is an error."""

    def name(match: re.Match[str]) -> str:
        if match[1] not in names:
            raise KeyError(f"{match[0]} in a statement names no identifier of the store")
        return names[match[1]]

    return _PLACEHOLDER.sub(name, text)


def compose(text: str, **clauses: str) -> str:
    """``text`` with each ``{name}`` among ``clauses`` replaced by that clause: how a statement is
    built from named clauses that several statements share (the schema's names are left for
    :func:`qualify`). The store's snapshot, tests/sql/store.sql, shows every statement whole."""
    return _PLACEHOLDER.sub(lambda match: clauses.get(match[1], match[0]), text)


class _Declared(Generic[T]):
    """A statement declared on a class of the store; on a store, its text for that store's schema
    (made when the store is made: see :meth:`StoreBase.__init__`, and kept on the instance)."""

    name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, store: None, owner: type) -> _Declared[T]: ...

    @overload
    def __get__(self, store: StoreBase, owner: type) -> T: ...

    def __get__(self, store: StoreBase | None, owner: type) -> T | _Declared[T]:
        if store is None:
            return self
        value = self.render(store.identifiers)
        store.__dict__[self.name] = value  # from now on an attribute of the instance, read as one
        return value

    def render(self, names: Mapping[str, str]) -> T:
        raise NotImplementedError


class Statement(_Declared[str]):
    """One statement (see the module's docstring)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def render(self, names: Mapping[str, str]) -> str:
        return qualify(self.text, names)


class Statements(_Declared[list[str]]):
    """Statements run one after the other, in one transaction."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = tuple(texts)

    def render(self, names: Mapping[str, str]) -> list[str]:
        return [qualify(text, names) for text in self.texts]


class StoreBase:
    """The schema a store works on, its names, and how a statement runs on a sync connection."""

    def __init__(self, schema: str = "public") -> None:
        self.schema = check_schema(schema)
        #: Where enqueues notify (payload: the queue name).
        self.channel = QUEUE_CHANNEL.format(schema=schema)
        #: Where the statements that finish a job someone waits for notify (payload: the job id).
        self.finished_channel = FINISHED_CHANNEL.format(schema=schema)
        self.table_name = sql.Identifier(schema, IDENTIFIERS["jobs"]).as_string()
        #: The hot table: the partition of the jobs that can still run (migration 022).
        self.live_table_name = sql.Identifier(schema, IDENTIFIERS["live"]).as_string()
        #: What each placeholder of a statement stands for in this schema.
        self.identifiers: dict[str, str] = {
            **{key: sql.Identifier(schema, name).as_string() for key, name in IDENTIFIERS.items()},
            "schema": sql.Identifier(schema).as_string(),
            # The sequence every job id is drawn from, as nextval() takes it.
            "job_ids": sql.Literal(sql.Identifier(schema, "miniqueue_jobs_id_seq").as_string()).as_string(),
            "queue_channel": sql.Literal(self.channel).as_string(),
            "finished_channel": sql.Literal(self.finished_channel).as_string(),
        }
        for name in self.statement_names():
            getattr(self, name)  # each statement made now, once: a typo fails here, not in a claim

    @classmethod
    def statement_names(cls) -> list[str]:
        """The attribute of every statement of the store, by part (in the order of the store's
        bases), and in each part in the order declared."""
        names: dict[str, None] = {}
        for part in cls.__mro__:
            names.update((name, None) for name, value in vars(part).items() if isinstance(value, _Declared))
        return list(names)

    # A method only sync callers need (the worker's, the reaper's, the supervisor's) runs its
    # statement with these, directly. A method an async caller needs too is written as steps
    # (``x_steps``, see miniqueue.core.steps), and its sync form runs them: ``run(conn, x_steps())``.

    @staticmethod
    def _rows(conn: Connection, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with translate_errors():
            return fetch(conn, query, params)

    @staticmethod
    def _named_rows(conn: Connection, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Rows as dicts by column name (for every row shape but the claim's, where building a
        dict per job would cost the drain)."""
        with translate_errors(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, params)
            return cur.fetchall()

    @staticmethod
    def _rowcount(conn: Connection, query: str, params: dict[str, Any]) -> int:
        with translate_errors():
            cur = cursor_for(conn)
            cur.execute(query, params)
            return cur.rowcount
