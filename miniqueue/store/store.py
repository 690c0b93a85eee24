"""The store: every SQL statement miniqueue runs, one method per statement, for the queue tables
in one schema.

:class:`Store` is assembled from one class per concern, each in its module with the statements
it runs, written whole as module-level text (see :mod:`miniqueue.store.base` for the one thing
substituted into them, the schema's names):

- :mod:`~miniqueue.store.enqueue`: inserting jobs (one, waiting for others, a batch, by COPY);
- :mod:`~miniqueue.store.groups`: jobs a running member adds to its own group;
- :mod:`~miniqueue.store.keyed`: inserting jobs with unique or sequence keys or a deadline;
- :mod:`~miniqueue.store.copying`: large batches by COPY, with keys a COPY can store or without;
- :mod:`~miniqueue.store.sequences`: the sequence keys a failed job blocks, and their release;
- :mod:`~miniqueue.store.claim`: leasing jobs, limits admitted (the statements in ``claim.sql``);
- :mod:`~miniqueue.store.outcomes`: a worker's reports (complete, fail, snooze, release, renew);
- :mod:`~miniqueue.store.progress`: jobs' progress, written by their workers, read and watched;
- :mod:`~miniqueue.store.durable_steps`: a durable job's steps, sleeps and waits, and signals;
- :mod:`~miniqueue.store.maintenance`: recovery of expired leases, pruning, recounts, vacuum;
- :mod:`~miniqueue.store.history`: the finished jobs' partitions, made ahead and dropped whole;
- :mod:`~miniqueue.store.actions`: an operator's requeue, cancel and delete;
- :mod:`~miniqueue.store.inspection`: jobs, results, per-queue figures, limits, throughput;
- :mod:`~miniqueue.store.settings`: queues paused and capped, periodic schedules, task declarations;
- :mod:`~miniqueue.store.schedules`: the periodic schedules created at run time;
- :mod:`~miniqueue.store.registry`: the supervisors' process registry;
- :mod:`~miniqueue.store.schema`: the schema's version and migrations;
- :mod:`~miniqueue.store.shard_place`: a database's place in a shard map (its ids' residue);
- :mod:`~miniqueue.store.horizon`: what holds the MVCC horizon back, the jobs table's dead rows and sizes;
- :mod:`~miniqueue.store.holdbacks`: the facts that hold a job back (or say that it ran);
- :mod:`~miniqueue.store.backlog`: the backlog an autoscaler reads, and the workers it calls for;
- :mod:`~miniqueue.store.aging`: queues whose jobs age, and the reaper's batches that raise them.

Every value is bound as a parameter. All times come from the database clock (``now()``).

What a client runs (enqueue, inspection, repair) and the fenced completion are written as
*steps* (``x_steps``: the statements, their parameters, the row mapping and the logic between
them, with no I/O; see :mod:`miniqueue.core.steps`), so that a sync and an async connection run
the very same code; ``x(conn, ...)`` runs them on a sync connection. What only the worker,
reaper and supervisor run (claims, heartbeats, failures, the registry, migrations) executes on
a sync connection directly.
"""

from __future__ import annotations

from .actions import OperatorActions
from .aging import Aging
from .backlog import Scaling
from .claim import MAX_GROUPS_PER_CLAIM, Claiming, groups_needed
from .durable_steps import Durable
from .enqueue import Enqueuing
from .fairness import Fairness
from .groups import Groups
from .history import History
from .holdbacks import Why
from .horizon import Health
from .inspection import Inspection, LimitWait, job_filter
from .maintenance import JobsChurn, Maintenance
from .outcomes import Failure, Outcomes, Release
from .progress import Progress
from .registry import Registry
from .rows import columns as _columns
from .schedules import StoredSchedules
from .schema import SchemaStatements
from .sequences import Sequences
from .settings import Settings
from .shard_place import Shards

__all__ = [
    "MAX_GROUPS_PER_CLAIM",
    "Failure",
    "JobsChurn",
    "LimitWait",
    "Release",
    "Store",
    "_columns",
    "groups_needed",
    "job_filter",
]


class Store(
    Enqueuing,
    Groups,
    Claiming,
    Outcomes,
    Progress,
    Durable,
    Maintenance,
    OperatorActions,
    Inspection,
    Settings,
    StoredSchedules,
    Registry,
    SchemaStatements,
    Health,
    Sequences,
    History,
    Shards,
    Why,
    Scaling,
    Aging,
    Fairness,
):
    """All of miniqueue's SQL, for the queue tables in one schema.

    Methods take the connection to run on as their first argument, so the caller decides the
    transaction: our own autocommit connections run each statement as its own transaction;
    a caller's connection (transactional enqueue, transactional completion) runs it inside
    the caller's transaction.
    """
