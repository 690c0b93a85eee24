-- miniqueue: workers from 022
-- Finished jobs leave the hot table. miniqueue_jobs becomes a table partitioned by state: the
-- jobs that can still run (waiting, available, running) live in miniqueue_jobs_live, the hot
-- table every claim reads, whose size follows the live jobs alone; a statement that finishes a
-- job moves its row (an UPDATE of the state moves it to the partition of its new state, in the
-- same statement, fenced as before) into one of two history tables, each partitioned by finish
-- time so that retention drops whole partitions instead of deleting rows:
--
--   miniqueue_jobs_done    completed and cancelled jobs, a partition per hour
--   miniqueue_jobs_failed  failed, dead and expired jobs, a partition per day
--
-- The reaper creates the partitions ahead and drops those past retention (see
-- miniqueue.store.history); each history table has a default partition, so that a job finished
-- where no partition was made yet is never refused: it lands there and is pruned row by row.
-- Readers name miniqueue_jobs as before and find a job wherever it is; a requeue moves it back.
--
-- Ids stay unique across the partitions without an index over all of them: every id comes from
-- the one sequence, and a row is only ever moved, never copied. Idempotency keys, which must hold
-- for finished jobs too and so cannot live in a partial index of the hot table, get a table of
-- their own, written by the enqueue before the job (see miniqueue.store.enqueue).
--
-- The rows of an existing table: the table is renamed miniqueue_jobs_legacy; its live jobs move
-- to the hot table here, and its finished ones are moved in batches by the reaper (and by
-- `miniqueue migrate`) while the queue runs, after which it is dropped. The workers of earlier
-- versions cannot serve this schema (they name the idempotency index in their inserts): stop
-- them before migrating (see "Rolling deploys" in docs/operations/schema.md).

-- Idempotency keys, one row per key held; the key goes when its job is deleted or pruned.
CREATE TABLE miniqueue_idempotency_keys (
    key    TEXT   PRIMARY KEY,
    job_id BIGINT NOT NULL
);
INSERT INTO miniqueue_idempotency_keys (key, job_id)
SELECT idempotency_key, id FROM miniqueue_jobs WHERE idempotency_key IS NOT NULL;

-- Finished counts by the hour they finished in (UTC), so that dropping a partition takes its
-- jobs off the counts by deleting the rows of its hours, without reading the partition. The
-- counts of rows finished before this migration are kept in the bucket '-infinity' until the
-- reaper moves their rows, and with them their counts.
ALTER TABLE miniqueue_counts ADD COLUMN bucket TIMESTAMPTZ NOT NULL DEFAULT '-infinity';
ALTER TABLE miniqueue_counts ALTER COLUMN bucket DROP DEFAULT;
ALTER TABLE miniqueue_counts DROP CONSTRAINT miniqueue_counts_pkey;
ALTER TABLE miniqueue_counts ADD PRIMARY KEY (queue, state, shard, bucket);

-- The old table, kept under another name until its finished rows have moved. Its indexes of
-- live jobs go with the live jobs; its primary key and finished_at index serve the move.
ALTER TABLE miniqueue_jobs RENAME TO miniqueue_jobs_legacy;
ALTER TABLE miniqueue_jobs_legacy ALTER COLUMN id DROP DEFAULT;
ALTER INDEX miniqueue_jobs_pkey RENAME TO miniqueue_jobs_legacy_pkey;
ALTER INDEX idx_miniqueue_jobs_finished RENAME TO idx_miniqueue_jobs_legacy_finished;
ALTER INDEX idx_miniqueue_jobs_claim RENAME TO idx_miniqueue_jobs_legacy_claim;
ALTER INDEX idx_miniqueue_jobs_limited RENAME TO idx_miniqueue_jobs_legacy_limited;
ALTER INDEX idx_miniqueue_jobs_expired_leases RENAME TO idx_miniqueue_jobs_legacy_expired_leases;
ALTER INDEX idx_miniqueue_jobs_waiting RENAME TO idx_miniqueue_jobs_legacy_waiting;
DROP INDEX idx_miniqueue_jobs_idempotency_key;
DROP INDEX idx_miniqueue_jobs_unique_key;
DROP INDEX idx_miniqueue_jobs_sequence;
DROP INDEX idx_miniqueue_jobs_expiring;
ALTER TABLE miniqueue_jobs_legacy RENAME CONSTRAINT positive_attempts TO legacy_positive_attempts;
ALTER TABLE miniqueue_jobs_legacy RENAME CONSTRAINT expires_after_enqueue TO legacy_expires_after_enqueue;
ALTER TABLE miniqueue_jobs_legacy RENAME CONSTRAINT valid_state TO legacy_valid_state;

