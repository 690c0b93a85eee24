"""Several databases: the shard map, and how a job's database is chosen and found again (see
docs/guides/shards.md).

A map names databases (each with an ``index``, unique in the map, and a ``weight`` for the
supervisor) and the queues each holds. A queue on one database lives there; a queue spread over
several (a hot queue) takes each job to the database of its key's hash when it has one, so that
all jobs of a key land together, and round-robin otherwise. A queue the map does not name lives
on its first database, the *origin*.

Ids route themselves. Once a database joins a map, its ids are drawn from ``ID_BASE`` up with its
index as their residue modulo ``MODULUS``, so no two databases of a map can ever draw the same id,
and an id names its database: ``id % MODULUS`` for ids from ``ID_BASE`` up; the origin for the
ids below it, which only the origin may hold (drawn before it joined the map; a database that is
not the origin joins only while it holds none).
"""

from __future__ import annotations

import itertools
import json
import os
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError

#: Ids from here up carry their database's index modulo MODULUS (2**52: far above the ids of any
#: existing deployment, and below the 2**53 that a JavaScript number holds exactly).
ID_BASE = 1 << 52
#: How many databases a map can name (indexes 0 to MODULUS - 1).
MODULUS = 1024
#: Where the CLI and ``miniqueue-supervise`` read the map when ``--shards`` is not given.
SHARDS_ENV = "MINIQUEUE_SHARDS"
#: A spread queue's ``"limits"`` in the map when each database may enforce its limits alone.
PER_DATABASE = "per-database"


@dataclass(frozen=True)
class Database:
    """One database of a map: its name, its URL, its index (its ids' residue), its weight."""

    name: str
    url: str
    index: int
    weight: int = 1


