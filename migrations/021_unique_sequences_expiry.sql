-- Keys users can trust: unique jobs, strict order per key (sequences), and expiry (see
-- docs/guides/keys.md for what each promises).

-- unique_key: a job with one conflicts with any other job of the same key that holds it, and
-- the index below is what decides "holds": PostgreSQL enforces it, so no enqueue checks and then
-- inserts. A job holds its key while it waits to run (waiting, or available and never started),
-- and while it runs and waits out its retries too unless unique_while_running is false. With
-- running out of the states, "never started" is `attempt = 0`: a job that started, then came
-- back for a retry, no longer holds the key, so no retry can ever collide with a newer job (a
-- retry is a transition no enqueue can refuse). A finished job holds no key.
ALTER TABLE miniqueue_jobs ADD COLUMN unique_key TEXT,
                           ADD COLUMN unique_while_running BOOLEAN NOT NULL DEFAULT true,
-- sequence_key: jobs of one key run one at a time, in enqueue order (miniqueue_sequences).
                           ADD COLUMN sequence_key TEXT,
-- expires_at: a job not claimed by then never is; the reaper moves it to 'expired'.
                           ADD COLUMN expires_at TIMESTAMPTZ,
                           ADD CONSTRAINT expires_after_enqueue CHECK (expires_at > created_at);
ALTER TABLE miniqueue_jobs
    ALTER COLUMN unique_key SET STATISTICS 10,
    ALTER COLUMN unique_while_running SET STATISTICS 10,
    ALTER COLUMN sequence_key SET STATISTICS 10,
    ALTER COLUMN expires_at SET STATISTICS 10;

ALTER TABLE miniqueue_jobs DROP CONSTRAINT valid_state;
ALTER TABLE miniqueue_jobs ADD CONSTRAINT valid_state
    CHECK (state IN ('available', 'running', 'completed', 'failed', 'dead', 'cancelled', 'waiting', 'expired'));
ALTER TABLE miniqueue_counts DROP CONSTRAINT miniqueue_counts_state_check;
ALTER TABLE miniqueue_counts ADD CONSTRAINT miniqueue_counts_state_check
    CHECK (state IN ('completed', 'failed', 'dead', 'cancelled', 'expired'));
ALTER TABLE miniqueue_finished_minutes DROP CONSTRAINT miniqueue_finished_minutes_state_check;
ALTER TABLE miniqueue_finished_minutes ADD CONSTRAINT miniqueue_finished_minutes_state_check
    CHECK (state IN ('completed', 'failed', 'dead', 'cancelled', 'expired'));

-- Retention prunes expired jobs like the other finished ones.
DROP INDEX idx_miniqueue_jobs_finished;
CREATE INDEX idx_miniqueue_jobs_finished ON miniqueue_jobs (finished_at)
    WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired');

-- Unique keys, held as the comment above says. Inserts name this predicate in their
-- ON CONFLICT, word for word.
CREATE UNIQUE INDEX idx_miniqueue_jobs_unique_key ON miniqueue_jobs (unique_key)
    WHERE unique_key IS NOT NULL
      AND (state IN ('waiting', 'available') AND (attempt = 0 OR unique_while_running)
           OR state = 'running' AND unique_while_running);

-- The jobs waiting their turn in a sequence, by key in enqueue order: the next to run is the
-- first entry of its key, one probe, however long another key's line is.
CREATE INDEX idx_miniqueue_jobs_sequence ON miniqueue_jobs (sequence_key, id)
    WHERE state = 'waiting' AND sequence_key IS NOT NULL;

-- The reaper's: jobs that may still expire, by deadline.
CREATE INDEX idx_miniqueue_jobs_expiring ON miniqueue_jobs (expires_at)
    WHERE expires_at IS NOT NULL AND state IN ('available', 'waiting');

-- What a task declares of its jobs' keys and deadline (miniqueue.core.records.KeyOptions, as a
-- JSON object), so that they apply however the task's jobs are enqueued. NULL: none, or a worker
-- of a version before this one published the task.
ALTER TABLE miniqueue_tasks ADD COLUMN keys JSONB;

-- One row per sequence key. `head` is the job that holds the key: the one running, or due to
-- run next (waiting out a retry, say), or the failed or dead job that blocks the key; NULL when
-- no job holds it. Every other unfinished job of the key is 'waiting' (outside the claim index).
-- The row is the key's lock: an enqueue and a statement that finishes the head both lock it
-- (miniqueue_sequence_advance), so one of them always sees the other's job. `on_failure`, set
-- by the latest enqueue of the key: 'block' (a failed or dead head blocks the key until an
-- operator requeues, cancels or releases it) or 'continue' (the next job runs).
CREATE TABLE miniqueue_sequences (
    key        TEXT        PRIMARY KEY,
    head       BIGINT,
    on_failure TEXT        NOT NULL DEFAULT 'block' CHECK (on_failure IN ('block', 'continue')),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
) WITH (
    -- Rewritten whenever a job of the key is enqueued or finishes: keep it vacuumed, and leave
    -- room on each page for updates that stay on it.
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 200,
    fillfactor = 50
);

