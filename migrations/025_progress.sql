-- Job progress: what a running handler last reported of its own progress (`job.progress()`):
-- {"percent": 0-100, "meta": {...}, "at": when it was written}. NULL: none reported.
--
-- A handler may report progress thousands of times a job, so a report is never a statement of
-- its own: the worker keeps the latest one in memory and writes it with the next renewal of its
-- leases (the heartbeat's one fenced UPDATE over every lease it holds), and once more as the job
-- completes. Both writes are fenced like every worker write (worker and attempt), so a stale
-- attempt never overwrites the progress of the one that holds the job. The column is on the
-- partitioned table, so the row carries its last progress into the history.
--
-- Nothing plans on it: no statistics (as for the job's other contents, migration 017).
ALTER TABLE miniqueue_jobs ADD COLUMN progress JSONB;
ALTER TABLE miniqueue_jobs_live ALTER COLUMN progress SET STATISTICS 0;
