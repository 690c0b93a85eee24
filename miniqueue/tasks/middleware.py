"""Middleware: an app's own code around each enqueue through the app and each run of its jobs.

A middleware is an object with an ``enqueue`` hook, a ``run`` hook, or both: subclass
:class:`Middleware`, override what you need, and register it with :meth:`App.middleware
<miniqueue.App.middleware>`. Each hook is a generator, like a ``contextlib.contextmanager``
function: the code before its ``yield`` runs before the step, the ``yield`` is the step, and
the code after it sees how the step went (its result is sent in; its exception is raised at the
``yield``). A generator rather than a ``call_next`` function, because one definition then
serves the sync and the async side alike (``App.enqueue`` and ``App.aenqueue``, ``def`` and
``async def`` handlers: a ``def`` hook around a coroutine would time its creation), and wraps
each job of a chain or a group that is stored in one statement's transaction.

The middleware registered first is the one nearest the database, on both sides::

    caller -> mN -> ... -> m1 -> database -> m1 -> ... -> mN -> handler

so a middleware that changes how payloads are stored (encryption) is registered first: it
encrypts after every other middleware changed the payload, and decrypts before any other
reads it. Around a run, the first registered is the outermost.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Collection, Generator, Sequence
from typing import Any, NoReturn, Protocol, TypeVar

from ..core.errors import ConfigError, LeaseLost
from ..core.records import EnqueueResult, GroupResult, JobSpec
from .batch import each_outcome
from .job import Job, Snooze

#: What an ``enqueue`` hook returns: it yields the job's spec (changed or not) once, and is
#: sent the :class:`~miniqueue.EnqueueResult`.
EnqueueHook = Generator[JobSpec, EnqueueResult, None]
#: What a ``run`` hook returns: it yields once, is sent the handler's result, and returns the
#: job's result (``return (yield)`` keeps the handler's).
RunHook = Generator[None, Any, Any]

R = TypeVar("R")
#: How a run went, after its hooks: its result, or the error it ended with (None: none).
Outcome = tuple[Any, BaseException | None]


class Middleware(Protocol):
    """Code that runs around each enqueue through an app and each run of its jobs.

    Subclass it and override :meth:`enqueue`, :meth:`run` or both (the defaults pass the job
    through unchanged, and cost nothing: a hook left as it is never runs). Hooks run on the
    caller's thread (enqueue) and on the handler's thread or event loop (run): they must not
    block. See :mod:`miniqueue.tasks.middleware` for the order of several.
    """

    def enqueue(self, spec: JobSpec) -> EnqueueHook:
        """Around the enqueue of one job: ``result = yield spec`` stores ``spec`` (yield a
        changed one, ``spec._replace(payload=...)``, to store that) and returns its result.

        It runs before the spec is validated, on the caller's side of ``conn=`` (its
        transaction, when the caller passes one): raising before the yield stores nothing. An
        error storing the job is raised at the yield; a hook cannot swallow it (the caller gets
        it, or what the hook raises instead). Code after the yield runs once the job is
        stored (committed, unless the caller's transaction is still open)."""
        yield spec

    def run(self, job: Job) -> RunHook:
        """Around each run of a job's handler: ``result = yield`` runs the handler (and the
        middleware registered after this one); the hook returns the job's result.

        The code before the yield may read or change ``job`` (``job.payload``), and raising
        there fails the attempt without running the handler (returning there skips it: the
        job completes with what it returns). What the handler raised is raised at the
        yield: re-raise it (or raise another) to fail the attempt, or return a result to
        complete the job instead. A :class:`~miniqueue.Snooze`, a durable sleep or wait, a
        lost lease and a cancelled ``async def`` handler stay what they are whatever the
        hook returns: only an ``Exception`` that fails the attempt can be turned into a
        completion."""
        return (yield)


class MiddlewareStack:
    """An app's middleware in the order of registration, and the runs of their hooks."""

    def __init__(self) -> None:
        self.middlewares: list[Middleware] = []
        # The middleware whose hook of each side is its own, in the order the hooks are entered
        # (an enqueue's from the caller's side, a run's from the outermost): a default does nothing.
        self._enqueue_hooks: list[Middleware] = []
        self._run_hooks: list[Middleware] = []

    def add(self, middleware: Middleware) -> None:
        """Register ``middleware``: the farthest from the database so far (the first to see an
        enqueue's spec, the innermost around a run), or ConfigError if it is not one."""
        for hook in ("enqueue", "run"):
            _check_hook(middleware, hook)
        if middleware in self.middlewares:
            raise ConfigError(f"middleware {_name(middleware)} is registered twice")
        self.middlewares.append(middleware)
        if _overrides(middleware, "enqueue"):
            self._enqueue_hooks.insert(0, middleware)
        if _overrides(middleware, "run"):
            self._run_hooks.append(middleware)

    # -- around an enqueue -----------------------------------------------------------------------

    def enqueue(
        self, specs: Sequence[JobSpec], store: Callable[[list[JobSpec]], R], results: Callable[[R], list[EnqueueResult]]
    ) -> R:
        """``store(specs)``, each spec through the enqueue hooks first; ``results`` gives each
        spec's result, in order, from what ``store`` returned."""
        if not self._enqueue_hooks:
            return store(list(specs))
        entered = _enter_each(self._enqueue_hooks, specs)
        try:
            stored = store([job.spec for job in entered])
        except BaseException as exc:
            _fail_each(entered, exc)
        _finish_each(entered, results(stored))
        return stored

    async def aenqueue(
        self,
        specs: Sequence[JobSpec],
        store: Callable[[list[JobSpec]], Awaitable[R]],
        results: Callable[[R], list[EnqueueResult]],
    ) -> R:
        """:meth:`enqueue` with a ``store`` that is awaited."""
        if not self._enqueue_hooks:
            return await store(list(specs))
        entered = _enter_each(self._enqueue_hooks, specs)
        try:
            stored = await store([job.spec for job in entered])
        except BaseException as exc:
            _fail_each(entered, exc)
        _finish_each(entered, results(stored))
        return stored

    def enqueue_one(self, spec: JobSpec, store: Callable[[JobSpec], EnqueueResult]) -> EnqueueResult:
        """``store(spec)``, the spec through the enqueue hooks first."""
        return self.enqueue([spec], lambda specs: store(specs[0]), _alone)

    async def aenqueue_one(self, spec: JobSpec, store: Callable[[JobSpec], Awaitable[EnqueueResult]]) -> EnqueueResult:
        """:meth:`enqueue_one` with a ``store`` that is awaited."""
        return await self.aenqueue([spec], lambda specs: store(specs[0]), _alone)

    # -- around a run ----------------------------------------------------------------------------

    def run(self, job: Job, handler: Callable[[Job], Any]) -> Any:
        """``handler(job)`` inside the run hooks; what the outermost returns, or what it raises."""
        if not self._run_hooks:
            return handler(job)
        around = _AroundRun(self._run_hooks, job)
        if around.reached:
            try:
                around.result = handler(job)
            except BaseException as exc:  # the hooks see whatever the handler raised
                around.error = exc
        return around.exit()

    async def arun(self, job: Job, handler: Callable[[Job], Awaitable[Any]]) -> Any:
        """:meth:`run` with an ``async def`` handler."""
        if not self._run_hooks:
            return await handler(job)
        around = _AroundRun(self._run_hooks, job)
        if around.reached:
            try:
                around.result = await handler(job)
            except BaseException as exc:
                around.error = exc
        return around.exit()

    def run_batch(self, jobs: list[Job], handler: Callable[[list[Job]], Any]) -> dict[int, Outcome]:
        """A batch handler inside each of its jobs' run hooks: every job's hooks are entered,
        the handler runs once on the jobs whose hooks all reached it, and each job's hooks see
        that job's own outcome (its value in what the handler returned, or what the handler
        raised). Each job's result, or error, after its hooks."""
        arounds = {job.id: _AroundRun(self._run_hooks, job) for job in jobs}
        reached = [job for job in jobs if arounds[job.id].reached]
        if reached:
            try:
                outcomes = each_outcome(reached, handler(reached))
            except BaseException as exc:  # what the handler raises is every job's outcome
                outcomes = {job.id: (None, exc) for job in reached}
            for job_id, (result, error) in outcomes.items():
                arounds[job_id].result, arounds[job_id].error = result, error
        return {job_id: around.outcome() for job_id, around in arounds.items()}

    async def arun_batch(self, jobs: list[Job], handler: Callable[[list[Job]], Awaitable[Any]]) -> dict[int, Outcome]:
        """:meth:`run_batch` with an ``async def`` batch handler."""
        arounds = {job.id: _AroundRun(self._run_hooks, job) for job in jobs}
        reached = [job for job in jobs if arounds[job.id].reached]
        if reached:
            try:
                outcomes = each_outcome(reached, await handler(reached))
            except BaseException as exc:  # cancelled (a stop request) too
                outcomes = {job.id: (None, exc) for job in reached}
            for job_id, (result, error) in outcomes.items():
                arounds[job_id].result, arounds[job_id].error = result, error
        return {job_id: around.outcome() for job_id, around in arounds.items()}


def group_results(callbacks: Collection[str]) -> Callable[[GroupResult], list[EnqueueResult]]:
    """How to read a group's results in the order of its members, then of ``callbacks`` (roles)."""

    def results(group: GroupResult) -> list[EnqueueResult]:
        fields = {"then": group.on_success, "on_success": group.on_success}
        fields.update(on_complete=group.on_complete, on_failure=group.on_failure)
        return [*group.members, *(result for role in callbacks if (result := fields.get(role)) is not None)]

    return results


def _check_hook(middleware: Middleware, hook: str) -> None:
    """A hook must be a generator function (a plain function, or an ``async def`` one, would fail
    every enqueue or run with a puzzling error: refuse it when it is registered)."""
    method = getattr(middleware, hook, None)
    if method is None:
        raise ConfigError(f"{middleware!r} is not a middleware: it has no {hook} hook (subclass miniqueue.Middleware)")
    if not inspect.isgeneratorfunction(method):
        raise ConfigError(
            f"middleware {_name(middleware)}: its {hook} hook is not a generator: write it with one "
            "'yield' where the step runs ('def', not 'async def': one hook serves sync and async alike)"
        )


def _overrides(middleware: Middleware, hook: str) -> bool:
    """Whether ``middleware``'s ``hook`` is its own (a Middleware subclass may leave one as is)."""
    return getattr(type(middleware), hook, None) is not getattr(Middleware, hook)


def _name(middleware: Middleware) -> str:
    return type(middleware).__qualname__


class _Enqueuing:
    """One job's enqueue hooks, entered from the caller's side in; ``spec`` is what the last yielded."""

    def __init__(self, hooks: Sequence[Middleware], spec: JobSpec) -> None:
        self.spec = spec
        self.entered: list[EnqueueHook] = []
        for middleware in hooks:
            hook = middleware.enqueue(self.spec)
            try:
                yielded = next(hook)
            except StopIteration:
                self.fail(ConfigError(f"middleware {_name(middleware)}: its enqueue hook returned without yielding"))
            except BaseException as exc:
                self.fail(exc)
            if not isinstance(yielded, JobSpec):
                hook.close()
                self.fail(
                    ConfigError(
                        f"middleware {_name(middleware)}: its enqueue hook yielded {type(yielded).__name__}, "
                        "not a JobSpec (yield the spec, or spec._replace(...))"
                    )
                )
            self.entered.append(hook)
            self.spec = yielded

    def exit(self, outcome: EnqueueResult | BaseException) -> BaseException | None:
        """Resume the entered hooks from the inside out with the job's result or the error
        storing it; the error they end with, if any."""
        error = outcome if isinstance(outcome, BaseException) else None
        for hook in reversed(self.entered):
            error = _resume_enqueue(hook, outcome if error is None else error)
        self.entered = []
        return error

    def fail(self, error: BaseException) -> NoReturn:
        raise self.exit(error) or error


def _resume_enqueue(hook: EnqueueHook, outcome: EnqueueResult | BaseException) -> BaseException | None:
    """Send the result (or throw the error) into a hook waiting at its yield; the error after it."""
    error = outcome if isinstance(outcome, BaseException) else None
    try:
        if isinstance(outcome, BaseException):
            hook.throw(outcome)
        else:
            hook.send(outcome)
    except StopIteration:
        return error  # a hook cannot swallow an error: there is no result to give the caller
    except BaseException as raised:
        return raised
    hook.close()
    return ConfigError("a middleware's enqueue hook yielded twice: yield the spec once")


def _enter_each(hooks: Sequence[Middleware], specs: Sequence[JobSpec]) -> list[_Enqueuing]:
    """Each spec through the enqueue hooks; if one fails, those entered before it see its error."""
    entered: list[_Enqueuing] = []
    for spec in specs:
        try:
            entered.append(_Enqueuing(hooks, spec))
        except BaseException as exc:
            _fail_each(entered, exc)
    return entered


def _finish_each(entered: Sequence[_Enqueuing], results: Sequence[EnqueueResult]) -> None:
    """Resume each job's hooks with its result; raise the first error one of them raises."""
    errors = [job.exit(result) for job, result in zip(entered, results, strict=True)]
    raised = next((e for e in errors if e is not None), None)
    if raised is not None:
        raise raised


def _fail_each(entered: Sequence[_Enqueuing], error: BaseException) -> NoReturn:
    """Resume each job's hooks with ``error``; raise it, or the first error a hook raised instead."""
    errors = [job.exit(error) for job in entered]
    raise next((e for e in errors if e is not error and e is not None), error)


class _AroundRun:
    """One run's hooks, entered from the outermost in; ``reached`` says whether the handler runs."""

    def __init__(self, hooks: Sequence[Middleware], job: Job) -> None:
        self.entered: list[RunHook] = []
        self.result: Any = None
        self.error: BaseException | None = None
        self.reached = False
        for middleware in hooks:
            hook = middleware.run(job)
            try:
                next(hook)
            except StopIteration as stop:  # returned before its yield: the handler does not run
                self.result = stop.value
                return
            except BaseException as exc:
                self.error = exc
                return
            self.entered.append(hook)
        self.reached = True

    def exit(self) -> Any:
        """Resume the entered hooks from the inside out; return the result, or raise the error."""
        result, error = self.outcome()
        if error is not None:
            raise error
        return result

    def outcome(self) -> Outcome:
        """Resume the entered hooks from the inside out; the result and the error after them."""
        result, error = self.result, self.error
        for hook in reversed(self.entered):
            result, error = _resume_run(hook, result, error)
        return result, error


def _resume_run(hook: RunHook, result: Any, error: BaseException | None) -> tuple[Any, BaseException | None]:
    """Send ``result`` (or throw ``error``) into a hook waiting at its yield; the result or error after it."""
    try:
        if error is None:
            hook.send(result)
        else:
            hook.throw(error)
    except StopIteration as stop:
        if error is not None and not _swallowable(error):
            return None, error
        return stop.value, None
    except BaseException as raised:
        return None, raised
    hook.close()
    return None, ConfigError("a middleware's run hook yielded twice: yield once, where the handler runs")


def _swallowable(error: BaseException) -> bool:
    """Whether a run hook may turn ``error`` into a completion: an exception that fails the
    attempt, not a signal that the job goes back (a snooze, a lost lease) or that the run
    must end (a durable sleep or wait, a cancellation: BaseExceptions)."""
    return isinstance(error, Exception) and not isinstance(error, (Snooze, LeaseLost))


def _alone(result: EnqueueResult) -> list[EnqueueResult]:
    return [result]