CREATE TABLE miniqueue_jobs (LIKE miniqueue_jobs_legacy INCLUDING DEFAULTS) PARTITION BY LIST (state);
ALTER TABLE miniqueue_jobs ALTER COLUMN id SET DEFAULT nextval('miniqueue_jobs_id_seq');
ALTER SEQUENCE miniqueue_jobs_id_seq OWNED BY miniqueue_jobs.id;
ALTER TABLE miniqueue_jobs
    ADD CONSTRAINT positive_attempts CHECK (max_attempts >= 1 AND attempt_budget >= 1),
    ADD CONSTRAINT expires_after_enqueue CHECK (expires_at > created_at),
    ADD CONSTRAINT valid_state
        CHECK (state IN ('available', 'running', 'completed', 'failed', 'dead', 'cancelled', 'waiting', 'expired'));

-- The hot table: the storage and statistics settings the jobs table had (see its migrations).
CREATE TABLE miniqueue_jobs_live PARTITION OF miniqueue_jobs FOR VALUES IN ('waiting', 'available', 'running') WITH (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0,
    fillfactor = 90
);
ALTER TABLE miniqueue_jobs_live ADD CONSTRAINT miniqueue_jobs_live_pkey PRIMARY KEY (id);
ALTER TABLE miniqueue_jobs_live
    ALTER COLUMN id SET STATISTICS 10,
    ALTER COLUMN queue SET STATISTICS 10,
    ALTER COLUMN idempotency_key SET STATISTICS 10,
    ALTER COLUMN payload SET STATISTICS 0,
    ALTER COLUMN state SET STATISTICS 10,
    ALTER COLUMN priority SET STATISTICS 10,
    ALTER COLUMN attempt SET STATISTICS 10,
    ALTER COLUMN max_attempts SET STATISTICS 10,
    ALTER COLUMN scheduled_at SET STATISTICS 10,
    ALTER COLUMN lease_expires_at SET STATISTICS 10,
    ALTER COLUMN leased_by SET STATISTICS 10,
    ALTER COLUMN last_error SET STATISTICS 0,
    ALTER COLUMN created_at SET STATISTICS 10,
    ALTER COLUMN completed_at SET STATISTICS 10,
    ALTER COLUMN task SET STATISTICS 10,
    ALTER COLUMN errors SET STATISTICS 0,
    ALTER COLUMN finished_at SET STATISTICS 10,
    ALTER COLUMN attempt_budget SET STATISTICS 10,
    ALTER COLUMN limits SET STATISTICS 10,
    ALTER COLUMN result SET STATISTICS 0,
    ALTER COLUMN parents SET STATISTICS 10,
    ALTER COLUMN dependents SET STATISTICS 10,
    ALTER COLUMN pending_parents SET STATISTICS 10,
    ALTER COLUMN awaited SET STATISTICS 10,
    ALTER COLUMN trace_context SET STATISTICS 0,
    ALTER COLUMN unique_key SET STATISTICS 10,
    ALTER COLUMN unique_while_running SET STATISTICS 10,
    ALTER COLUMN sequence_key SET STATISTICS 10,
    ALTER COLUMN expires_at SET STATISTICS 10;

-- The hot table's indexes, as the jobs table had them (see schema.sql for what each is for),
-- but for the finished jobs' index, which partitions make needless, and the idempotency index,
-- which miniqueue_idempotency_keys replaces.
CREATE INDEX idx_miniqueue_jobs_claim ON miniqueue_jobs_live (queue, priority DESC, scheduled_at, id)
    WHERE state = 'available' AND limits IS NULL;
