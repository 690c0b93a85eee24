-- The claim orders by (priority DESC, scheduled_at, id). With id in the index the index
-- alone gives that order, so a claim reads the first N index entries instead of sorting
-- every available row of the queue.
DROP INDEX idx_miniqueue_jobs_claim;
CREATE INDEX idx_miniqueue_jobs_claim
    ON miniqueue_jobs (queue, priority DESC, scheduled_at, id)
    WHERE state = 'available';

-- Each job is inserted, updated two or three times and deleted: a high-churn table. The
-- default thresholds (20% of the table) let dead tuples pile up in the claim index and leave
-- the planner without statistics on a new table; vacuum and analyze it early and often.
ALTER TABLE miniqueue_jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0,
    fillfactor = 90
);

-- Give the planner statistics now rather than whenever autovacuum gets to it: a freshly
-- created table otherwise plans claims by luck.
ANALYZE miniqueue_jobs;
