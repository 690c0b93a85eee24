"""Command line: ``miniqueue`` (migrate, enqueue, inspect, repair, demo) and ``miniqueue-supervise``.

This module assembles the ``miniqueue`` group from the commands of its siblings (``jobs``,
``queues``, ``sequences``, ``periodic``, ``admin``, ``serve``), which only parse options and call into the
library. The database comes from ``--database-url`` or ``DATABASE_URL``; with neither, a private
embedded PostgreSQL is started in ``./.miniqueue/pgdata`` (or ``$MINIQUEUE_DATA_DIR``).
"""

from __future__ import annotations

import click

from .admin import demo, healthcheck, migrate, prune
from .doctor import doctor
from .errors import OneLineGroup
from .jobs import cancel, enqueue, jobs, requeue
from .keys import fair_queue, keys
from .periodic import periodic
from .queues import limits, queues, stats
from .sequences import sequences
from .serve import supervise, web
from .shards import shards
from .signals import signal, signals


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="miniqueue")
def main() -> None:
    """miniqueue: a PostgreSQL-backed job queue.

    Exit status: 0 on success, 1 when the command failed (database unreachable, a job in the
    wrong state), 2 for bad input (nothing was changed). With --json, a command prints one JSON
    document: an object for one item, an array for a list; timestamps are ISO 8601 with offset.
    """


# By module; --help lists them by name.
for _command in (
    enqueue,
    jobs,
    requeue,
    cancel,
    stats,
    queues,
    limits,
    keys,
    sequences,
    signal,
    signals,
    shards,
    periodic,
    migrate,
    prune,
    healthcheck,
    doctor,
    demo,
):
    main.add_command(_command)
queues.add_command(fair_queue)
main.add_command(web)
main.add_command(supervise)


def supervise_main() -> None:
    """Entry point of ``miniqueue-supervise``."""
    supervise(prog_name="miniqueue-supervise")
