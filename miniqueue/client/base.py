"""What :class:`~miniqueue.Client` and :class:`~miniqueue.AsyncClient` do, defined once as
:mod:`steps <miniqueue.core.steps>`: validation first, then the store's statements, row mapping
and the logic between them (declarations filling what a caller left unset, batches, chains and
groups), with no I/O. Each client only borrows a connection and runs the steps on it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ..core.causes import diagnose
from ..core.diagnosis import Diagnosis
from ..core.errors import InvalidInput
from ..core.fairness import KeyRule, check_rule, fair_spec
from ..core.keys import check_key
from ..core.limits import check_limit
from ..core.records import (
    DEFAULT_QUEUE,
    EnqueueResult,
    GroupResult,
    JobRecord,
    JobSpec,
    QueueStats,
    State,
    TaskDeclaration,
)
from ..core.steps import Steps, atomic
from ..core.validation import (
    JOB_ID_RANGE,
    NewJob,
    check_depends_on,
    check_int_range,
    check_job_ids,
    check_queue_name,
    check_schedule_name,
    check_seconds,
    check_task_name,
    declared,
    encode_value,
    validate,
    validate_each,
)
from ..observability import tracing
from ..store.store import Store
from .inspection import check_filters
from .results import result_steps

if TYPE_CHECKING:
    from ..tasks.app import App


log = logging.getLogger("miniqueue.client")

T = TypeVar("T")


class Declared(NamedTuple):
    """Jobs with their options filled, and the tasks of those that went to the default queue
    because no app declared them."""

    specs: list[JobSpec]
    undeclared: set[str]


#: How long a client trusts the task declarations it read: a declaration a deploy changed reaches
#: producers this many seconds after the first worker of the new code starts, at most.
DECLARATIONS_TTL = 5.0
#: How soon a client reads them again for a task not among them (a worker may just have started).
UNDECLARED_TTL = 1.0

#: How many known names an "unknown queue" error lists.
_KNOWN_SHOWN = 20


class BaseClient:
    """What :class:`Client` and :class:`~miniqueue.AsyncClient` share: the settings, and each
    call as steps to run on a connection of either kind.

    Each ``_x_steps`` method checks its input at once (bad input raises InvalidInput before a
    connection is borrowed) and returns the steps, which a client runs with its executor.
    """

    def __init__(self, *, schema: str, max_payload_bytes: int, notify: bool) -> None:
        self.store = Store(schema)
        self.max_payload_bytes = max_payload_bytes
        self.notify = notify
        # OpenTelemetry (miniqueue.tracing): None when off or not installed.
        self._tracing = tracing.current()
        # The task declarations last read (see _declarations_steps), and when (monotonic).
        self._declarations: dict[str, TaskDeclaration] = {}
        self._declarations_read_at = float("-inf")
        # The queues whose every job is fair, read with the declarations.
        self._fair_queues: frozenset[str] = frozenset()
        self._undeclared_warned: set[str] = set()

    def _declarations_steps(self, tasks: Iterable[str]) -> Steps[dict[str, TaskDeclaration]]:
        """The task declarations the apps' workers published, read again once they are
        DECLARATIONS_TTL old, or UNDECLARED_TTL old when one of ``tasks`` is not among them
        (a worker that just started may have published it)."""
        fresh = self.fresh_declarations(tasks)
        if fresh is not None:
            return fresh
        read_at = time.monotonic()
        self._declarations = yield from self.store.task_declarations_steps()
        self._fair_queues = yield from self.store.fair_queues_steps()
        self._declarations_read_at = read_at
        return self._declarations

    def fresh_declarations(self, tasks: Iterable[str]) -> dict[str, TaskDeclaration] | None:
        """The task declarations last read, if they need not be read again for ``tasks`` yet
        (see :meth:`_declarations_steps`), else None: a caller that needs no connection for
        them borrows none."""
        age = time.monotonic() - self._declarations_read_at
        missing = any(task not in self._declarations for task in tasks)
        if age >= DECLARATIONS_TTL or (missing and age >= UNDECLARED_TTL):
            return None
        return self._declarations

    def stale_declarations(self) -> dict[str, TaskDeclaration]:
        """The task declarations last read, however old (routing past a database that is down)."""
        return self._declarations

    def _declared_steps(self, specs: Sequence[JobSpec], what: str = "job") -> Steps[Declared]:
        """``specs`` with what their callers left unset filled from their tasks' declarations
        (see :func:`~miniqueue.core.validation.declared`), and the tasks of those that went to the
        default queue for want of one; a batch's error names the job (``what``) by index."""
        declarations = yield from self._declarations_steps({spec.task for spec in specs})
        filled = []
        undeclared = set()
        for index, spec in enumerate(specs):
            declaration = declarations.get(spec.task)
            if declaration is None and spec.queue is None:
                undeclared.add(spec.task)
            try:
                filled.append(self._fair(declared(spec, declaration), declaration))
            except InvalidInput as exc:
                message = f"{what} {index}: {exc}" if len(specs) > 1 else str(exc)
                raise InvalidInput(message, arguments=exc.arguments) from exc
        return Declared(filled, undeclared)

    def _fair(self, spec: JobSpec, declaration: TaskDeclaration | None) -> JobSpec:
        """``spec`` (options filled) with its fair key, if it is fair (see docs/guides/fairness.md)."""
        keys = None if declaration is None else declaration.keys
        fair_by = None if keys is None else keys.fair_by
        return fair_spec(spec, fair_by=fair_by, fair_queue=spec.queue in self._fair_queues)

    def _ranked_steps(self, specs: Sequence[JobSpec], stored: Steps[list[EnqueueResult]]) -> Steps[list[EnqueueResult]]:
        """``stored`` (the jobs ``specs``, options filled), then the fair ones it inserted given
        their turns: to run in one transaction, so that no worker sees one without its turn."""
        results = yield from stored
        pairs = zip(specs, results, strict=True)
        fresh = [(r.id, s.fair_key) for s, r in pairs if s.fair_key is not None and not r.duplicate]
        yield from self.store.rank_fair_steps([job_id for job_id, _ in fresh], [key for _, key in fresh])
        return results

    def _declare_steps(self, app: App) -> Steps[None]:
        declarations = app.declarations()
        yield from atomic(self.store.publish_tasks_steps(declarations))
        self._declarations = {**self._declarations, **{d.task: d for d in declarations}}

    def _queue_stats_steps(self, check_served: bool) -> Steps[list[QueueStats]]:
        stats = yield from self.store.queue_stats_steps()
        if not check_served:
            return stats
        names = [q.queue for q in stats]
        unserved = set((yield from self.store.unserved_queues_steps(names)))
        unrun = yield from self.store.unrun_tasks_steps([q.queue for q in stats if q.counts[State.AVAILABLE]])
        return [
            dataclasses.replace(q, served=q.queue not in unserved, unrun_task=unrun.get(q.queue))
            if q.queue in unserved or q.queue in unrun
            else q
            for q in stats
        ]

    def _declares_steps(self, task: str) -> Steps[bool]:
        declarations = yield from self._declarations_steps({task})
        return task in declarations

    def _warn_undeclared(self, tasks: Iterable[str]) -> None:
        """Say once per task (and client) that a job went to the default queue because no app
        has declared its task here: a job no worker may ever serve is not left in silence."""
        for task in sorted(set(tasks) - self._undeclared_warned):
            self._undeclared_warned.add(task)
            log.warning(
                "task %r is declared by no app whose worker has run on this database: its jobs go to queue %r "
                "with the default options unless the caller names them (start a worker of the app once, or give its "
                'jobs a queue; see "Tasks and their options" in docs/guides/tasks.md)',
                task,
                DEFAULT_QUEUE,
            )

    def _producing_steps(
        self,
        specs: Sequence[JobSpec],
        store: Callable[[list[JobSpec], str | None], Steps[T]],
        *,
        what: str = "job",
        batch: bool = False,
    ) -> Steps[T]:
        """The one pass of every enqueue: ``specs`` filled from their tasks' declarations, then
        ``store(filled, trace_context)`` inside a producer span when tracing is on (one span for
        the call, whose context every job stores: see :mod:`miniqueue.tracing`), on the one
        connection the steps run on; a task no app declared is said once, after."""
        filled, undeclared = yield from self._declared_steps(specs, what)
        if self._tracing is None:
            result = yield from store(filled, None)
        else:
            with self._tracing.sending(filled, batch=batch) as send:
                result = send.sent((yield from store(filled, send.context)))
        self._warn_undeclared(undeclared)
        return result

    def _enqueue_steps(self, spec: JobSpec) -> Steps[EnqueueResult]:
        """Enqueue one job."""
        check_task_name(spec.task)
        return self._producing_steps([spec], lambda filled, context: self._store_one_steps(filled[0], context))

    def _store_one_steps(
        self, spec: JobSpec, trace_context: str | None, run_when: str | None = None
    ) -> Steps[EnqueueResult]:
        """Store one job whose options are all filled (``run_when``: see
        :meth:`~miniqueue.store.store.Store.enqueue_waiting_steps`; ``allow_failure`` is
        ``"finished"``), given its turn if it is fair."""
        if spec.fair_key is None:
            return (yield from self._insert_one_steps(spec, trace_context, run_when))
        (result,) = yield from atomic(
            self._ranked_steps([spec], _listed(self._insert_one_steps(spec, trace_context, run_when)))
        )
        return result

    def _insert_one_steps(self, spec: JobSpec, trace_context: str | None, run_when: str | None) -> Steps[EnqueueResult]:
        """Store one job whose options are all filled (see :meth:`_store_one_steps`)."""
        job = validate(spec, max_payload_bytes=self.max_payload_bytes)
        parents = check_depends_on(spec.depends_on)
        if parents is not None and (job.keys.unique_key is not None or job.keys.sequence_key is not None):
            raise InvalidInput(_KEYS_WITH_PARENTS)
        if parents is None:
            return (yield from self.store.enqueue_steps(job, notify=self.notify, trace_context=trace_context))
        when = run_when or ("finished" if spec.allow_failure else None)
        return (
            yield from self.store.enqueue_waiting_steps(
                job, parents, notify=self.notify, trace_context=trace_context, run_when=when
            )
        )

    def _enqueue_many_steps(self, jobs: Iterable[JobSpec]) -> Steps[list[EnqueueResult]]:
        """Enqueue many jobs in one transaction."""
        specs = list(jobs)
        _check_task_names(specs, "job")
        return self._producing_steps(specs, self._store_many_steps, batch=True)

    def _store_many_steps(self, specs: list[JobSpec], trace_context: str | None) -> Steps[list[EnqueueResult]]:
        """Store jobs whose options are all filled, in one transaction, the fair ones given their turns."""
        if any(s.depends_on is not None or _one_by_one(s) for s in specs):
            return (yield from self._enqueue_each_steps(specs, trace_context))
        if all(s.fair_key is None for s in specs):
            return (yield from self._insert_many_steps(specs, trace_context))
        return (yield from atomic(self._ranked_steps(specs, self._insert_many_steps(specs, trace_context))))

    def _insert_many_steps(self, specs: list[JobSpec], trace_context: str | None) -> Steps[list[EnqueueResult]]:
        """Store jobs whose options are all filled and that need no one-by-one enqueue, in one transaction."""
        checked = validate_each(specs, max_payload_bytes=self.max_payload_bytes)
        if len(specs) >= self.store.copy_threshold and all(_plain(s) for s in specs):
            # Each job is checked as the COPY streams it, so the checks overlap the server's
            # inserts; an invalid one aborts the COPY, and nothing is stored.
            scheduled = any(s.run_at is not None or s.delay is not None for s in specs)
            return (
                yield from self.store.copy_many_steps(
                    len(specs), checked, scheduled=scheduled, notify=self.notify, trace_context=trace_context
                )
            )
        if len(specs) >= self.store.copy_threshold and all(_plain(s) or _copyable(s) for s in specs):
            # As above, and a held key makes the store fall back on the batch statement.
            def by_statement(jobs: list[NewJob]) -> Steps[list[EnqueueResult]]:
                return self.store.enqueue_many_steps(jobs, notify=self.notify, trace_context=trace_context)

            due = trace_context is None and all(_due_and_held_while_running(s) for s in specs)
            return (
                yield from self.store.copy_keyed_steps(
                    len(specs), checked, by_statement, due=due, notify=self.notify, trace_context=trace_context
                )
            )
        return (
            yield from self.store.enqueue_many_steps(list(checked), notify=self.notify, trace_context=trace_context)
        )

    def _enqueue_each_steps(self, specs: Sequence[JobSpec], trace_context: str | None) -> Steps[list[EnqueueResult]]:
        """A batch with dependencies (options filled): each job by the one-by-one path, in one transaction."""
        self._check_all(specs, "job")
        return (yield from atomic(_each_indexed([self._store_one_steps(spec, trace_context) for spec in specs])))

    def _check_all(self, specs: Sequence[JobSpec], what: str) -> None:
        """Check every job (options filled) before any is stored; an error names the ``what`` by index."""
        for index, spec in enumerate(specs):
            try:
                job = validate(spec, max_payload_bytes=self.max_payload_bytes)
                parents = check_depends_on(spec.depends_on)
                if parents is not None and (job.keys.unique_key is not None or job.keys.sequence_key is not None):
                    raise InvalidInput(_KEYS_WITH_PARENTS)
            except InvalidInput as exc:
                raise InvalidInput(f"{what} {index}: {exc}", arguments=exc.arguments) from exc

    def _chain_steps(self, steps: Sequence[JobSpec]) -> Steps[list[EnqueueResult]]:
        if not steps:
            raise InvalidInput("a chain needs at least one step")
        _check_task_names(steps, "step")
        return atomic(self._producing_steps(steps, self._store_chain_steps, what="step", batch=True))

    def _store_chain_steps(self, filled: list[JobSpec], trace_context: str | None) -> Steps[list[EnqueueResult]]:
        """Store a chain's steps (options filled), each waiting for the one before it."""
        self._check_all(filled, "step")
        for index, step in enumerate(filled[1:], start=1):  # each step after the first waits for the one before
            if step.unique_key is not None or step.sequence_key is not None:
                raise InvalidInput(f"step {index}: {_KEYS_WITH_PARENTS}")
        results: list[EnqueueResult] = []
        for step in filled:
            before = [results[-1].id] if results else []
            parents = [*before, *(step.depends_on or ())]
            results.append((yield from self._store_one_steps(step._replace(depends_on=parents or None), trace_context)))
        return results

    def _group_steps(self, members: Sequence[JobSpec], callbacks: dict[str, JobSpec | None]) -> Steps[GroupResult]:
        if not members:
            raise InvalidInput("a group needs at least one member")
        given = {role: spec for role, spec in callbacks.items() if spec is not None}
        if not given:
            raise InvalidInput("a group needs a callback: then (on_success), on_complete or on_failure")
        _check_task_names(members, "job")
        for spec in given.values():
            check_task_name(spec.task)
        roles, count = list(given), len(members)

        def store(filled: list[JobSpec], trace_context: str | None) -> Steps[GroupResult]:
            callbacks = dict(zip(roles, filled[count:], strict=True))
            return self._store_group_steps(filled[:count], callbacks, trace_context)

        return atomic(self._producing_steps([*members, *given.values()], store, batch=True))

    def _store_group_steps(
        self, members: list[JobSpec], callbacks: dict[str, JobSpec], trace_context: str | None
    ) -> Steps[GroupResult]:
        """Store a group's members, then its callbacks (options filled), each callback waiting for
        every member."""
        enqueued = yield from self._store_many_steps(members, trace_context)
        stored: dict[str, EnqueueResult] = {}
        for role, spec in callbacks.items():
            parents = [*dict.fromkeys(r.id for r in enqueued), *(spec.depends_on or ())]
            stored[role] = yield from self._store_one_steps(
                spec._replace(depends_on=parents), trace_context, _GROUP_RUN_WHEN[role]
            )
        return GroupResult(
            members=enqueued,
            on_success=stored.get("then"),
            on_complete=stored.get("on_complete"),
            on_failure=stored.get("on_failure"),
        )

    def _why_steps(self, job_id: int) -> Steps[Diagnosis]:
        """The diagnosis of job ``job_id`` (the id checked first: InvalidInput)."""
        (checked,) = check_job_ids([job_id])
        facts = yield from self.store.why_steps(checked)
        return diagnose(facts)

    def _result_steps(self, job_id: int) -> Steps[Any]:
        return result_steps(self.store, check_int_range("job id", job_id, JOB_ID_RANGE))

    def _limit_queue_steps(self, name: str, max_running: int | None, create: bool) -> Steps[None]:
        queue = check_queue_name(name)
        if max_running is not None:
            check_limit("max_running", max_running)
        return atomic(self._limit_queue_in_one(queue, max_running, create))

    def _limit_queue_in_one(self, queue: str, max_running: int | None, create: bool) -> Steps[None]:
        if not create:
            yield from self._check_known_queues([queue])
        yield from self.store.set_queue_limit_steps(queue, max_running)

    def _fair_queue_steps(self, name: str, fair: bool, create: bool) -> Steps[int]:
        queue = check_queue_name(name)
        return atomic(self._fair_queue_in_one(queue, fair, create))

    def _fair_queue_in_one(self, queue: str, fair: bool, create: bool) -> Steps[int]:
        if not create:
            yield from self._check_known_queues([queue])
        ranked = yield from self.store.set_queue_fair_steps(queue, fair)
        self._declarations_read_at = float("-inf")  # this client's next enqueue reads the fair queues again
        return ranked

    def _set_key_rule_steps(
        self, pattern: str, limit: int | None, weight: float | None, every_key: bool
    ) -> Steps[KeyRule]:
        rule = check_rule(pattern, limit, weight, every_key=every_key)
        yield from atomic(self.store.set_key_rule_steps(rule))
        return rule

    def _remove_key_rule_steps(self, pattern: str) -> Steps[bool]:
        return atomic(self.store.remove_key_rule_steps(pattern))

    def _signal_steps(self, signals: Iterable[tuple[str, Any]]) -> Steps[list[int | None]]:
        keys, data = [], []
        for key, value in signals:
            keys.append(check_key("signal key", key))
            data.append(encode_value(f"the data of signal {key!r}", value, max_bytes=self.max_payload_bytes))
        return self.store.signal_steps(keys, data)

    def _release_sequence_steps(self, key: str) -> Steps[tuple[int, int | None]]:
        return self.store.release_sequence_steps(check_key("sequence key", key))

    def _get_steps(self, job_id: int) -> Steps[JobRecord]:
        return self.store.get_steps(check_int_range("job id", job_id, JOB_ID_RANGE))

    def _list_jobs_steps(self, before_id: int | None, limit: int, filters: dict[str, Any]) -> Steps[list[JobRecord]]:
        check_filters(before_id=before_id, **filters)
        return self.store.list_jobs_steps(before_id=before_id, limit=limit, **filters)

    def _prune_steps(self, states: Iterable[State], older_than_seconds: float, batch_size: int) -> Steps[int]:
        chosen = list(states)
        deleted = 0
        while True:
            n = yield from self.store.prune_steps(chosen, older_than_seconds, batch_size)
            deleted += n
            if n < batch_size:
                return deleted

    def _requeue_matching_steps(self, states: Iterable[State], queue: str | None, task: str | None) -> Steps[int]:
        check_filters(queue=queue, task=task)
        return self.store.requeue_matching_steps(states, queue=queue, task=task)

    def _list_queues_steps(self) -> Steps[dict[str, bool]]:
        paused = set((yield from self.store.paused_queues_steps()))
        names = {q.queue for q in (yield from self.store.queue_stats_steps())} | paused
        return {name: name in paused for name in sorted(names)}

    def _set_paused_steps(self, names: Iterable[str], paused: bool, create: bool) -> Steps[list[str]]:
        chosen = list(dict.fromkeys(check_queue_name(name) for name in names))
        if not chosen:
            raise InvalidInput("no queue name given: name at least one queue")
        # One transaction: with one unknown name among several, none is paused. (One name
        # that need not be known is one statement, which needs no transaction of its own.)
        steps = self._set_paused_in_one(chosen, paused, create)
        return steps if create and len(chosen) == 1 else atomic(steps)

    def _set_paused_in_one(self, chosen: list[str], paused: bool, create: bool) -> Steps[list[str]]:
        if not create:
            yield from self._check_known_queues(chosen)
        for name in chosen:
            yield from self.store.set_queue_paused_steps(name, paused)
        return chosen

    def _check_known_queues(self, names: list[str]) -> Steps[None]:
        known = yield from self.store.known_queues_steps(names)
        unknown = [name for name in names if name not in known]
        if not unknown:
            return
        listed = yield from self.store.known_queue_names_steps(limit=_KNOWN_SHOWN + 1)
        shown = ", ".join(listed[:_KNOWN_SHOWN]) + (", ..." if len(listed) > _KNOWN_SHOWN else "")
        which = f"queue {unknown[0]!r} is" if len(unknown) == 1 else f"queues {', '.join(map(repr, unknown))} are"
        raise InvalidInput(
            f"{which} unknown: no job waiting or running, never paused or resumed "
            f"(known: {shown or 'none yet'}); to set a queue before its first job, pass create=True",
            arguments={"create": "True"},
        )

    def _switch_schedule_steps(self, name: str, enabled: bool, app: App | None, create: bool) -> Steps[None]:
        name = check_schedule_name(name)
        defined = set(app.schedules) if app is not None else set()
        steps = self._switch_schedule_in_one(name, enabled, defined, app is not None, create)
        return steps if create else atomic(steps)  # (unchecked, it is one statement)

    def _switch_schedule_in_one(
        self, name: str, enabled: bool, defined: set[str], has_app: bool, create: bool
    ) -> Steps[None]:
        if not create:
            stored = yield from self.store.periodic_state_steps()
            if name not in stored and name not in defined:
                known = ", ".join(sorted({*stored, *defined})) or "none yet"
                hint = "" if has_app else "; a schedule no scheduler has run yet needs the app that defines it"
                raise InvalidInput(f"schedule {name!r} is unknown (known: {known}){hint}")
        yield from self.store.set_periodic_enabled_steps(name, enabled)


