-- ANALYZE reads a sample of 300 rows per unit of the largest statistics target among the
-- table's columns: 30,000 rows at the default target of 100, each column's values then sorted
-- and counted. The plans of the jobs table's statements turn on a few coarse facts (how many
-- rows are available, in which queue, how many carry limits) that a sample of 3,000 rows gives
-- as well (sorting the sampled concurrency keys, text arrays, was a sixth of the cost alone).
-- The reaper analyzes the table about once a second while a backlog drains (see the
-- README's "Vacuum and planner statistics"): at 100,000 jobs each ANALYZE took 260 ms, and 36 ms
-- with these targets; a supervised drain of 50,000 jobs over 5,000 concurrency keys ran 15%
-- faster for it (medians of 3 runs), one without limits 10%.
ALTER TABLE miniqueue_jobs
    ALTER COLUMN id SET STATISTICS 10,
    ALTER COLUMN queue SET STATISTICS 10,
    ALTER COLUMN idempotency_key SET STATISTICS 10,
    ALTER COLUMN state SET STATISTICS 10,
    ALTER COLUMN priority SET STATISTICS 10,
    ALTER COLUMN attempt SET STATISTICS 10,
    ALTER COLUMN max_attempts SET STATISTICS 10,
    ALTER COLUMN scheduled_at SET STATISTICS 10,
    ALTER COLUMN lease_expires_at SET STATISTICS 10,
    ALTER COLUMN leased_by SET STATISTICS 10,
    ALTER COLUMN created_at SET STATISTICS 10,
    ALTER COLUMN completed_at SET STATISTICS 10,
    ALTER COLUMN task SET STATISTICS 10,
    ALTER COLUMN finished_at SET STATISTICS 10,
    ALTER COLUMN attempt_budget SET STATISTICS 10,
    ALTER COLUMN limits SET STATISTICS 10,
    ALTER COLUMN parents SET STATISTICS 10,
    ALTER COLUMN dependents SET STATISTICS 10,
    ALTER COLUMN pending_parents SET STATISTICS 10,
    ALTER COLUMN awaited SET STATISTICS 10;