@dataclass(frozen=True)
class ShardMap:
    """Databases and the queues each holds; see the module's docstring."""

    databases: dict[str, Database]
    queues: dict[str, tuple[str, ...]]
    #: Spread queues whose limits (a cap, a task's rate or concurrency limit) may hold per
    #: database: each database enforces its own, so the fleet-wide figure is that many times it.
    per_database: frozenset[str] = frozenset()
    _turns: itertools.count[int] = field(default_factory=itertools.count, compare=False, repr=False)
    # Each queue's databases, as databases_of found them (a batch asks once per job).
    _by_queue: dict[str, tuple[Database, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def origin(self) -> Database:
        """The map's first database: where queues it does not name live, and old ids."""
        return next(iter(self.databases.values()))

    def databases_of(self, queue: str) -> tuple[Database, ...]:
        """The databases ``queue`` lives on (the origin for a queue the map does not name)."""
        found = self._by_queue.get(queue)
        if found is None:
            found = tuple(self.databases[name] for name in self.queues.get(queue, (self.origin.name,)))
            self._by_queue[queue] = found
        return found

    def scheduler_of(self, queue: str) -> Database | None:
        """The database whose reaper, alone of the map's, enqueues ``queue``'s periodic jobs: the
        first of the queue's databases that runs workers (a weight above 0); None if none does."""
        return next((d for d in self.databases_of(queue) if d.weight > 0), None)

    def spread(self, queue: str) -> bool:
        """Whether ``queue`` lives on several databases."""
        return len(self.databases_of(queue)) > 1

    def pick(self, queue: str, key: str | None = None) -> Database:
        """The database a new job of ``queue`` goes to: by the hash of ``key`` on a spread queue
        (every job of a key on one database), else round-robin."""
        return self.choose(self.databases_of(queue), key)

    def choose(self, choices: tuple[Database, ...], key: str | None = None) -> Database:
        """:meth:`pick` among a queue's ``choices`` (as :meth:`databases_of` gives them)."""
        if len(choices) == 1:
            return choices[0]
        if key is not None:
            return choices[zlib.crc32(key.encode()) % len(choices)]
        return choices[next(self._turns) % len(choices)]

    def database_of(self, job_id: int) -> Database:
        """The database job ``job_id`` lives on (see the module's docstring)."""
        if job_id < ID_BASE:
            return self.origin
        index = job_id % MODULUS
        for database in self.databases.values():
            if database.index == index:
                return database
        raise ConfigError(f"job {job_id} belongs to the database of index {index}, which the shard map does not name")

    @classmethod
    def parse(cls, data: object) -> ShardMap:
        """A map from its JSON form (see docs/guides/shards.md), checked; ConfigError
        names what is wrong."""
        if not isinstance(data, Mapping) or not isinstance(data.get("databases"), Mapping) or not data["databases"]:
            raise ConfigError('a shard map is a JSON object with "databases": {name: {"url", "index"}, ...}')
        databases: dict[str, Database] = {}
        for name, spec in data["databases"].items():
            if not isinstance(spec, Mapping) or not isinstance(spec.get("url"), str):
                raise ConfigError(f'shard map: database {name!r} needs a "url" (a connection string)')
            index, weight = spec.get("index"), spec.get("weight", 1)
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < MODULUS:
                raise ConfigError(f'shard map: database {name!r} needs an "index" from 0 to {MODULUS - 1}')
            if not isinstance(weight, int) or isinstance(weight, bool) or weight < 0:
                raise ConfigError(f'shard map: database {name!r}: "weight" is a whole number, 0 or more')
            databases[str(name)] = Database(str(name), spec["url"], index, weight)
        taken: dict[int, str] = {}
        for database in databases.values():
            if database.index in taken:
                raise ConfigError(
                    f"shard map: databases {taken[database.index]!r} and {database.name!r} have index "
                    f"{database.index}: each needs its own (it is their ids' residue)"
                )
            taken[database.index] = database.name
        queues: dict[str, tuple[str, ...]] = {}
        per_database: set[str] = set()
        raw_queues = data.get("queues", {})
        if not isinstance(raw_queues, Mapping):
            raise ConfigError('shard map: "queues" is an object: {queue: [database, ...]}')
        for queue, spec in raw_queues.items():
            names, limits = _queue_entry(str(queue), spec)
            unknown = [n for n in names if n not in databases]
            if unknown:
                raise ConfigError(f"shard map: queue {queue!r} names database(s) the map has not: {unknown}")
            queues[str(queue)] = tuple(names)
            if limits == PER_DATABASE:
                per_database.add(str(queue))
        return cls(databases, queues, frozenset(per_database))

    @classmethod
    def load(cls, source: str | None = None) -> ShardMap | None:
        """The map in ``source`` (a JSON file's path, or the JSON itself), else in the
        ``MINIQUEUE_SHARDS`` environment variable; None when neither is set."""
        text = source if source is not None else os.environ.get(SHARDS_ENV)
        if not text:
            return None
        if not text.lstrip().startswith("{"):
            try:
                text = Path(text).read_text()
            except OSError as exc:
                raise ConfigError(f"shard map {source or SHARDS_ENV}: {exc.strerror}: {text}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"shard map: not JSON: {exc}") from None
        return cls.parse(data)


def _queue_entry(queue: str, spec: object) -> tuple[list[str], str | None]:
    """A queue's databases and its ``"limits"`` from its entry in the map: a database's name, a
    list of them, or ``{"databases": [...], "limits": "per-database"}``."""
    limits = None
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"databases", "limits"}
        if unknown:
            raise ConfigError(
                f'shard map: queue {queue!r} has unknown key(s) {sorted(unknown)}: use "databases", "limits"'
            )
        limits = spec.get("limits")
        if limits not in (None, PER_DATABASE):
            raise ConfigError(f'shard map: queue {queue!r}: "limits" is {limits!r}: the only value is "{PER_DATABASE}"')
        spec = spec.get("databases")
    names = [spec] if isinstance(spec, str) else spec
    if not isinstance(names, list) or not names or len(set(names)) != len(names):
        raise ConfigError(f"shard map: queue {queue!r} needs a list of distinct databases")
    return names, limits