-- The time windows of unique keys: no second job of `key` until `until`, whatever the state of
-- the first (`job_id`). The enqueue locks the key's row before it inserts, so two enqueues of
-- one key are serialised here; the reaper drops windows that ended.
CREATE TABLE miniqueue_unique_windows (
    key    TEXT        PRIMARY KEY,
    job_id BIGINT      NOT NULL,
    until  TIMESTAMPTZ NOT NULL
);

-- Hand each given sequence key to its next job when the job holding it let go: it is gone,
-- completed, cancelled or expired, or waiting (a requeued head goes back into line), or it
-- failed or died and the key goes on after a failure (or `force`: an operator's release). The
-- next job is the key's first waiting one; it becomes available (its queue notified on
-- `queue_channel`). Returns how many jobs it made available.
--
-- A function for the reason miniqueue_settle is one: each statement takes a fresh snapshot, so
-- once the key's row is locked it sees every job of the key that was enqueued before, committed
-- or its own. A candidate cancelled meanwhile is passed over on the next round. No step joins
-- one of the statement's CTEs to another: the cached plan of a function's statement expects a
-- row or two from each, and such a join, planned as a nested loop, rescanned the list of the jobs
-- made available once per key (357 ms for 1,000 keys, against about 10).
CREATE FUNCTION miniqueue_sequence_advance(keys TEXT[], queue_channel TEXT, force BOOLEAN DEFAULT false)
RETURNS INT
LANGUAGE plpgsql VOLATILE SET search_path FROM CURRENT AS $$
DECLARE
    pending TEXT[] := keys;
    queues TEXT[];
    total INT := 0;
    n INT;
BEGIN
    PERFORM 1 FROM miniqueue_sequences WHERE key = ANY(keys) ORDER BY key FOR UPDATE;
    WHILE cardinality(pending) > 0 LOOP
        WITH free AS (
            SELECT s.key FROM miniqueue_sequences s LEFT JOIN miniqueue_jobs h ON h.id = s.head
             WHERE s.key = ANY(pending)
               AND (h.id IS NULL OR h.state IN ('completed', 'cancelled', 'expired', 'waiting')
                    OR h.state IN ('failed', 'dead') AND (force OR s.on_failure = 'continue'))
        ), nxt AS (
            SELECT f.key, (SELECT w.id FROM miniqueue_jobs w
                            WHERE w.sequence_key = f.key AND w.state = 'waiting'
                            ORDER BY w.id LIMIT 1) AS id
              FROM free f
        ), made_available AS (
            UPDATE miniqueue_jobs j SET state = 'available', scheduled_at = greatest(j.scheduled_at, now())
              FROM nxt WHERE j.id = nxt.id AND j.state = 'waiting'
            RETURNING j.id, j.queue, j.sequence_key AS key
        ), untaken AS (  -- free keys that got no job: none waits, or its candidate went meanwhile
            SELECT key FROM nxt EXCEPT ALL SELECT key FROM made_available
        ), taken_heads AS (
            UPDATE miniqueue_sequences s SET head = m.id, updated_at = now()
              FROM made_available m WHERE s.key = m.key
            RETURNING s.key
        ), empty_heads AS (
            UPDATE miniqueue_sequences s SET head = NULL, updated_at = now()
              FROM untaken u WHERE s.key = u.key
            RETURNING s.key
        )
        SELECT (SELECT array_agg(DISTINCT queue) FROM made_available),
               coalesce((SELECT array_agg(key) FROM (SELECT key FROM nxt WHERE id IS NOT NULL
                                                      EXCEPT ALL SELECT key FROM made_available) r), '{}'),
               (SELECT count(*) FROM made_available)
          INTO queues, pending, n
         WHERE (SELECT count(*) FROM taken_heads) >= 0 AND (SELECT count(*) FROM empty_heads) >= 0;
        PERFORM pg_notify(queue_channel, q) FROM unnest(queues) AS u(q);
        total := total + n;
        force := false;  -- a released key's next job holds it now
    END LOOP;
    RETURN total;
END
$$;

-- miniqueue_settle gains `sequence_keys`: the keys of the sequenced jobs that just finished,
-- handed on by miniqueue_sequence_advance. (A default, so that the statements of workers of the
-- previous version, which name the other arguments, still call it.)
DROP FUNCTION miniqueue_settle(BIGINT[], BIGINT[], BIGINT[], BIGINT[], TEXT[], TEXT, TEXT);
CREATE FUNCTION miniqueue_settle(
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
            INSERT INTO miniqueue_counts AS k (queue, state, shard, count)
            SELECT queue, 'cancelled', pg_backend_pid() % 64, count(*) FROM cancelled GROUP BY queue
            ON CONFLICT (queue, state, shard) DO UPDATE SET count = k.count + excluded.count
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
