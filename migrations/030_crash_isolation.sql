-- A crash charged to its cause. When a worker process dies while several of its handlers run (a
-- batch, or handler threads), which job killed it is not known: none of them is charged, and each
-- is handed back with run_alone set. A worker starts a job that runs alone only once no other
-- handler runs in its process, and starts nothing beside it, so that a death while it runs is its
-- own, charged to it alone: a poison job ends dead at its attempts, and its healthy neighbours
-- complete (see docs/guarantees.md, "Who pays an attempt"). NULL: false, so adding the column
-- rewrites nothing.
ALTER TABLE miniqueue_jobs ADD COLUMN run_alone BOOLEAN;
ALTER TABLE miniqueue_jobs_live ALTER COLUMN run_alone SET STATISTICS 0;
