"""Which key takes a job of a spread queue to its database, and what could not hold over several.

On a queue spread over several databases, every job of a key lands on the database of the key's
hash, so whatever a key promises holds there: one holder of a unique key, one job of a sequence
at a time, a concurrency limit per key, a keyed rate limit. A job routes by its first key in
that order, the caller's option winning over its task's declaration field by field. What could
not hold is refused before anything is stored: a second key that differs from the first (its
jobs would spread), and a task-wide rate limit (each database would grant it in full), unless
the map declares the queue's limits per database (see docs/guides/shards.md).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterable, Mapping, Sequence
from typing import Generic, NamedTuple, TypeVar

from ..core.db import DEFAULT_CONNECT_TIMEOUT, connect_seconds
from ..core.errors import ConfigError, DatabaseUnavailable, InvalidInput
from ..core.records import DEFAULT_QUEUE, EnqueueResult, JobSpec, TaskDeclaration
from ..core.shard_map import SHARDS_ENV, Database, ShardMap
from ..core.validation import check_job_ids, declared
from ..store.store import Store
from .base import BaseClient

#: The client of one database of a map: a Client, or an AsyncClient.
C = TypeVar("C", bound=BaseClient)

#: Seconds a database that failed to answer is read last when routing.
DOWN_SECONDS = 10.0


class Unanswered(NamedTuple):
    """A database's answer to a routing step when it did not answer: why, and the declarations
    its client read before."""

    error: DatabaseUnavailable
    stale: Mapping[str, TaskDeclaration]


#: A routing (:meth:`ShardRouter.routing`): it asks a database for the declarations of some
#: tasks, is sent them (or :class:`Unanswered`), and returns each job's database.
Routing = Generator[tuple[Database, set[str]], Mapping[str, TaskDeclaration] | Unanswered, list[Database]]


def unavailable(database: Database, exc: DatabaseUnavailable) -> DatabaseUnavailable:
    """``exc``, naming the database of the map it came from."""
    return DatabaseUnavailable(f"database {database.name!r} is unavailable: {exc}")


def routing_key(spec: JobSpec, declaration: TaskDeclaration | None, queue: str, per_database: bool) -> str | None:
    """The key that picks the database of ``spec``'s job on spread queue ``queue`` (None:
    round-robin); InvalidInput naming what could not hold over the queue's databases."""
    if not (spec.unique_key or spec.sequence_key or spec.concurrency_key or spec.rate_limit or _keyed(declaration)):
        return None  # the common case, a job with no key: round-robin, at a few attribute reads a job
    job = declared(spec, declaration)  # as it will be stored: its own options over its task's
    rate_key = job.rate_limit_key if job.rate_limit is not None else None
    key = job.unique_key or job.sequence_key or job.concurrency_key or rate_key
    if job.sequence_key is not None and job.sequence_key != key:
        raise _spread(spec, queue, f"its sequence key {job.sequence_key!r} differs from its unique key {key!r}")
    if per_database:
        return key
    for what, value in (("concurrency key", job.concurrency_key), ("rate limit key", rate_key)):
        if value is not None and value != key:
            raise _spread(
                spec, queue, f"its {what} {value!r} differs from the key it is routed by, {key!r}", limit=True
            )
    if job.rate_limit is not None and rate_key is None:
        raise _spread(spec, queue, f"its rate limit {job.rate_limit!r} is task-wide", limit=True)
    return key


def _keyed(declaration: TaskDeclaration | None) -> bool:
    """Whether a task's declaration gives its jobs a key or a rate limit."""
    d = declaration
    return d is not None and bool(d.keys or d.concurrency_key or d.concurrency_key_computed or d.rate_limit)


def _spread(spec: JobSpec, queue: str, why: str, *, limit: bool = False) -> InvalidInput:
    remedy = (
        'give the job one key, or declare {"limits": "per-database"} for the queue in the map (each '
        "database then enforces the limit alone)"
        if limit
        else "give the job one key"
    )
    return InvalidInput(
        f"a job of task {spec.task!r} cannot go to queue {queue!r}, spread over several databases: {why}, "
        f"so its jobs would land on different databases; {remedy}"
    )


