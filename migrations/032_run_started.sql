-- When the job's latest run started: set by the claim, as the lease is taken (the database's
-- clock). A run's history entry carries it (`started`), so a job's timeline shows when each run
-- began, not only when it ended; an entry also says whether its run was charged (`charged`:
-- false for a hand-back), so the timeline numbers attempts as `miniqueue jobs show` counts them.
-- NULL: never run (or run before this migration).
ALTER TABLE miniqueue_jobs ADD COLUMN started_at TIMESTAMPTZ;
ALTER TABLE miniqueue_jobs_live ALTER COLUMN started_at SET STATISTICS 0;
