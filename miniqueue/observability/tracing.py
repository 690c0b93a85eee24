"""OpenTelemetry tracing: a span for each enqueue and for each attempt, joined by the trace
context stored with the job.

**Producing.** :meth:`Client.enqueue`, :meth:`Client.enqueue_many`, :meth:`Client.chain` and
:meth:`Client.group` (and their async twins), and so everything built on them (``App.enqueue``,
a transactional enqueue with ``conn=``, the Django and SQLAlchemy integrations), run their
``INSERT`` inside a PRODUCER span named ``send <task>`` (``send`` for a call with several
tasks), in the same pass that fills the jobs' options from their tasks' declarations. That
span's context, as the configured propagator writes it (W3C ``traceparent`` and
``tracestate``, plus baggage if there is some), is stored in the job's ``trace_context``
column. It is a child of whatever span is current where you enqueue, and it
is current during the ``INSERT`` (so an instrumented driver's span nests under it). A batch
gets one span, whose context every job of the batch stores: thousands of per-job spans would
cost a bulk enqueue more than its own ``COPY``.

**Consuming.** Each attempt runs in a CONSUMER span named ``process <task>``, current while
the handler runs (its own spans, and those of instrumented libraries, nest under it), on a
handler thread or in an ``async def`` handler's task alike. Following the messaging semantic
conventions, the span *links* to the stored context (the message's creation context, which a
process span SHOULD link to) and, by default, is also its *child* (which they allow when one
span processes one message): the request that enqueued a job and every attempt of that job
read as one trace. ``enable(as_child=False)`` starts a new trace per attempt instead, linked
only. The span ends once the worker has recorded the outcome (so the outcome is the one the
database holds: a completion rejected because the lease was lost reads ``lease_lost``), with
the end time of the handler's return. A job enqueued without tracing gets a root span.

Spans are named by task (``send <task>``, ``process <task>``) where the conventions' default is
``<operation> <destination>``, which they let a system replace: the task is what a reader looks
for, and it stays low-cardinality (tasks are registered names). The queue is the
``messaging.destination.name`` attribute.

Attributes (``messaging.*`` from the semantic conventions, ``miniqueue.*`` for the rest):

=================================  ===============================================================
``messaging.system``               ``miniqueue``
``messaging.operation.type``       ``send`` (producer) or ``process`` (consumer); so is ``.name``
``messaging.destination.name``     the queue (on a batch, when all its jobs share one)
``messaging.message.id``           the job id, as text (``miniqueue.job.id`` as a number)
``messaging.batch.message_count``  the jobs of an ``enqueue_many`` call
``messaging.client.id``            the worker id (consumer)
``miniqueue.task``                 the task (on a batch, when all its jobs share one)
``miniqueue.duplicate``            true when an idempotency key matched an earlier job (producer)
``miniqueue.attempt``              the attempt number (charged), with ``miniqueue.max_attempts``
                                   (the budget) and ``miniqueue.run`` (every run, charged or not)
``miniqueue.outcome``              ``completed``, ``retried``, ``dead``, ``failed``, ``snoozed``,
                                   ``lease_lost`` or ``cancelled`` (consumer)
``miniqueue.stop_reason``          why the handler was told to stop, if it was
``miniqueue.delay``                seconds until a retried or snoozed job is due again
``error.type``                     the exception's class on a failed attempt (``_OTHER`` without
                                   one, ``miniqueue.LeaseLost`` for a lost lease)
=================================  ===============================================================

A failed attempt (``retried``, ``dead``, ``failed``) and a lost lease set the span's status to
ERROR, and the handler's exception is recorded on it as an event. A job cancelled by an
operator is not an error. A handler abandoned at shutdown ends no span (its job's next attempt
gets one).

**When it is on.** Tracing needs only ``opentelemetry-api`` (``pip install miniqueue[otel]``)
and, like OpenTelemetry's native instrumentations, is on whenever that package is importable:
spans go to the tracer provider the application sets (the SDK's, or ``opentelemetry-instrument``'s),
and nowhere while none is set. What it costs on the hot path:

- without the package: nothing per job; an enqueue checks ``self._tracing is None``;
- with it, and no tracer provider: an enqueue looks up the global provider (under a
  microsecond) and stores nothing; a worker that starts without a provider does not trace
  at all (:func:`worker_hooks` looks once, when the worker is built);
- with a provider: a span per enqueue call and per attempt, as measured in docs/guides/opentelemetry.md.

``MINIQUEUE_TRACING=off`` in the environment, or :func:`disable`, turns it off; :func:`enable`
turns it on, optionally with a tracer provider of its own instead of the global one. A client
takes the setting in force when it is created, a worker when it is built: whoever builds one
applies :func:`worker_hooks` (the supervisor's worker processes and the testing kit's runner do).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
import os
import time
from collections.abc import Sequence
from contextvars import Token
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from ..core.errors import ConfigError

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import (
        Link,
        NoOpTracerProvider,
        ProxyTracerProvider,
        Span,
        SpanKind,
        Status,
        StatusCode,
        TracerProvider,
    )

    HAVE_API = True
except ImportError:  # the otel extra is not installed: tracing stays off, for the cost of this attempt
    HAVE_API = False

if TYPE_CHECKING:
    from ..core.records import JobSpec
    from ..tasks.job import Job
    from ..tasks.outcomes import Outcome, WorkerHooks

__all__ = ["ENV", "HAVE_API", "Tracing", "current", "disable", "enable", "flush", "worker_hooks"]

log = logging.getLogger("miniqueue.tracing")

#: The environment variable that turns tracing off (``off``, ``0``, ``false`` or ``no``).
ENV = "MINIQUEUE_TRACING"
_OFF = frozenset({"off", "0", "false", "no"})
_ON = frozenset({"", "on", "1", "true", "yes", "auto"})

SYSTEM = "miniqueue"

T = TypeVar("T")

_current: Tracing | None = None
_resolved = False


def current() -> Tracing | None:
    """The tracing a client or worker created now uses: None when it is off or
    opentelemetry-api is not installed. (Decided on first use, from ``MINIQUEUE_TRACING``,
    unless :func:`enable` or :func:`disable` said otherwise.)"""
    global _current, _resolved
    if not _resolved:
        setting = os.environ.get(ENV, "").strip().lower()
        if setting not in _ON | _OFF:
            raise ConfigError(f"{ENV}={setting!r} is invalid: use 'off' to turn tracing off, or 'on'")
        _current = Tracing() if HAVE_API and setting in _ON else None
        _resolved = True
    return _current


def enable(tracer_provider: TracerProvider | None = None, *, as_child: bool = True) -> None:
    """Trace clients and workers created from now on: with ``tracer_provider``, or else the
    global one (``opentelemetry.trace.set_tracer_provider``). ``as_child=False`` makes each
    attempt's span the root of a trace of its own, linked to the enqueuing span, instead of
    its child. Raises ConfigError when opentelemetry-api is not installed."""
    global _current, _resolved
    if not HAVE_API:
        raise ConfigError("tracing needs opentelemetry-api: pip install 'miniqueue[otel]'")
    _current, _resolved = Tracing(tracer_provider, as_child=as_child), True


def disable() -> None:
    """Trace nothing in clients and workers created from now on (as ``MINIQUEUE_TRACING=off``)."""
    global _current, _resolved
    _current, _resolved = None, True


def for_worker() -> Tracing | None:
    """The tracing a worker starting now uses: None when off, or when no tracer provider is set."""
    tracing = current()
    if tracing is None:
        return None
    if not tracing.active():
        log.debug("opentelemetry-api is installed but no tracer provider is set: this worker traces nothing")
        return None
    return tracing


def worker_hooks(hooks: WorkerHooks | None = None) -> WorkerHooks:
    """``hooks`` (default: none) with a consumer span around each attempt, when tracing is on for
    a worker built now (:func:`for_worker`); ``hooks`` as they are otherwise. Whoever builds a
    worker applies it: the supervisor's worker processes and the testing kit's runner do, and an
    in-process worker's own code passes ``Worker(app, dsn, hooks=worker_hooks())``."""
    from ..tasks.outcomes import WorkerHooks

    hooks = hooks or WorkerHooks()
    tracing = for_worker()
    return hooks if tracing is None else tracing.instrument(hooks)


