"""A job's options, declared once: the keywords every enqueue takes (:meth:`miniqueue.Client.enqueue`,
its async, app and sharded forms, the Django and SQLAlchemy helpers), which are the fields of a
:class:`~miniqueue.JobSpec` beyond its task and payload.

Each of those signatures says ``**options: Unpack[JobOptions]``, so mypy checks every keyword
of a call, its name and its type, against :class:`JobOptions`. ``Unpack`` is ``typing``'s from
Python 3.11 on, and the package supports 3.10 (which mypy checks it as):
each module imports it from ``typing_extensions`` under ``TYPE_CHECKING``, which only mypy reads
(from the stubs it ships), so that nothing is imported at run time.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, TypedDict

from .records import Debounce, JobSpec


class JobOptions(TypedDict, total=False):
    """Every option of a job, by group. An option left out (or None) is what the job's task
    declares (see docs/guides/tasks.md), else the default said here; one given wins.

    **Placement**: the ``queue`` (default ``"default"``), the ``priority`` (higher runs first;
    default 0) and ``max_attempts`` (1-1000, default 5).

    **Timing**: ``run_at`` (timezone-aware) or ``delay`` (seconds or a timedelta, counted on the
    database clock) schedules the job for later; with neither it is available at once. A job
    not started by ``expires_at``, or ``expires_in`` seconds after its enqueue (on the database
    clock), never starts: it ends ``expired``. Each pair is mutually exclusive.

    **Keys** (see docs/guides/keys.md): with an ``idempotency_key`` already used by a stored job,
    nothing is stored and the result carries that job's id with ``duplicate=True``. A
    ``unique_key`` conflicts with the job that holds it: by default from its enqueue until it
    finishes (``unique_states`` without ``"running"``: until it starts), and for
    ``unique_window`` seconds after the first one whatever its state. On a conflict the result
    says ``duplicate=True`` with the holder's id, and ``on_conflict`` decides: ``"keep"`` (the
    default) stores nothing, ``"replace"`` gives a holder that has not started this job's
    payload, priority and run-at, a :class:`~miniqueue.Debounce` its payload and a later run-at
    (``replaced=True``). Jobs of one ``sequence_key`` run one at a time, in enqueue order;
    ``on_failure`` says whether a failed or dead one blocks the key (``"block"``, the default) or
    the next runs (``"continue"``).

    **Limits** (see docs/guides/limits.md), enforced across every worker: with a
    ``concurrency_key``, at most ``max_concurrent`` (default 1) jobs of the task with that key
    run at once; with a ``rate_limit`` (``"100/s"``, ``"30/min"``, ``"1000/h"``), at most that
    many jobs of the task start, per task or, with a ``rate_limit_key``, per key, each taking
    ``rate_cost`` tokens from the limit's bucket (default 1; at most the bucket's size, the
    limit's jobs per second but at least 1).

    **Dependencies** (see docs/guides/results.md): ``depends_on`` names jobs that must complete
    first: the job is ``waiting`` until the last of them completes (released in that
    completion's transaction), and is cancelled, with an error naming the parent, if one of
    them ends failed, dead, cancelled or expired. Its handler reads their results as
    ``job.parent_results``. Every id must name a job that exists and has not ended without
    completing, else InvalidInput (nothing stored). With ``allow_failure=True`` the job runs
    once every parent finished, however it ended (a parent that ended already counts as
    finished), and reads how each did in ``job.parent_outcomes``.

    **Fair share** (see docs/guides/fairness.md): a job with a ``fair_key`` (and every job of a
    fair queue, or of a task that declares ``fair_by="key"``, whose fair key is then its
    ``concurrency_key`` unless given) takes its turn among its queue's fair jobs round-robin by
    key, each key's jobs in their order, weighted by the key's weight.
    """

    # Placement
    queue: str | None
    priority: int | None
    max_attempts: int | None
    # Timing
    run_at: dt.datetime | None
    delay: float | dt.timedelta | None
    expires_in: float | dt.timedelta | None
    expires_at: dt.datetime | None
    # Keys
    idempotency_key: str | None
    unique_key: str | None
    unique_states: Collection[str] | None
    unique_window: float | dt.timedelta | None
    on_conflict: str | Debounce | None
    sequence_key: str | None
    on_failure: str | None
    # Limits
    concurrency_key: str | None
    max_concurrent: int | None
    rate_limit: str | None
    rate_limit_key: str | None
    rate_cost: int | None
    # Dependencies
    depends_on: Sequence[int] | None
    allow_failure: bool
    # Fair share
    fair_key: str | None


#: Every option's name: a TypedDict checks nothing at run time, so a call's keywords are checked
#: against these.
OPTION_NAMES = frozenset(JobOptions.__annotations__)


def check_options(options: Mapping[str, object], error: Callable[[str], Exception] = TypeError) -> None:
    """Raise ``error`` for keywords that are no job option (a misspelt one: mypy reports it where
    the call is written, this where it runs), naming them and every option."""
    unknown = options.keys() - OPTION_NAMES
    if unknown:
        raise error(f"unknown enqueue options {sorted(unknown)}: use {', '.join(sorted(OPTION_NAMES))}")


def job_spec(task: str, payload: Any, options: JobOptions) -> JobSpec:
    """The job that ``enqueue(task, payload, **options)`` asks for (TypeError for an unknown option)."""
    check_options(options)
    return JobSpec(task, payload, **options)
