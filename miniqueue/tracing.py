"""OpenTelemetry tracing, as users reach it: ``miniqueue.tracing.enable()``, ``disable()`` and
``current()``, and ``worker_hooks()`` for a worker built in-process (see
docs/guides/opentelemetry.md). The implementation is :mod:`miniqueue.observability.tracing`."""

from .observability.tracing import ENV, HAVE_API, Tracing, current, disable, enable, flush, worker_hooks

__all__ = ["ENV", "HAVE_API", "Tracing", "current", "disable", "enable", "flush", "worker_hooks"]
