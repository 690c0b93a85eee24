-- Counting finished jobs with count(*) grows with the table: 0.6-0.8 s at 2,000,000 finished
-- rows, on every /metrics scrape, `miniqueue stats` and dashboard overview. Finished jobs are
-- counted here instead, per queue and terminal state, by the statements that finish, requeue,
-- prune or delete them (one upsert per statement, not per job). Each statement adds to the row
-- of its own shard (the backend's pid modulo 64), so that workers committing at once seldom
-- wait on each other's row lock; a reader sums the shards. Jobs that are available or running
-- are counted from their partial indexes, whose size does not grow with finished rows either.
CREATE TABLE miniqueue_counts (
    queue TEXT     NOT NULL,
    state TEXT     NOT NULL CHECK (state IN ('completed', 'failed', 'dead', 'cancelled')),
    shard SMALLINT NOT NULL,
    count BIGINT   NOT NULL,
    PRIMARY KEY (queue, state, shard)
);
-- Small and updated on every batch: keep it vacuumed.
ALTER TABLE miniqueue_counts SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);

-- The jobs already finished. (Migrate with the workers stopped, or any that finish jobs during
-- the migration on an older version go uncounted until they are pruned.)
INSERT INTO miniqueue_counts (queue, state, shard, count)
SELECT queue, state, 0, count(*) FROM miniqueue_jobs
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled')
 GROUP BY queue, state;
