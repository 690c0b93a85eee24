"""The asyncio client over several databases: :class:`~miniqueue.client.sharded.ShardedClient`'s
routing with :class:`~miniqueue.AsyncClient`'s calls (see docs/guides/shards.md).

Each job lives in exactly one database; what cannot span databases is refused before anything
is stored, by the same rules (:class:`~miniqueue.client.routing.ShardRouter`) as the sync client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..core.db import AsyncConnection
from ..core.errors import DatabaseUnavailable
from ..core.options import JobOptions, job_spec
from ..core.records import EnqueueResult, GroupResult, JobRecord, JobSpec, TaskDeclaration
from ..core.shard_map import Database
from ..core.steps import arun
from .asyncclient import AsyncClient
from .routing import ShardRouter, Unanswered

if TYPE_CHECKING:
    from typing_extensions import Unpack  # only mypy reads it: see miniqueue.core.options

T = TypeVar("T")

AsyncAct = Callable[[AsyncClient, list[int]], Awaitable[list[int]]]


class AsyncShardedClient(ShardRouter[AsyncClient]):
    """:class:`~miniqueue.AsyncClient`'s producing calls and the calls by job id over the
    databases of a shard map (its JSON, a file's path, or a
    :class:`~miniqueue.core.shard_map.ShardMap`; by default ``$MINIQUEUE_SHARDS``). Each database's
    client opens on first use."""

    async def client(self, database: Database | str) -> AsyncClient:
        """The (opened) client of one database of the map."""
        name = database if isinstance(database, str) else database.name
        if name not in self._clients:
            url = self.shards.databases[name].url
            self._clients[name] = AsyncClient(url, schema=self.schema, connect_timeout=self.connect_timeout)
        client = self._clients[name]
        await client.open()
        return client

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()

    async def __aenter__(self) -> AsyncShardedClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- where a job goes -----------------------------------------------------------------------

    async def route_all(self, specs: Sequence[JobSpec]) -> list[Database]:
        """The database each of ``specs`` goes to (see :meth:`ShardedClient.route_all`: a
        database that does not answer is passed over)."""
        routing = self.routing(specs)
        try:
            step = next(routing)
            while True:
                step = routing.send(await self._declarations_on(*step))
        except StopIteration as done:
            databases: list[Database] = done.value
            return databases

    async def _declarations_on(self, database: Database, tasks: set[str]) -> Mapping[str, TaskDeclaration] | Unanswered:
        """What ``database`` declares of ``tasks`` (from memory while fresh), or why not."""
        opened = self._clients.get(database.name)
        fresh = opened.fresh_declarations(tasks) if opened is not None else None
        if fresh is not None:
            return fresh
        try:
            client = await self.client(database)
            return await client._run(client._declarations_steps(tasks))
        except DatabaseUnavailable as exc:
            return Unanswered(exc, opened.stale_declarations() if opened is not None else {})

    async def _on(self, database: Database | str, call: Callable[[AsyncClient], Awaitable[T]]) -> T:
        """``call`` on ``database``'s client; a DatabaseUnavailable names the database."""
        found = self.shards.databases[database] if isinstance(database, str) else database
        try:
            return await call(await self.client(found))
        except DatabaseUnavailable as exc:
            raise self.found_down(found, exc) from exc

    async def _check_connection(self, conn: AsyncConnection | None, database: Database) -> None:
        if conn is not None:
            self.check_connection(await arun(conn, self.store.shard_steps()), database)

    # -- producing -------------------------------------------------------------------------------

    async def enqueue(
        self, task: str, payload: Any = None, *, conn: AsyncConnection | None = None, **options: Unpack[JobOptions]
    ) -> EnqueueResult:
        """:meth:`miniqueue.AsyncClient.enqueue` on the job's database."""
        spec = job_spec(task, payload, options)
        database = self.together([spec], await self.route_all([spec]), "the job and its parents")
        await self._check_connection(conn, database)
        return await self._on(database, lambda client: client.enqueue(task, payload, conn=conn, **options))

    async def enqueue_many(
        self, jobs: Iterable[JobSpec], *, conn: AsyncConnection | None = None
    ) -> list[EnqueueResult]:
        """:meth:`miniqueue.AsyncClient.enqueue_many`, one transaction per database, the
        databases' at once (a failure on one leaves the others' jobs stored); with ``conn``, every
        job must go to that connection's database."""
        specs = list(jobs)
        routes = await self.route_all(specs)
        batches = self.batches(specs, routes, conn is not None)
        if conn is not None and routes:
            await self._check_connection(conn, routes[0])
            return await self._on(routes[0], lambda client: client.enqueue_many(specs, conn=conn))

        async def store(name: str) -> list[EnqueueResult]:
            return await self._on(name, lambda client: client.enqueue_many([specs[i] for i in batches[name]]))

        stored = dict(zip(batches, await asyncio.gather(*(store(name) for name in batches)), strict=True))
        return self.merged(len(specs), batches, stored)

    async def chain(self, steps: Sequence[JobSpec], *, conn: AsyncConnection | None = None) -> list[EnqueueResult]:
        """:meth:`miniqueue.AsyncClient.chain`, on the one database all its steps go to."""
        database = self.together(steps, await self.route_all(steps), "the chain")
        await self._check_connection(conn, database)
        return await self._on(database, lambda client: client.chain(steps, conn=conn))

    async def group(
        self, members: Sequence[JobSpec], *, conn: AsyncConnection | None = None, **callbacks: JobSpec
    ) -> GroupResult:
        """:meth:`miniqueue.AsyncClient.group`, on the one database its members and callbacks go to."""
        every = [*members, *callbacks.values()]
        database = self.together(every, await self.route_all(every), "the group")
        await self._check_connection(conn, database)
        return await self._on(database, lambda client: client.group(members, conn=conn, **callbacks))

    # -- by id: every id routes itself ----------------------------------------------------------

    async def get(self, job_id: int) -> JobRecord:
        return await (await self.client(self.shards.database_of(job_id))).get(job_id)

    async def result(self, job_id: int) -> Any:
        return await (await self.client(self.shards.database_of(job_id))).result(job_id)

    async def wait(self, job_id: int, *, timeout: float = 60.0) -> Any:
        return await (await self.client(self.shards.database_of(job_id))).wait(job_id, timeout=timeout)

    async def cancel(self, job_ids: Sequence[int]) -> list[int]:
        """:meth:`miniqueue.AsyncClient.cancel`, all or nothing within each database."""
        return await self._per_database(job_ids, lambda client, ids: client.cancel(ids))

    async def requeue(self, job_ids: Sequence[int]) -> list[int]:
        """:meth:`miniqueue.AsyncClient.requeue`, all or nothing within each database."""
        return await self._per_database(job_ids, lambda client, ids: client.requeue(ids))

    async def _per_database(self, job_ids: Sequence[int], act: AsyncAct) -> list[int]:
        done: list[int] = []
        for name, ids in self.by_database(job_ids).items():
            done += await act(await self.client(name), ids)
        return done
