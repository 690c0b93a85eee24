"""Where a run's jobs live: one database (on a server of the harness's own, or the one
``--database-url`` names), or several, each on a server of the harness's own under one shard map
(the full run over several databases: ``--databases N`` with a mode, or ``--everything``).

Everything the run reads or writes outside the supervisors goes through here: the producer (a
``Client``, or a ``ShardedClient`` over the map), each job's own database (its id names it), the
harness's connections, and the records of every database read as one. The outage run over
several databases (chaos.sharded) has servers of its own (chaos.databases) and reads them itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miniqueue import Client
from miniqueue.client.sharded import ShardedClient
from miniqueue.core.shard_map import MODULUS, ShardMap

from .databases import Databases, Shard
from .evidence import Evidence
from .options import Options
from .server import Harness, Server, clock_offset


@dataclass
class Site:
    """The run's databases: one shard (index 0, no map) or several (the map's, by index)."""

    workdir: Path
    shards: list[Shard] = field(default_factory=list)
    #: With several databases: their servers and the map (chaos.databases).
    databases: Databases | None = None
    #: With one database: its server (for the cleanup, even if the database never came).
    server: Server | None = None

    def start(self, options: Options, code: Path, say: Callable[[str], None]) -> None:
        """Start the servers (or connect to ``--database-url``), create and migrate the databases,
        add the harness's tables."""
        if options.sharded:
            self.databases = Databases(self.workdir)
            self.databases.start([1] * options.databases, code, say)
            self.shards = self.databases.shards
            return
        self.server = Server.start(options.database_url, self.workdir)
        dsn = self.server.create_database(code)
        db = Harness(dsn)
        self.shards = [Shard(0, self.server, db, clock_offset(db))]

    @property
    def sharded(self) -> bool:
        return self.databases is not None

    @property
    def dsn(self) -> str:
        """The first database's: the supervisors' ``DATABASE_URL`` (over several, the map says the rest)."""
        return self.shards[0].server.dsn

    @property
    def map_path(self) -> Path | None:
        return self.databases.map_path if self.databases is not None else None

    @property
    def shard_map(self) -> ShardMap | None:
        return self.databases.map if self.databases is not None else None

    @property
    def owned(self) -> bool:
        """Whether the harness owns every server (it can restart and stop them)."""
        return all(shard.server.owned for shard in self.shards)

    def name(self, shard: Shard) -> str:
        """A shard's name in progress lines and fault details: ``db1``, or ``the database`` alone."""
        return shard.name if self.sharded else "the database"

    def database_index(self, shard: Shard) -> int | None:
        """What a database fault records as the database it hit: its index over several, else None
        (every job)."""
        return shard.index if self.sharded else None

    def shard_of(self, job_id: int) -> Shard:
        """The database a job lives on (its id's residue names it, over several)."""
        if not self.sharded:
            return self.shards[0]
        return next(s for s in self.shards if s.index == job_id % MODULUS)

    def producer(self) -> Client | ShardedClient:
        """A client that enqueues where the map says (a ``ShardedClient``), or the one database's."""
        shards = self.shard_map
        return ShardedClient(shards) if shards is not None else Client(self.dsn)

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """``query`` on every database, the rows of each in turn (a read of every database's records
        as one: job ids never repeat across a map)."""
        return [row for shard in self.shards for row in shard.db.rows(query, params)]

    def total(self, query: str, params: Any = None) -> int:
        """The sum over the databases of a query's one number (a count)."""
        return sum(int(row[0] or 0) for row in self.rows(query, params))

    def evidence(self) -> Evidence:
        """Every database's account of the run, as one (see Evidence.merged)."""
        parts = [Evidence.load(shard.db, shard.offset) for shard in self.shards]
        return parts[0] if len(parts) == 1 else Evidence.merged(parts)

    def describe(self) -> str:
        first = self.shards[0].server.describe() if self.shards else "-"
        more = len(self.shards) - 1
        return f"{first}, and {more} more like it (one shard map over them)" if more else first

    def cleanup(self, keep: bool) -> None:
        """Close the harness's connections; drop the databases unless ``keep``; stop owned servers."""
        if self.databases is not None:
            self.databases.cleanup(keep)
            return
        for shard in self.shards:
            shard.db.close()
        if self.server is None:
            return
        with contextlib.suppress(Exception):
            if not keep:
                self.server.drop_database()
        self.server.stop()
