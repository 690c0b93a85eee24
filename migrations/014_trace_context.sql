-- The trace context of the span that enqueued a job, as the OpenTelemetry propagator wrote it
-- ({"traceparent": "00-...", "tracestate": "..."}, plus baggage when there is some), so that
-- each attempt's consumer span can join the producer's trace (see miniqueue.tracing). NULL
-- for every job enqueued without tracing. A nullable column without a default is a catalog
-- change only: no table rewrite, instant at any table size.
ALTER TABLE miniqueue_jobs ADD COLUMN trace_context JSONB;