def _each_indexed(steps: list[Steps[EnqueueResult]]) -> Steps[list[EnqueueResult]]:
    """Run each job's steps in turn; an error names the job's index in the batch."""
    results = []
    for index, job_steps in enumerate(steps):
        try:
            results.append((yield from job_steps))
        except InvalidInput as exc:  # a parent that does not exist, or ended
            raise InvalidInput(f"job {index}: {exc}", arguments=exc.arguments) from exc
    return results


def _listed(steps: Steps[EnqueueResult]) -> Steps[list[EnqueueResult]]:
    """One job's enqueue, as a list of its result."""
    return [(yield from steps)]


def _check_wait(job_id: int, timeout: float) -> tuple[int, float]:
    """A wait's job id and timeout, checked."""
    return check_int_range("job id", job_id, JOB_ID_RANGE), check_seconds("wait timeout", timeout)


def _plain(spec: JobSpec) -> bool:
    """Whether a job can go by COPY: no idempotency key, no limits, no keys, no deadline."""
    return _unlimited(spec) and spec.unique_key is None and spec.sequence_key is None and _no_deadline(spec)


def _copyable(spec: JobSpec) -> bool:
    """Whether a job's keys can go by COPY (see Store.copy_keyed_steps): unique keys kept on a
    conflict, without a window, and deadlines; no idempotency key, limits or sequence."""
    return (
        _unlimited(spec)
        and spec.sequence_key is None
        and spec.unique_window is None
        and spec.on_conflict in (None, "keep")
    )


