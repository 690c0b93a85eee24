"""A client over several databases, each a complete queue, with the routing in the client (see
docs/guides/shards.md, and :mod:`miniqueue.core.shard_map` for the map and the ids).

Each job lives in exactly one database and every guarantee holds there. What cannot span
databases is refused before anything is stored: a dependency, chain or group whose jobs would
land on different databases, and a caller's connection (``conn=``) that is not the queue's
database. A batch over several databases is one transaction per database.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from ..core.db import Connection
from ..core.errors import DatabaseUnavailable, InvalidInput
from ..core.options import JobOptions, job_spec
from ..core.records import (
    EnqueueResult,
    GroupResult,
    JobRecord,
    JobSpec,
    QueueStats,
    State,
    TaskDeclaration,
)
from ..core.shard_map import Database, ShardMap
from ..core.steps import run
from ..core.validation import check_job_ids
from ..store.migrate import run_migrations
from .client import Client
from .inspection import LimitWait, check_filters
from .merging import (
    Answers,
    JobsPage,
    QueueSetting,
    answered,
    every_answer,
    newest_first,
    page_filters,
    queue_settings,
    unreachable,
)
from .routing import ShardRouter, Unanswered

if TYPE_CHECKING:
    from typing_extensions import Unpack  # only mypy reads it: see miniqueue.core.options

    from ..tasks.app import App

T = TypeVar("T")


class ShardedClient(ShardRouter[Client]):
    """:class:`~miniqueue.Client`'s producing and inspecting calls over the databases of a
    shard map (its JSON, a file's path, or a :class:`~miniqueue.core.shard_map.ShardMap`; by
    default ``$MINIQUEUE_SHARDS``). Each database's client opens on first use."""

    def client(self, database: Database | str) -> Client:
        """The client of one database of the map. Safe from several threads at once: two that
        open a database's client together keep the first stored and close the other (no lock is
        held while connecting, so a database that does not answer holds up no other)."""
        name = database if isinstance(database, str) else database.name
        client = self._clients.get(name)
        if client is None:
            opened = Client(self.shards.databases[name].url, schema=self.schema, connect_timeout=self.connect_timeout)
            client = self._clients.setdefault(name, opened)
            if client is not opened:
                opened.close()
        return client

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def __enter__(self) -> ShardedClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- where a job goes -----------------------------------------------------------------------

    def route(self, spec: JobSpec) -> Database:
        """The database a job goes to: its queue's (as its task declares it, when the job does not
        say: the first database of the map whose workers declared the task), by the hash of its
        key on a spread queue (unique, sequence or concurrency key)."""
        return self.route_all([spec])[0]

    def route_all(self, specs: Sequence[JobSpec]) -> list[Database]:
        """:meth:`route` for each of ``specs``, reading each database's declarations once (and
        then only while a task is not found), those read lately from memory. A database that
        does not answer is passed over (its declarations read before still serve), so that a
        job bound for another never waits on it; DatabaseUnavailable only when no database that
        answered declares a task."""
        routing = self.routing(specs)
        try:
            step = next(routing)
            while True:
                step = routing.send(self._declarations_on(*step))
        except StopIteration as done:
            databases: list[Database] = done.value
            return databases

    def _declarations_on(self, database: Database, tasks: set[str]) -> Mapping[str, TaskDeclaration] | Unanswered:
        """What ``database`` declares of ``tasks`` (from memory while fresh), or why not."""
        try:
            client = self.client(database)
            fresh = client.fresh_declarations(tasks)
            return fresh if fresh is not None else client._run(client._declarations_steps(tasks))
        except DatabaseUnavailable as exc:
            opened = self._clients.get(database.name)
            return Unanswered(exc, opened.stale_declarations() if opened is not None else {})

    def _check_connection(self, conn: Connection | None, database: Database) -> None:
        """A caller's connection must be on the job's database (its transaction is there)."""
        if conn is None:
            return
        self.check_connection(run(conn, self.store.shard_steps()), database)

    # -- producing -------------------------------------------------------------------------------

    def _on(self, database: Database | str, call: Callable[[Client], T]) -> T:
        """``call`` on ``database``'s client; a DatabaseUnavailable names the database."""
        found = self.shards.databases[database] if isinstance(database, str) else database
        try:
            return call(self.client(found))
        except DatabaseUnavailable as exc:
            raise self.found_down(found, exc) from exc

    def enqueue(
        self, task: str, payload: Any = None, *, conn: Connection | None = None, **options: Unpack[JobOptions]
    ) -> EnqueueResult:
        """:meth:`miniqueue.Client.enqueue` on the job's database (see :meth:`route`)."""
        spec = job_spec(task, payload, options)
        database = self.together([spec], [self.route(spec)], "the job and its parents")
        self._check_connection(conn, database)
        return self._on(database, lambda client: client.enqueue(task, payload, conn=conn, **options))

    def enqueue_many(self, jobs: Iterable[JobSpec], *, conn: Connection | None = None) -> list[EnqueueResult]:
        """:meth:`miniqueue.Client.enqueue_many`, one transaction per database, the databases'
        at once (a failure on one leaves the others' jobs stored); with ``conn``, every job must
        go to that connection's database."""
        specs = list(jobs)
        routes = self.route_all(specs)
        batches = self.batches(specs, routes, conn is not None)
        if conn is not None and routes:
            self._check_connection(conn, routes[0])
            return self._on(routes[0], lambda client: client.enqueue_many(specs, conn=conn))

        def store(name: str) -> list[EnqueueResult]:
            return self._on(name, lambda client: client.enqueue_many([specs[i] for i in batches[name]]))

        if len(batches) == 1:
            return store(next(iter(batches)))
        # One thread per database: each one's statement runs while the next batch is encoded.
        with ThreadPoolExecutor(len(batches), thread_name_prefix="miniqueue-enqueue") as pool:
            stored = dict(zip(batches, pool.map(store, batches), strict=True))
        return self.merged(len(specs), batches, stored)

    def declare(self, app: App) -> None:
        """:meth:`miniqueue.Client.declare` on every database of the map, so that jobs enqueued by
        name go to their tasks' queues before any worker has run (a deploy step, a test fixture)."""
        for name in self.shards.databases:
            self.client(name).declare(app)

    def chain(self, steps: Sequence[JobSpec], *, conn: Connection | None = None) -> list[EnqueueResult]:
        """:meth:`miniqueue.Client.chain`, on the one database all its steps go to."""
        database = self.together(steps, self.route_all(steps), "the chain")
        self._check_connection(conn, database)
        return self._on(database, lambda client: client.chain(steps, conn=conn))

    def group(self, members: Sequence[JobSpec], *, conn: Connection | None = None, **callbacks: JobSpec) -> GroupResult:
        """:meth:`miniqueue.Client.group`, on the one database its members and callbacks go to."""
        every = [*members, *callbacks.values()]
        database = self.together(every, self.route_all(every), "the group")
        self._check_connection(conn, database)
        return self._on(database, lambda client: client.group(members, conn=conn, **callbacks))

    def limit_queue(self, name: str, max_running: int | None, *, create: bool = False) -> None:
        """:meth:`miniqueue.Client.limit_queue` on every database ``name`` lives on. Each database
        counts only its own running jobs, so on a spread queue a cap holds per database: it is
        refused unless the map declares the queue's limits per database (lifting one never is)."""
        databases = self.shards.databases_of(name)
        if max_running is not None and len(databases) > 1 and name not in self.shards.per_database:
            names = ", ".join(d.name for d in databases)
            raise InvalidInput(
                f"queue {name!r} is spread over databases {names}: a cap of {max_running} would hold per database "
                f'({max_running * len(databases)} in all); declare {{"limits": "per-database"}} for the queue in the '
                "map to accept that"
            )
        for database in databases:
            self.client(database).limit_queue(name, max_running, create=create)

    # -- by id: every id routes itself ----------------------------------------------------------

    def get(self, job_id: int) -> JobRecord:
        return self.client(self.shards.database_of(job_id)).get(job_id)

    def result(self, job_id: int) -> Any:
        return self.client(self.shards.database_of(job_id)).result(job_id)

    def wait(self, job_id: int, *, timeout: float = 60.0) -> Any:
        return self.client(self.shards.database_of(job_id)).wait(job_id, timeout=timeout)

    def cancel(self, job_ids: Sequence[int]) -> list[int]:
        """:meth:`miniqueue.Client.cancel`, all or nothing within each database."""
        return self._per_database(job_ids, lambda client, ids: client.cancel(ids))

    def requeue(self, job_ids: Sequence[int]) -> list[int]:
        """:meth:`miniqueue.Client.requeue`, all or nothing within each database."""
        return self._per_database(job_ids, lambda client, ids: client.requeue(ids))

    def _per_database(self, job_ids: Sequence[int], act: Any) -> list[int]:
        done: list[int] = []
        for name, ids in self.by_database(job_ids).items():
            done += act(self.client(name), ids)
        return done

    # -- what operators read: every database, merged --------------------------------------------

    def read_on(self, database: Database | str, read: Callable[[Client], T]) -> T:
        """``read(client)`` on one database of the map; DatabaseUnavailable naming the database
        when it does not answer. Safe from several threads at once (the dashboard's)."""
        name = database if isinstance(database, str) else database.name
        found = self.answer(name, read)
        if isinstance(found, DatabaseUnavailable):
            raise DatabaseUnavailable(f"database {name} of the shard map did not answer: {found}") from found
        return found

    def read_each(self, read: Callable[[Client], T]) -> Answers[T]:
        """``read(client)`` on every database of the map, in the map's order: per database, its
        answer, or the DatabaseUnavailable that says why it did not answer (never an empty
        answer in its place). Safe from several threads at once."""
        return {name: self.answer(name, read) for name in self.shards.databases}

    def answer(self, name: str, read: Callable[[Client], T]) -> T | DatabaseUnavailable:
        """``read(client)`` on database ``name`` of the map: its answer, or the DatabaseUnavailable
        that says why it did not answer. Safe from several threads at once."""
        try:
            return read(self.client(name))
        except DatabaseUnavailable as exc:
            return exc

    def queue_stats_by_database(self) -> Answers[list[QueueStats]]:
        """Each database's queue figures, or the error that says it is unreachable (never zeros)."""
        return self.read_each(lambda client: client.queue_stats())

    def queue_stats(self) -> list[QueueStats]:
        """Every queue's figures summed over the databases; DatabaseUnavailable naming any
        database that did not answer (see :meth:`queue_stats_by_database` for the rest)."""
        merged: dict[str, QueueStats] = {}
        for stats in every_answer(self.queue_stats_by_database()).values():
            for q in stats:
                merged[q.queue] = q if q.queue not in merged else summed(merged[q.queue], q)
        return [merged[name] for name in sorted(merged)]

    def queue_settings_by_database(self) -> Answers[list[QueueSetting]]:
        """Each database's queues (those with jobs, paused or capped): paused or not, and the
        cap it holds (see :func:`~miniqueue.client.merging.total_settings` for each queue's total)."""
        return self.read_each(lambda client: queue_settings(client.list_queues(), client.queue_limits()))

    def limit_waits_by_database(self, limit: int = 100) -> Answers[list[LimitWait]]:
        """Each database's :meth:`miniqueue.Client.limit_waits` (see
        :func:`~miniqueue.client.merging.total_waits` for each limit's total)."""
        return self.read_each(lambda client: client.limit_waits(limit))

    def find(self, job_id: int) -> tuple[Database, JobRecord]:
        """The database job ``job_id`` lives on (its id says which) and the job; JobNotFound,
        or DatabaseUnavailable naming the database."""
        database = self.shards.database_of(check_job_ids([job_id])[0])
        return database, self.read_on(database, lambda client: client.get(job_id))

    def jobs_page(self, *, before_id: int | None = None, limit: int = 50, **filters: Any) -> JobsPage:
        """Up to ``limit`` jobs matching the filters (those of :meth:`miniqueue.Client.list_jobs`)
        over every database, newest first by creation time, then id; the next page is
        ``before_id=`` the last one's id (a job that exists: JobNotFound otherwise). A database
        that does not answer is named in the page's ``unreachable``, its jobs missing."""
        check_filters(before_id=before_id, **filters)
        cursor = None if before_id is None else self.find(before_id)[1]
        answers: Answers[list[JobRecord]] = {}
        for database in self.shards.databases.values():
            page = dict(filters)
            if cursor is not None:
                page = page_filters(filters, cursor, on_cursors=database == self.shards.database_of(cursor.id))
            listing = functools.partial(Client.list_jobs, limit=limit, **page)
            answers[database.name] = self.answer(database.name, listing)
        return JobsPage(newest_first(answered(answers).values(), limit, cursor), unreachable(answers))

    def list_jobs(self, *, before_id: int | None = None, limit: int = 50, **filters: Any) -> list[JobRecord]:
        """:meth:`jobs_page`'s jobs; DatabaseUnavailable naming any database that did not answer."""
        page = self.jobs_page(before_id=before_id, limit=limit, **filters)
        every_answer(page.unreachable)
        return page.jobs


def summed(a: QueueStats, b: QueueStats) -> QueueStats:
    """One queue's figures over two databases (the oldest wait is the older of the two)."""
    oldest = [s for s in (a.oldest_available_seconds, b.oldest_available_seconds) if s is not None]
    return QueueStats(
        queue=a.queue,
        counts={state: a.counts.get(state, 0) + b.counts.get(state, 0) for state in State},
        scheduled=a.scheduled + b.scheduled,
        oldest_available_seconds=max(oldest) if oldest else None,
        expired_leases=a.expired_leases + b.expired_leases,
        served=a.served and b.served,
        signal_waits=a.signal_waits + b.signal_waits,
    )


def migrate_shards(shards: ShardMap, *, schema: str = "public") -> dict[str, bool]:
    """Migrate every database of the map and have each join it (its ids carry its index from
    then on); per database, whether it joined now. The origin (the first) may hold older jobs."""
    joined: dict[str, bool] = {}
    for database in shards.databases.values():
        run_migrations(database.url, schema)
        with Client(database.url, schema=schema) as client:
            steps = client.store.join_map_steps(database.name, database.index, origin=database == shards.origin)
            joined[database.name] = client._run(steps)
    return joined
