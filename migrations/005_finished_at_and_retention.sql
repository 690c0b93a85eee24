-- Retention needs one timestamp for "reached a terminal state", whichever it was
-- (completed_at only covers one of four). The partial index lets the reaper prune the
-- oldest finished rows in small batches without scanning live ones.
ALTER TABLE miniqueue_jobs ADD COLUMN finished_at TIMESTAMPTZ;
UPDATE miniqueue_jobs SET finished_at = COALESCE(completed_at, now())
    WHERE state IN ('completed', 'failed', 'dead', 'cancelled');
CREATE INDEX idx_miniqueue_jobs_finished
    ON miniqueue_jobs (finished_at)
    WHERE state IN ('completed', 'failed', 'dead', 'cancelled');
