-- The queue is this table. This is the first schema, kept as it was so that the later
-- migrations read as a record of what miniqueue added and why.
CREATE TABLE miniqueue_jobs (
    id               BIGSERIAL PRIMARY KEY,
    queue            TEXT        NOT NULL,
    idempotency_key  TEXT        UNIQUE,
    payload          JSONB       NOT NULL,
    state            TEXT        NOT NULL DEFAULT 'available',
    priority         SMALLINT    NOT NULL DEFAULT 0,
    attempt          INT         NOT NULL DEFAULT 0,
    max_attempts     INT         NOT NULL DEFAULT 5,
    scheduled_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    lease_expires_at TIMESTAMPTZ,
    leased_by        TEXT,
    last_error       TEXT,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at     TIMESTAMPTZ,
    CONSTRAINT valid_state CHECK (state IN ('available', 'running', 'completed', 'failed', 'dead'))
);

-- Claim index: partial, so it holds only claimable rows however many finished rows the table keeps.
CREATE INDEX idx_miniqueue_jobs_claim
    ON miniqueue_jobs (queue, priority DESC, scheduled_at)
    WHERE state = 'available';

-- Reaper index: finds expired leases without scanning the table.
CREATE INDEX idx_miniqueue_jobs_expired_leases
    ON miniqueue_jobs (lease_expires_at)
    WHERE state = 'running' AND lease_expires_at IS NOT NULL;