def flush() -> None:
    """Export the spans the tracer provider still buffers (see :meth:`Tracing.flush`), when
    tracing is on: a worker process that ends with ``os._exit`` calls it once its worker stopped."""
    tracing = for_worker()
    if tracing is not None:
        tracing.flush()


class _Untraced:
    """What :func:`sending` returns when nothing is traced: no span, no context to store."""

    context: str | None = None

    def __enter__(self) -> _Untraced:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def sent(self, result: T) -> T:
        return result


_UNTRACED = _Untraced()


def _installed_version() -> str | None:
    """miniqueue's version as installed (the tracer's version), or None when run uninstalled."""
    try:
        return importlib.metadata.version("miniqueue")
    except importlib.metadata.PackageNotFoundError:
        return None


def sending(tracing: Tracing | None, specs: Sequence[JobSpec], *, batch: bool = False) -> _Untraced | _Sending:
    """``with sending(client._tracing, specs) as send``: a producer span around an enqueue, whose
    ``send.context`` the jobs store (None when nothing is traced)."""
    return _UNTRACED if tracing is None else tracing.sending(specs, batch=batch)


class Tracing:
    """The tracer miniqueue's spans come from, and what they record (see the module's doc)."""

    def __init__(self, tracer_provider: TracerProvider | None = None, *, as_child: bool = True) -> None:
        self.tracer_provider = tracer_provider
        self.as_child = as_child
        # Without a provider of its own, a proxy: it follows a global provider set later.
        self.tracer = trace.get_tracer("miniqueue", _installed_version(), tracer_provider=tracer_provider)

    def active(self) -> bool:
        """Whether spans go anywhere: a provider was given, or a global one is set."""
        if self.tracer_provider is not None:
            return True
        return not isinstance(trace.get_tracer_provider(), (ProxyTracerProvider, NoOpTracerProvider))

    def flush(self, timeout_seconds: float = 2.0) -> None:
        """Export the spans the provider still buffers (an SDK provider's batch), waiting up to
        ``timeout_seconds``: a worker does so when it stops, since a supervised worker process
        ends with ``os._exit`` and so without the SDK's atexit flush."""
        provider = self.tracer_provider or trace.get_tracer_provider()
        force_flush = getattr(provider, "force_flush", None)  # not in the API: the SDK's, and most others'
        if force_flush is None:
            return
        try:
            force_flush(int(timeout_seconds * 1000))
        except Exception:
            log.exception("could not flush the worker's spans")

    # -- producing -------------------------------------------------------------------------------

    def sending(self, specs: Sequence[JobSpec], *, batch: bool = False) -> _Untraced | _Sending:
        """A producer span around the enqueue of ``specs`` (nothing while no provider is set)."""
        if not self.active():
            return _UNTRACED
        return _Sending(self.tracer, specs, batch)

    # -- consuming -------------------------------------------------------------------------------

    def instrument(self, hooks: WorkerHooks) -> WorkerHooks:
        """``hooks`` with a consumer span around each attempt: started and made current on the
        handler's thread (or task) right before the handler, detached right after it, ended
        once the outcome is recorded."""
        handler_start, handler_end, job_end = hooks.on_handler_start, hooks.on_handler_end, hooks.on_job_end

        def on_handler_start(job: Job) -> None:
            handler_start(job)
            self.start(job)  # last: nothing may fail between attaching and the handler

        def on_handler_end(job: Job) -> None:
            self.stop(job)
            handler_end(job)

        def on_job_end(job: Job, outcome: Outcome) -> None:
            self.finish(job, outcome)
            job_end(job, outcome)

        return dataclasses.replace(
            hooks, on_handler_start=on_handler_start, on_handler_end=on_handler_end, on_job_end=on_job_end
        )

    def start(self, job: Job, *, attach: bool = True, start_time: int | None = None) -> None:
        """Start ``job``'s attempt span and, with ``attach``, make it current here."""
        try:
            parent = _extract(job.trace_context)
            creation = trace.get_current_span(parent).get_span_context()
            attributes: dict[str, Any] = {
                "messaging.system": SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": job.queue,
                "messaging.message.id": str(job.id),
                "messaging.client.id": job.worker_id,
                "miniqueue.job.id": job.id,
                "miniqueue.task": job.task,
                "miniqueue.attempt": job.attempt,
                "miniqueue.max_attempts": job.attempt_budget,
                "miniqueue.run": job.run,
            }
            span = self.tracer.start_span(
                f"process {job.task}",
                context=parent if self.as_child else Context(),
                kind=SpanKind.CONSUMER,
                attributes=attributes,
                links=(Link(creation),) if creation.is_valid else None,
                start_time=start_time,
            )
            # The producer's baggage stays in the handler's context, as-child or not.
            token = otel_context.attach(trace.set_span_in_context(span, parent)) if attach else None
            job._trace = _Attempt(span, token)
        except Exception:  # tracing must never cost a job its attempt
            log.exception("could not start the span of job %d", job.id)

    def stop(self, job: Job) -> None:
        """The handler returned: detach its span (on the handler's thread or task), note the time."""
        attempt: _Attempt | None = job._trace
        if attempt is not None and attempt.token is not None:
            otel_context.detach(attempt.token)
            attempt.token = None
            attempt.end_time = time.time_ns()

    def finish(self, job: Job, outcome: Outcome) -> None:
        """Record the outcome on ``job``'s attempt span and end it."""
        try:
            if job._trace is None:  # no handler ran (a task this worker's app does not know)
                started = time.time_ns() - int((time.monotonic() - job.started_at) * 1e9)
                self.start(job, attach=False, start_time=started)
            attempt: _Attempt | None = job._trace
            job._trace = None
            if attempt is not None:
                _record_outcome(attempt.span, job, outcome, attempt.end_time)
                attempt.span.end(end_time=attempt.end_time)
        except Exception:
            log.exception("could not end the span of job %d", job.id)