CREATE INDEX idx_miniqueue_jobs_limited ON miniqueue_jobs_live (queue, limits, priority DESC, scheduled_at, id)
    WHERE state = 'available' AND limits IS NOT NULL;
CREATE INDEX idx_miniqueue_jobs_expired_leases ON miniqueue_jobs_live (lease_expires_at)
    WHERE state = 'running' AND lease_expires_at IS NOT NULL;
CREATE INDEX idx_miniqueue_jobs_waiting ON miniqueue_jobs_live (queue) WHERE state = 'waiting';
CREATE UNIQUE INDEX idx_miniqueue_jobs_unique_key ON miniqueue_jobs_live (unique_key)
    WHERE unique_key IS NOT NULL
      AND (state IN ('waiting', 'available') AND (attempt = 0 OR unique_while_running)
           OR state = 'running' AND unique_while_running);
CREATE INDEX idx_miniqueue_jobs_sequence ON miniqueue_jobs_live (sequence_key, id)
    WHERE state = 'waiting' AND sequence_key IS NOT NULL;
CREATE INDEX idx_miniqueue_jobs_expiring ON miniqueue_jobs_live (expires_at)
    WHERE expires_at IS NOT NULL AND state IN ('available', 'waiting');

-- The history: by finish time, with a default partition each. Indexed by id (a job is looked up
-- by it) and, sparsely, by idempotency key (the keys of a partition's jobs are deleted before
-- it is dropped). Each partition is written once per job and read seldom: no storage settings.
CREATE TABLE miniqueue_jobs_done PARTITION OF miniqueue_jobs FOR VALUES IN ('completed', 'cancelled')
    PARTITION BY RANGE (finished_at);
CREATE TABLE miniqueue_jobs_failed PARTITION OF miniqueue_jobs FOR VALUES IN ('failed', 'dead', 'expired')
    PARTITION BY RANGE (finished_at);
