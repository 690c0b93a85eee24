"""A traced app for tests/db/test_otel.py's supervisor test: as docs/guides/opentelemetry.md says, the SDK's tracer
provider is set up in the module the workers load. It exports each span as a line of JSON to
``$MINIQUEUE_TEST_SPANS`` through a BatchSpanProcessor that would wait a minute before exporting
on its own: the spans reach the file only because each worker flushes its provider when it
stops (a supervised worker ends with ``os._exit``, which runs no atexit handler)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from miniqueue import App
from miniqueue.tasks.job import Job


class ToFile(SpanExporter):
    """One line of JSON per span, each written whole (every worker process appends to the file)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            for span in spans:
                context, parent = span.get_span_context(), span.parent
                line = {
                    "name": span.name,
                    "pid": os.getpid(),
                    "span_id": context.span_id if context else None,
                    "parent_id": parent.span_id if parent else None,
                    "attributes": dict(span.attributes or {}),
                }
                os.write(fd, (json.dumps(line) + "\n").encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(
    BatchSpanProcessor(ToFile(os.environ["MINIQUEUE_TEST_SPANS"]), schedule_delay_millis=60_000)
)
trace.set_tracer_provider(provider)

app = App()


@app.task("greet")
def greet(job: Job) -> None:
    with trace.get_tracer(__name__).start_as_current_span("render"):
        pass