class ShardRouter(Generic[C]):
    """What the sync and async clients over a shard map share, with no I/O of its own: the map
    (its JSON, a file's path, or a :class:`~miniqueue.core.shard_map.ShardMap`; by default the
    ``MINIQUEUE_SHARDS`` environment variable's), where each job goes, what cannot span
    databases, and each database's client (``C``), opened on first use by the subclass."""

    def __init__(
        self,
        shards: ShardMap | str | None = None,
        *,
        schema: str = "public",
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ) -> None:
        loaded = shards if isinstance(shards, ShardMap) else ShardMap.load(shards)
        if loaded is None:
            raise ConfigError(f"no shard map: pass one (a file's path or its JSON) or set ${SHARDS_ENV}")
        connect_seconds(connect_timeout)  # checked here, before any database is asked
        self.shards, self.schema, self.connect_timeout = loaded, schema, connect_timeout
        self.store = Store(schema)
        self._clients: dict[str, C] = {}
        # Until when each database that failed to answer is read last when routing.
        self._down_until: dict[str, float] = {}
        # The database each task's declaration was last found on: read first for that task.
        self._homes: dict[str, str] = {}

    # -- routing past a database that is down ---------------------------------------------------

    def reading_order(self, tasks: Iterable[str]) -> list[Database]:
        """The map's databases in the order the declarations of ``tasks`` are read when routing:
        first those they were last found on, then the map's order; but a database that failed
        to answer in the last :data:`DOWN_SECONDS` last. So a job bound for a healthy database
        never waits on one that is down (a pool that lost its server waits its whole timeout)."""
        now = time.monotonic()
        homes = {self._homes.get(task) for task in tasks}
        return sorted(
            self.shards.databases.values(),
            key=lambda d: (self._down_until.get(d.name, 0.0) > now, d.name not in homes),
        )

    def found_on(self, database: Database, tasks: Iterable[str]) -> None:
        """Note that the declarations of ``tasks`` were found on ``database``."""
        self._homes.update(dict.fromkeys(tasks, database.name))

    def found_down(self, database: Database, exc: DatabaseUnavailable) -> DatabaseUnavailable:
        """Note that ``database`` did not answer; the error, naming it."""
        self._down_until[database.name] = time.monotonic() + DOWN_SECONDS
        return unavailable(database, exc)

    def routing(self, specs: Sequence[JobSpec]) -> Routing:
        """Where each of ``specs`` goes, with no I/O of its own: each step asks a database (see
        :meth:`reading_order`) for what it declares of the tasks still missing, and is sent that,
        or :class:`Unanswered` when the database did not answer (its declarations read before
        then serve). Returns the databases; raises DatabaseUnavailable only when no database that
        answered declares a task (where its jobs go is not known)."""
        missing = self.undeclared(specs)
        declarations: dict[str, TaskDeclaration] = {}
        down: list[DatabaseUnavailable] = []
        for database in self.reading_order(missing):
            if not missing:
                break
            found = yield database, set(missing)
            if isinstance(found, Unanswered):
                down.append(self.found_down(database, found.error))
                found = found.stale
            here = {task: found[task] for task in missing if task in found}
            self.found_on(database, here)
            declarations.update(here)
            missing -= here.keys()
        if missing and down:
            raise self.unroutable(missing, down)
        return self.pick_all(specs, declarations)

    @staticmethod
    def unroutable(missing: Iterable[str], down: Sequence[DatabaseUnavailable]) -> DatabaseUnavailable:
        """The error of jobs whose tasks no database that answered declares, while ``down`` did
        not answer: where they go is not known, and a guess could put them where no worker runs them."""
        tasks = ", ".join(repr(task) for task in sorted(missing))
        return DatabaseUnavailable(
            f"cannot route task(s) {tasks}: no database that answered declares them, and "
            + "; ".join(str(exc) for exc in down)
            + " (pass queue= to route a job without its task's declaration)"
        )

    def undeclared(self, specs: Iterable[JobSpec]) -> set[str]:
        """The tasks whose declarations decide where some of ``specs`` go: a job that names no
        queue takes its task's, and on a spread queue its task's keys and limits decide (a job of
        a queue on one database needs none)."""
        pairs = {(spec.task, spec.queue) for spec in specs}
        return {task for task, queue in pairs if queue is None or self.shards.spread(queue)}

    def pick(self, spec: JobSpec, declaration: TaskDeclaration | None) -> Database:
        """The database ``spec``'s job goes to, its task declaring ``declaration``."""
        queue = spec.queue or (declaration.queue if declaration else DEFAULT_QUEUE)
        choices = self.shards.databases_of(queue)
        if len(choices) == 1:
            return choices[0]
        return self.shards.choose(choices, routing_key(spec, declaration, queue, queue in self.shards.per_database))

    def pick_all(self, specs: Sequence[JobSpec], declarations: Mapping[str, TaskDeclaration]) -> list[Database]:
        """:meth:`pick` for each of ``specs``. A job with no key or rate limit of its own, of a task
        that declares none, goes round-robin among its queue's databases, looked up once per task
        and queue: the cost of routing a large batch is then a few attribute reads a job."""
        keyless: dict[tuple[str, str | None], tuple[Database, ...] | None] = {}
        picked: list[Database] = []
        for spec in specs:
            choices = keyless.get((spec.task, spec.queue), ())
            if choices == ():
                declaration = declarations.get(spec.task)
                queue = spec.queue or (declaration.queue if declaration else DEFAULT_QUEUE)
                choices = None if _keyed(declaration) else self.shards.databases_of(queue)
                keyless[spec.task, spec.queue] = choices
            if choices is None or spec.unique_key or spec.sequence_key or spec.concurrency_key or spec.rate_limit:
                picked.append(self.pick(spec, declarations.get(spec.task)))
            else:
                picked.append(self.shards.choose(choices))
        return picked

    def together(self, specs: Sequence[JobSpec], databases: Sequence[Database], what: str) -> Database:
        """The one database all of ``specs`` go to, parents included; InvalidInput if several."""
        names = {d.name for d in databases}
        for spec in specs:
            names |= {self.shards.database_of(parent).name for parent in spec.depends_on or ()}
        if len(names) > 1:
            raise InvalidInput(
                f"{what} would span databases {', '.join(sorted(names))}: a dependency holds within one database "
                "(put the queues of its jobs on the same one, or give them a common key on a spread queue)"
            )
        return databases[0]

    def batches(self, specs: Sequence[JobSpec], routes: Sequence[Database], on_conn: bool) -> dict[str, list[int]]:
        """The indexes of ``specs`` by the database each goes to (``routes``), in first-seen order;
        InvalidInput when a job and its parents, or a batch on one connection, span databases."""
        for spec, database in zip(specs, routes, strict=True):
            if spec.depends_on:
                self.together([spec], [database], f"job {spec.task!r} and its parents")
        if on_conn:
            self.together(specs, routes, "a batch on one connection")
        indexes: dict[str, list[int]] = {}
        for i, database in enumerate(routes):
            indexes.setdefault(database.name, []).append(i)
        return indexes

    @staticmethod
    def merged(
        count: int, batches: Mapping[str, list[int]], stored: Mapping[str, list[EnqueueResult]]
    ) -> list[EnqueueResult]:
        """The results of a batch of ``count`` jobs in its order, from each database's (``stored``)
        for the jobs at its ``batches`` indexes."""
        results: list[EnqueueResult | None] = [None] * count
        for name, indexes in batches.items():
            for i, result in zip(indexes, stored[name], strict=True):
                results[i] = result
        return [r for r in results if r is not None]

    def check_connection(self, on: tuple[str, int] | None, database: Database) -> None:
        """A caller's connection, on the database that says it is ``on`` (name, index), must be
        on the job's database: its transaction is there."""
        if on != (database.name, database.index):
            where = "a database of no shard map" if on is None else f"database {on[0]!r}"
            raise InvalidInput(
                f"conn is on {where}, but the job goes to database {database.name!r}: a transactional enqueue "
                "works only on the job's own database"
            )

    def by_database(self, job_ids: Sequence[int]) -> dict[str, list[int]]:
        """``job_ids`` (checked) by the database each names, in first-seen order."""
        found: dict[str, list[int]] = {}
        for job_id in check_job_ids(job_ids):
            found.setdefault(self.shards.database_of(job_id).name, []).append(job_id)
        return found