CREATE TABLE miniqueue_jobs_done_default PARTITION OF miniqueue_jobs_done DEFAULT;
CREATE TABLE miniqueue_jobs_failed_default PARTITION OF miniqueue_jobs_failed DEFAULT;
CREATE INDEX idx_miniqueue_jobs_done_id ON miniqueue_jobs_done (id);
CREATE INDEX idx_miniqueue_jobs_failed_id ON miniqueue_jobs_failed (id);
CREATE INDEX idx_miniqueue_jobs_done_idempotency_key ON miniqueue_jobs_done (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX idx_miniqueue_jobs_failed_idempotency_key ON miniqueue_jobs_failed (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The history's partitions by finish time, as the reaper made them: what it drops, and when.
CREATE TABLE miniqueue_history_partitions (
    name      TEXT        PRIMARY KEY,
    class     TEXT        NOT NULL CHECK (class IN ('done', 'failed')),
    starts_at TIMESTAMPTZ NOT NULL,
    ends_at   TIMESTAMPTZ NOT NULL
);

-- The live jobs move now, each by the index that finds its kind (a running job without a lease,
-- which none of them finds, moves with the finished ones).
WITH live AS (
    SELECT id FROM miniqueue_jobs_legacy WHERE state = 'available' AND limits IS NULL
    UNION ALL SELECT id FROM miniqueue_jobs_legacy WHERE state = 'available' AND limits IS NOT NULL
    UNION ALL SELECT id FROM miniqueue_jobs_legacy WHERE state = 'running' AND lease_expires_at IS NOT NULL
    UNION ALL SELECT id FROM miniqueue_jobs_legacy WHERE state = 'waiting'
), moved AS (
    DELETE FROM miniqueue_jobs_legacy WHERE id IN (SELECT id FROM live) RETURNING *
)
INSERT INTO miniqueue_jobs SELECT * FROM moved;


-- The old table's indexes of live jobs found them for the move above; it holds none now.
DROP INDEX idx_miniqueue_jobs_legacy_claim;
DROP INDEX idx_miniqueue_jobs_legacy_limited;
DROP INDEX idx_miniqueue_jobs_legacy_expired_leases;
DROP INDEX idx_miniqueue_jobs_legacy_waiting;

-- A job that miniqueue_settle cancels is counted in the hour it finished in, like any other.
CREATE OR REPLACE FUNCTION miniqueue_settle(
    notify_ids BIGINT[], released BIGINT[], cancel_children BIGINT[], cancel_parents BIGINT[],
    cancel_states TEXT[], channel TEXT, queue_channel TEXT, sequence_keys TEXT[] DEFAULT NULL
) RETURNS INT
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    settled INT := 0;
    n INT;
    children BIGINT[] := coalesce(cancel_children, '{}');
    parents BIGINT[] := cancel_parents;
    states TEXT[] := cancel_states;
    queues TEXT[];
    waited BIGINT[];
BEGIN
    PERFORM pg_notify(channel, id::text) FROM unnest(notify_ids) AS u(id);

    WITH released_jobs AS (
        UPDATE miniqueue_jobs j
           SET pending_parents = j.pending_parents - r.n,
               state = CASE WHEN j.pending_parents - r.n <= 0 THEN 'available' ELSE 'waiting' END,
               scheduled_at = CASE WHEN j.pending_parents - r.n <= 0 THEN greatest(j.scheduled_at, now())
                                   ELSE j.scheduled_at END
          FROM (SELECT child, count(*)::int AS n FROM unnest(released) AS u(child) GROUP BY child) r
         WHERE j.id = r.child AND j.state = 'waiting'
        RETURNING j.queue, j.state
    )
    SELECT array_agg(DISTINCT queue) FILTER (WHERE state = 'available'), count(*) INTO queues, n FROM released_jobs;
    PERFORM pg_notify(queue_channel, q) FROM unnest(queues) AS u(q);
    settled := settled + n;

    -- Cancel dependents, then theirs, until none is left waiting on a cancelled job.
    WHILE cardinality(children) > 0 LOOP
        WITH cancelled AS (
            UPDATE miniqueue_jobs j
               SET state = 'cancelled', finished_at = now(), pending_parents = 0,
                   last_error = c.reason,
                   errors = j.errors || jsonb_build_array(jsonb_build_object(
                       'attempt', j.attempt, 'at', now(), 'worker', NULL, 'error', c.reason))
              FROM (SELECT DISTINCT ON (child) child, format('cancelled: its parent job %s %s', parent,
                           CASE WHEN state = 'deleted' THEN 'was deleted unfinished' ELSE 'ended ' || state END) AS reason
                      FROM unnest(children, parents, states) AS u(child, parent, state)
                     ORDER BY child, parent) c
             WHERE j.id = c.child AND j.state = 'waiting'
            RETURNING j.id, j.queue, j.dependents, j.awaited
        ), counted AS (
            INSERT INTO miniqueue_counts AS k (queue, state, shard, bucket, count)
            SELECT queue, 'cancelled', pg_backend_pid() % 64, date_trunc('hour', now(), 'UTC'), count(*)
              FROM cancelled GROUP BY queue
            ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = k.count + excluded.count
        )
        SELECT coalesce(array_agg(d.child) FILTER (WHERE d.child IS NOT NULL), '{}'),
               coalesce(array_agg(c.id) FILTER (WHERE d.child IS NOT NULL), '{}'),
               coalesce(array_agg(DISTINCT c.id) FILTER (WHERE c.awaited), '{}'),
               count(DISTINCT c.id)
          INTO children, parents, waited, n
          FROM cancelled c LEFT JOIN LATERAL unnest(c.dependents) AS d(child) ON true;
        states := array_fill('cancelled'::text, ARRAY[cardinality(children)]);
        PERFORM pg_notify(channel, id::text) FROM unnest(waited) AS u(id);
        settled := settled + n;
    END LOOP;

    IF cardinality(sequence_keys) > 0 THEN
        settled := settled + miniqueue_sequence_advance(sequence_keys, queue_channel);
    END IF;
    RETURN settled;
END
$$;

-- An old table with no finished rows to move (a new database's) goes now.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM miniqueue_jobs_legacy) THEN
        DROP TABLE miniqueue_jobs_legacy;
    END IF;
END
$$;
