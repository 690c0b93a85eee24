-- Weighted rate limits: a job may cost more than one token of its rate limit's bucket (see
-- "Weighted rate limits" in docs/guides/limits.md). The claim takes a job's cost from the bucket
-- instead of one token, and admits a job only once the bucket holds all of it.
--
-- rate_cost is a column of miniqueue_jobs, so that the claim reads it from the job row it locks
-- anyway. Added on the partitioned table, it reaches the hot table and every history partition;
-- with a constant default PostgreSQL records the default in the catalog instead of rewriting a
-- single row, so the migration is instant however many jobs the history holds, and an enqueue of
-- a job without limits writes nothing more than before (it leaves the column at its default, and
-- no claim reads the cost of a job without limits). No CHECK constraint: adding one would scan
-- every partition to validate it, and the enqueue checks the cost before it is stored (a whole
-- number from 1 to the bucket's size). No statistics: no plan filters or sorts by it.
ALTER TABLE miniqueue_jobs ADD COLUMN rate_cost INT NOT NULL DEFAULT 1;
ALTER TABLE miniqueue_jobs_live ALTER COLUMN rate_cost SET STATISTICS 0;

-- A task's declared cost, published with its rate limit so that a producer without the app
-- (a Client, the CLI) charges its jobs the same; NULL: 1.
ALTER TABLE miniqueue_tasks ADD COLUMN rate_cost INT CHECK (rate_cost > 0);
