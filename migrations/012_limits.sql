-- Fleet-wide limits, enforced by the claim: at most N running jobs per concurrency key, at most
-- N running jobs per queue, at most R starts per second per rate-limit bucket.
--
-- A job names the limits it is subject to (its "limit scopes") in `limits`; a job without any
-- keeps it NULL and is claimed exactly as before. Each scope is a row of miniqueue_limits:
--   * a concurrency scope (max_running set) records the leases holding its slots, as parallel
--     arrays of job id and attempt. A slot is held while that job is running at that attempt:
--     when the lease ends (completed, failed, released by the supervisor or the reaper, handed
--     back), the slot is free, with no statement to forget to run. The claim prunes ended
--     holders when it next takes a slot of the scope.
--   * a rate scope (rate set) is a token bucket: `tokens` as of `refilled_at`, refilled at
--     `rate` per second up to `burst`.
-- The claim locks the scope rows it needs (skipping those another claim holds), reads
-- the holders' latest row versions, and takes slots and tokens in the same statement that
-- leases the jobs.
ALTER TABLE miniqueue_jobs ADD COLUMN limits TEXT[];

CREATE TABLE miniqueue_limits (
    scope           TEXT        PRIMARY KEY,
    max_running     INT         CHECK (max_running > 0),
    rate            FLOAT8      CHECK (rate > 0),
    burst           FLOAT8      CHECK (burst >= 1),
    tokens          FLOAT8      NOT NULL DEFAULT 0,
    refilled_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    holder_ids      BIGINT[]    NOT NULL DEFAULT '{}',
    holder_attempts INT[]       NOT NULL DEFAULT '{}',
    CHECK ((max_running IS NULL) <> (rate IS NULL)),
    CHECK ((rate IS NULL) = (burst IS NULL))
);
-- Rewritten on every limited claim: keep it vacuumed.
ALTER TABLE miniqueue_limits SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);

-- A fleet-wide cap on the running jobs of a queue (`miniqueue queues limit`). Its slots are the
-- concurrency scope 'queue:<name>' above.
ALTER TABLE miniqueue_queues ADD COLUMN max_running INT CHECK (max_running > 0);

-- The claim index keeps only unlimited jobs, so that the ordinary claim never walks past a
-- backlog held back by a limit. Limited jobs have an index of their own, by their scopes, so
-- that the claim steps from one group of scopes to the next (one probe per group) instead of
-- reading a held-back group's backlog. The two are disjoint: a query over every available job
-- reads both (`limits IS NULL` and `limits IS NOT NULL`).
DROP INDEX idx_miniqueue_jobs_claim;
CREATE INDEX idx_miniqueue_jobs_claim
    ON miniqueue_jobs (queue, priority DESC, scheduled_at, id)
    WHERE state = 'available' AND limits IS NULL;
CREATE INDEX idx_miniqueue_jobs_limited
    ON miniqueue_jobs (queue, limits, priority DESC, scheduled_at, id)
    WHERE state = 'available' AND limits IS NOT NULL;