def _due_and_held_while_running(spec: JobSpec) -> bool:
    """Whether a job is due at once, without a deadline, and holds its unique key (if any) while it runs."""
    due = spec.run_at is None and spec.delay is None
    return due and _no_deadline(spec) and (spec.unique_states is None or "running" in spec.unique_states)


def _unlimited(spec: JobSpec) -> bool:
    """Whether a job has no idempotency key and no limits (concurrency or rate)."""
    return spec.idempotency_key is None and spec.concurrency_key is None and spec.rate_limit is None


def _no_deadline(spec: JobSpec) -> bool:
    return spec.expires_in is None and spec.expires_at is None


def _one_by_one(spec: JobSpec) -> bool:
    """Whether a job of a batch goes by the one-by-one enqueue (in the batch's transaction, in
    order): a unique key that replaces, debounces or has a window changes or locks what the
    jobs before it in the batch may have stored."""
    return spec.unique_key is not None and (
        spec.unique_window is not None or (spec.on_conflict is not None and spec.on_conflict != "keep")
    )


def group_callbacks(
    then: JobSpec | None, on_success: JobSpec | None, on_complete: JobSpec | None, on_failure: JobSpec | None
) -> dict[str, JobSpec | None]:
    """A group's callbacks by role (``on_success`` is ``then``'s alias: one of the two)."""
    if then is not None and on_success is not None:
        raise InvalidInput("then and on_success name the same callback: give one of them")
    return {"then": then or on_success, "on_complete": on_complete, "on_failure": on_failure}


#: When each of a group's callbacks runs (see Store.enqueue_waiting_steps): ``then`` once every
#: member completed, ``on_complete`` once every member finished, ``on_failure`` once every member
#: finished and one did not complete.
_GROUP_RUN_WHEN: dict[str, str | None] = {"then": None, "on_complete": "finished", "on_failure": "failed"}

_KEYS_WITH_PARENTS = (
    "a job with depends_on cannot have a unique_key or a sequence_key: its turn would depend on two "
    "things at once; give the key to the first job of the chain, or order the jobs with a sequence alone"
)


def _check_task_names(specs: Sequence[JobSpec], what: str) -> None:
    """Each spec's task name, checked before anything is read; an error names the ``what`` by index."""
    for index, spec in enumerate(specs):
        try:
            check_task_name(spec.task)
        except InvalidInput as exc:
            raise InvalidInput(f"{what} {index}: {exc}", arguments=exc.arguments) from exc
