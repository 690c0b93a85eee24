-- Periodic jobs: the last cron slot enqueued for each schedule. A scheduler claims a slot by
-- advancing last_slot with a conditional upsert in the same transaction as the enqueue, so
-- each slot is enqueued once however many schedulers (hosts) run, with no leader election;
-- and unlike an idempotency key alone, the record outlives the pruning of the job it made.
CREATE TABLE miniqueue_periodic (
    name       TEXT        PRIMARY KEY,
    last_slot  TIMESTAMPTZ NOT NULL,
    enabled    BOOLEAN     NOT NULL DEFAULT true,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
