-- Jobs finished per minute, for the dashboard's throughput chart. Counting the last hour's
-- finished rows grows with the load (141 ms with 1,000,000 jobs finished in the hour); counted
-- here instead, by the statements that finish jobs, in the same way as miniqueue_counts (one
-- upsert per statement into the row of the backend's shard), it costs the chart a read of at
-- most 60 minutes x 4 states x 64 shards. These count finishing events: a job pruned, requeued
-- or deleted later still finished in its minute (dependents that miniqueue_settle cancels are
-- not among them). The reaper drops minutes older than two hours.
CREATE TABLE miniqueue_finished_minutes (
    minute TIMESTAMPTZ NOT NULL,
    state  TEXT        NOT NULL CHECK (state IN ('completed', 'failed', 'dead', 'cancelled')),
    shard  SMALLINT    NOT NULL,
    count  BIGINT      NOT NULL,
    PRIMARY KEY (minute, state, shard)
);
-- Small and updated on every batch: keep it vacuumed.
ALTER TABLE miniqueue_finished_minutes SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);

-- The last hour, from the jobs that finished in it.
INSERT INTO miniqueue_finished_minutes (minute, state, shard, count)
SELECT date_trunc('minute', finished_at), state, 0, count(*) FROM miniqueue_jobs
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled') AND finished_at > now() - interval '1 hour'
 GROUP BY 1, 2;
