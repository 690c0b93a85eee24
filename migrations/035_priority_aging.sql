-- Priority aging (see "Priority aging" in docs/guides/fairness.md): a queue may declare that its
-- waiting jobs rise one priority step per interval they have been due, up to the highest priority
-- among its available jobs, so that a constant stream of high-priority jobs never starves the
-- low-priority ones behind it.
--
-- The claim does not change: the reaper raises the stored priority, in batches, with a write only
-- for the jobs whose priority rises (miniqueue/store/aging.py), so the claim index stays in the
-- claim's order and a claim reads its first entries as before. Off unless a queue sets it.

-- The interval, in seconds (`miniqueue queues age NAME SECONDS`); NULL (the default): the queue's
-- jobs do not age.
ALTER TABLE miniqueue_queues ADD COLUMN age_after DOUBLE PRECISION CHECK (age_after > 0);

-- The priority the job was enqueued with, kept once aging raised it (each step counts from it,
-- and `miniqueue jobs show` tells both); NULL: never raised. NULL needs no rewrite of any row,
-- however many jobs the history holds. No statistics: no plan filters or sorts by it.
ALTER TABLE miniqueue_jobs ADD COLUMN aged_from SMALLINT;
ALTER TABLE miniqueue_jobs_live ALTER COLUMN aged_from SET STATISTICS 0;
