-- Durable jobs: a handler's steps recorded on its job's row, durable sleep, and jobs parked until
-- a signal (see "Durable jobs" in README.md and docs/guides/durable.md).
--
-- steps: the steps a handler recorded, in the order it ran them, each an object: its "name", its
-- "kind" ('step', 'sleep' or 'signal'), what it gave ("value"; a signal that timed out has
-- "timed_out" instead; a sleep its "until"), the "attempt" that recorded it and when ("at"). A
-- step is appended by a fenced UPDATE of the row (the worker and attempt that hold it), so a
-- stale attempt can never record one; the row carries its steps into the history and back on a
-- requeue, and they go with it when it is pruned. NULL: no step recorded.
--
-- signal_key: the key a parked job waits for. A parked job is 'waiting' with a signal_key, its
-- lease given up; its last step is the wait, marked "waiting" until a signal or its timeout
-- (signal_timeout_at; NULL: none) resolves it.
ALTER TABLE miniqueue_jobs ADD COLUMN steps JSONB, ADD COLUMN signal_key TEXT, ADD COLUMN signal_timeout_at TIMESTAMPTZ;
ALTER TABLE miniqueue_jobs_live
    ALTER COLUMN steps SET STATISTICS 0,
    ALTER COLUMN signal_key SET STATISTICS 10,
    ALTER COLUMN signal_timeout_at SET STATISTICS 10;