class _Attempt:
    """One attempt's span, the token that made it current, and when its handler returned."""

    __slots__ = ("end_time", "span", "token")

    def __init__(self, span: Span, token: Token[Context] | None) -> None:
        self.span, self.token = span, token
        self.end_time: int | None = None


class _Sending:
    """The producer span of one enqueue call; ``context`` is the JSON the jobs store."""

    def __init__(self, tracer: trace.Tracer, specs: Sequence[JobSpec], batch: bool) -> None:
        self._tracer, self._specs, self._batch = tracer, specs, batch
        self.context: str | None = None

    def __enter__(self) -> _Sending:
        tasks = {spec.task for spec in self._specs}
        queues = {spec.queue for spec in self._specs}
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        if len(queues) == 1:
            attributes["messaging.destination.name"] = next(iter(queues))
        task = next(iter(tasks)) if len(tasks) == 1 else None
        if task is not None:
            attributes["miniqueue.task"] = task
        if self._batch:
            attributes["messaging.batch.message_count"] = len(self._specs)
        self._span = self._tracer.start_span(
            f"send {task}" if task else "send", kind=SpanKind.PRODUCER, attributes=attributes
        )
        context = trace.set_span_in_context(self._span)
        carrier: dict[str, str] = {}
        try:  # the configured propagators are the application's: one failing must not fail the enqueue
            propagate.inject(carrier, context=context)
        except Exception:
            log.exception("could not write the trace context of an enqueue: the job is stored without it")
            carrier = {}
        if carrier:  # nothing when the span is not valid (a no-op provider)
            self.context = json.dumps(carrier, separators=(",", ":"))
        self._token = otel_context.attach(context)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        otel_context.detach(self._token)
        if exc is not None:
            self._span.record_exception(exc)
            self._span.set_attribute("error.type", _type_name(exc))
            self._span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        self._span.end()

    def sent(self, result: T) -> T:
        """Note the enqueued job's id on the span (one job only); return ``result``."""
        job_id, duplicate = getattr(result, "id", None), getattr(result, "duplicate", False)
        if job_id is not None:
            self._span.set_attribute("messaging.message.id", str(job_id))
            self._span.set_attribute("miniqueue.job.id", job_id)
            if duplicate:
                self._span.set_attribute("miniqueue.duplicate", True)
        return result


