"""The databases of a run over several (``--databases N``): N embedded servers of the harness's
own, a database on each, and one shard map naming them (indexes 0 to N-1) with the chaos queue
spread over all of them, so round-robin gives each database a third (for three) of the jobs.

Every database is migrated and joins the map through ``miniqueue migrate --shards`` run from the
code snapshot, as the single-database run migrates through ``miniqueue migrate``; then each gets
the harness's tables and triggers (``chaos.schema``), so each keeps its own records of its jobs.
The jobs are enqueued through :class:`~miniqueue.client.sharded.ShardedClient`, in one
``enqueue_many`` (one transaction per database).
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from miniqueue.client.sharded import ShardedClient
from miniqueue.core.shard_map import ShardMap

from . import schema
from .app import QUEUE
from .options import Options
from .server import Harness, Server, clock_offset, migrate
from .workload import Draw, Workload

#: Each server's folder in the run directory, by the database's index.
SERVER_DIR = "server-{index}"
MAP_FILE = "shards.json"

_UNFINISHED = "SELECT count(*) FROM miniqueue_jobs WHERE state IN ('available', 'running', 'waiting')"
_AVAILABLE = "SELECT count(*) FROM miniqueue_jobs WHERE state = 'available'"


@dataclass
class Shard:
    """One database of the run: its name and index in the map, its server, the harness's
    connection to it, and its clock's offset from this host's."""

    index: int
    server: Server
    db: Harness
    offset: float

    @property
    def name(self) -> str:
        return f"db{self.index}"


@dataclass
class Databases:
    """The run's servers and databases, and the shard map's file (in ``workdir``)."""

    workdir: Path
    servers: list[Server] = field(default_factory=list)
    shards: list[Shard] = field(default_factory=list)

    @property
    def map_path(self) -> Path:
        return self.workdir / MAP_FILE

    @property
    def map(self) -> ShardMap:
        loaded = ShardMap.load(str(self.map_path))
        assert loaded is not None, "the map is written before anything reads it"
        return loaded

    def start(self, weights: list[int], code: Path, say: Callable[[str], None]) -> None:
        """Start a server per weight (each in a folder of its own), create a database on each,
        write the map (the weights share the workers), migrate and join every database, add the
        harness's tables."""
        count = len(weights)
        for index in range(count):
            self.servers.append(Server.start(None, self.workdir / SERVER_DIR.format(index=index)))
            self.servers[-1].create_empty()
        say(f"started {count} servers; migrating their databases into one shard map ({self.map_path})")
        databases = {f"db{i}": {"url": s.dsn, "index": i, "weight": weights[i]} for i, s in enumerate(self.servers)}
        self.map_path.write_text(json.dumps({"databases": databases, "queues": {QUEUE: list(databases)}}, indent=2))
        migrate(code, ["--shards", str(self.map_path)], f"the {count} databases of {self.map_path}")
        for index, server in enumerate(self.servers):
            with psycopg.connect(server.dsn, autocommit=True) as conn:
                schema.install(conn)
            db = Harness(server.dsn)
            self.shards.append(Shard(index, server, db, clock_offset(db)))

    def unfinished(self) -> dict[str, int]:
        """Each database's jobs still available, running or waiting."""
        return {s.name: int(s.db.value(_UNFINISHED)) for s in self.shards}

    def available(self, shards: list[Shard]) -> dict[str, int]:
        """Each of ``shards``' jobs waiting for a worker."""
        return {s.name: int(s.db.value(_AVAILABLE)) for s in shards}

    def cleanup(self, keep: bool) -> None:
        """Close the harness's connections, drop the databases (unless ``keep``), stop every server."""
        for shard in self.shards:
            shard.db.close()
        for server in self.servers:
            if not keep:
                with contextlib.suppress(Exception):
                    server.drop_database()
            server.stop()


def enqueue_sharded(shards: ShardMap, options: Options, rng: random.Random) -> Workload:
    """The run's jobs, drawn as a single-database run draws its plain jobs, enqueued through a
    ShardedClient: the chaos queue is spread over every database, so they go round-robin."""
    draw = Draw(options, rng)
    planned = [draw.job() for _ in range(options.jobs)]
    workload = Workload()
    with ShardedClient(shards) as client:
        for result, job in zip(client.enqueue_many([p.spec for p in planned]), planned, strict=True):
            workload.add(result.id, job)
    return workload