-- Workflows that survive failure. run_when: when a job with parents runs. NULL once every parent
-- completed (a parent that does not cancels it, as before); 'finished' once every parent finished,
-- in any state (allow_failure, a group's on_complete); 'failed' once every parent finished and one
-- did not complete (a group's on_failure; cancelled if all completed). failed_parents counts the
-- parents that finished without completing (miniqueue_settle, below).
ALTER TABLE miniqueue_jobs ADD COLUMN run_when TEXT, ADD COLUMN failed_parents INT NOT NULL DEFAULT 0,
    ADD CONSTRAINT valid_run_when CHECK (run_when IN ('finished', 'failed'));
ALTER TABLE miniqueue_jobs_live
    ALTER COLUMN run_when SET STATISTICS 10,
    ALTER COLUMN failed_parents SET STATISTICS 10;

-- The parked jobs: by key, oldest first, for the signal that resumes one; and by timeout, for
-- the reaper. Both partial: a job that never waits for a signal is in neither.
CREATE INDEX idx_miniqueue_jobs_signal
    ON miniqueue_jobs_live (signal_key, id)
    WHERE state = 'waiting' AND signal_key IS NOT NULL;
CREATE INDEX idx_miniqueue_jobs_signal_timeout
    ON miniqueue_jobs_live (signal_timeout_at)
    WHERE state = 'waiting' AND signal_timeout_at IS NOT NULL;

-- The mailbox: signals sent while no job waited for their key, kept until one does, and then
-- delivered once, oldest first. Sender and waiter of a key take the same transaction-scoped
-- advisory lock first, so a signal and a wait that cross are never both left waiting.
CREATE TABLE miniqueue_signals (
    id      BIGSERIAL   PRIMARY KEY,
    key     TEXT        NOT NULL,
    data    JSONB       NOT NULL,
    sent_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX idx_miniqueue_signals_key ON miniqueue_signals (key, id);

-- A parked job keeps its sequence key: it is still the key's head, and it is not the next job
-- in line either (it resumes on its signal or its timeout, never by the sequence).
CREATE OR REPLACE FUNCTION miniqueue_sequence_advance(keys TEXT[], queue_channel TEXT, force BOOLEAN DEFAULT false)
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
               AND (h.id IS NULL OR h.state IN ('completed', 'cancelled', 'expired')
                    OR h.state = 'waiting' AND h.signal_key IS NULL
                    OR h.state IN ('failed', 'dead') AND (force OR s.on_failure = 'continue'))
        ), nxt AS (
            SELECT f.key, (SELECT w.id FROM miniqueue_jobs w
                            WHERE w.sequence_key = f.key AND w.state = 'waiting' AND w.signal_key IS NULL
                            ORDER BY w.id LIMIT 1) AS id
              FROM free f
        ), made_available AS (
            UPDATE miniqueue_jobs j SET state = 'available', scheduled_at = greatest(j.scheduled_at, now())
              FROM nxt WHERE j.id = nxt.id AND j.state = 'waiting' AND j.signal_key IS NULL
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

-- A dependent that runs whatever its parents' outcome is released, not cancelled, by a parent
-- that does not complete; an on-failure dependent whose parents all completed is cancelled.
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
    unneeded BIGINT[];
    unneeded_children BIGINT[];
    unneeded_parents BIGINT[];
BEGIN
    PERFORM pg_notify(channel, id::text) FROM unnest(notify_ids) AS u(id);

    -- A job that runs only if a parent did not complete (run_when 'failed') and whose parents all
    -- completed is not needed: it is cancelled, and its own dependents after it.
    WITH released_jobs AS (
        UPDATE miniqueue_jobs j
           SET pending_parents = j.pending_parents - r.n,
               state = CASE WHEN j.pending_parents - r.n > 0 THEN 'waiting'
                            WHEN j.run_when = 'failed' AND j.failed_parents = 0 THEN 'cancelled'
                            ELSE 'available' END,
               scheduled_at = CASE WHEN j.pending_parents - r.n <= 0 THEN greatest(j.scheduled_at, now())
                                   ELSE j.scheduled_at END,
               finished_at = CASE WHEN j.pending_parents - r.n <= 0 AND j.run_when = 'failed' AND j.failed_parents = 0
                                  THEN now() END,
               last_error = CASE WHEN j.pending_parents - r.n <= 0 AND j.run_when = 'failed' AND j.failed_parents = 0
                                 THEN 'cancelled: every parent completed, and it runs only if one does not'
                                 ELSE j.last_error END
          FROM (SELECT child, count(*)::int AS n FROM unnest(released) AS u(child) GROUP BY child) r
         WHERE j.id = r.child AND j.state = 'waiting'
        RETURNING j.id, j.queue, j.state, j.dependents, j.awaited
    ), counted AS (
        INSERT INTO miniqueue_counts AS k (queue, state, shard, bucket, count)
        SELECT queue, 'cancelled', pg_backend_pid() % 64, date_trunc('hour', now(), 'UTC'), count(*)
          FROM released_jobs WHERE state = 'cancelled' GROUP BY queue
        ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = k.count + excluded.count
    )
    SELECT array_agg(DISTINCT queue) FILTER (WHERE state = 'available'), count(*),
           coalesce(array_agg(id) FILTER (WHERE state = 'cancelled'), '{}'),
           coalesce(array_agg(id) FILTER (WHERE state = 'cancelled' AND awaited), '{}')
      INTO queues, n, unneeded, waited FROM released_jobs;
    PERFORM pg_notify(queue_channel, q) FROM unnest(queues) AS u(q);
    PERFORM pg_notify(channel, id::text) FROM unnest(waited) AS u(id);
    settled := settled + n;
    IF cardinality(unneeded) > 0 THEN  -- their dependents go too, in (parent, dependent) order
        SELECT coalesce(array_agg(d ORDER BY j.id, d), '{}'), coalesce(array_agg(j.id ORDER BY j.id, d), '{}')
          INTO unneeded_children, unneeded_parents
          FROM miniqueue_jobs j, unnest(j.dependents) AS d WHERE j.id = ANY(unneeded);
        children := children || unneeded_children;
        parents := coalesce(parents, '{}') || unneeded_parents;
        states := coalesce(states, '{}') || array_fill('cancelled'::text, ARRAY[cardinality(unneeded_children)]);
    END IF;

    -- Cancel dependents, then theirs, until none is left waiting on a cancelled job. A dependent
    -- that runs whatever its parents' outcome (run_when 'finished' or 'failed') is not cancelled:
    -- it has one parent fewer to wait for, and one more that did not complete.
    WHILE cardinality(children) > 0 LOOP
        WITH tolerant AS (
            UPDATE miniqueue_jobs j
               SET pending_parents = j.pending_parents - r.n, failed_parents = j.failed_parents + r.n,
                   state = CASE WHEN j.pending_parents - r.n <= 0 THEN 'available' ELSE 'waiting' END,
                   scheduled_at = CASE WHEN j.pending_parents - r.n <= 0 THEN greatest(j.scheduled_at, now())
                                       ELSE j.scheduled_at END
              FROM (SELECT child, count(*)::int AS n FROM unnest(children) AS u(child) GROUP BY child) r
             WHERE j.id = r.child AND j.state = 'waiting' AND j.run_when IS NOT NULL
            RETURNING j.queue, j.state
        ), cancelled AS (
            UPDATE miniqueue_jobs j
               SET state = 'cancelled', finished_at = now(), pending_parents = 0,
                   last_error = c.reason,
                   errors = j.errors || jsonb_build_array(jsonb_build_object(
                       'attempt', j.attempt, 'at', now(), 'worker', NULL, 'error', c.reason))
              FROM (SELECT DISTINCT ON (child) child, format('cancelled: its parent job %s %s', parent,
                           CASE WHEN state = 'deleted' THEN 'was deleted unfinished' ELSE 'ended ' || state END) AS reason
                      FROM unnest(children, parents, states) AS u(child, parent, state)
                     ORDER BY child, parent) c
             WHERE j.id = c.child AND j.state = 'waiting' AND j.run_when IS NULL
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
               count(DISTINCT c.id) + (SELECT count(*) FROM tolerant),
               (SELECT array_agg(DISTINCT queue) FILTER (WHERE state = 'available') FROM tolerant)
          INTO children, parents, waited, n, queues
          FROM cancelled c LEFT JOIN LATERAL unnest(c.dependents) AS d(child) ON true;
        states := array_fill('cancelled'::text, ARRAY[cardinality(children)]);
        PERFORM pg_notify(channel, id::text) FROM unnest(waited) AS u(id);
        PERFORM pg_notify(queue_channel, q) FROM unnest(queues) AS u(q);
        settled := settled + n;
    END LOOP;

    IF cardinality(sequence_keys) > 0 THEN
        settled := settled + miniqueue_sequence_advance(sequence_keys, queue_channel);
    END IF;
    RETURN settled;
END
$$;