def _extract(carrier: object) -> Context:
    """The context stored with a job, on an empty context (the worker's own stays out of it)."""
    if not isinstance(carrier, dict) or not carrier:
        return Context()
    return propagate.extract(carrier, context=Context())


#: The outcome attribute's value for each of the worker's final outcome kinds.
_OUTCOME_NAMES = {"completed_in_transaction": "completed"}
_FAILURES = frozenset({"retried", "dead", "failed", "lease_lost"})


def _record_outcome(span: Span, job: Job, outcome: Outcome, end_time: int | None) -> None:
    name = _OUTCOME_NAMES.get(outcome.kind, outcome.kind)
    if name == "lease_lost" and job.stop_reason == "cancelled":
        name = "cancelled"  # an operator cancelled the job: not the attempt's failure
    span.set_attribute("miniqueue.outcome", name)
    if job.stop_reason is not None:
        span.set_attribute("miniqueue.stop_reason", job.stop_reason)
    if name in ("retried", "snoozed"):
        span.set_attribute("miniqueue.delay", float(outcome.delay))
    if name not in _FAILURES:
        return
    exc = outcome.exception
    if exc is not None:
        span.record_exception(exc, timestamp=end_time)
    error_type = _type_name(exc) if exc is not None else "miniqueue.LeaseLost" if name == "lease_lost" else "_OTHER"
    span.set_attribute("error.type", error_type)
    last_line = (outcome.error or "").strip().rsplit("\n", 1)[-1]
    span.set_status(Status(StatusCode.ERROR, last_line or name))


def _type_name(exc: BaseException) -> str:
    """An exception class's name as ``error.type`` wants it: qualified, but not ``builtins.``."""
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
