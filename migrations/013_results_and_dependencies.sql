-- Results and dependencies.
--
-- result: what the handler returned (JSON), written by the same fenced statement that
-- completes the job, so a completed job and its result commit together. NULL when the handler
-- returned None. Pruned with the row.
ALTER TABLE miniqueue_jobs ADD COLUMN result JSONB;

-- A job may wait for other jobs (its parents) to complete. It is then 'waiting', a state
-- outside the claim index (which holds state = 'available' only), so claims never see it and
-- need no change. pending_parents counts the parents not completed yet; the statement that
-- completes a parent decrements it, and the one that takes it to 0 makes the job available:
-- in the parent's transaction, with no scan and no timer.
--
-- parents is the child's list (shown to operators, and read by the claim to hand a handler
-- its parents' results); dependents is the parent's list, kept on the parent's row on purpose:
-- a dependent's enqueue appends to it, which locks the parent row, and a completion that
-- waited on that lock reads the row's newest version, so it always learns of a dependent
-- enqueued while it ran (see miniqueue_settle below for the rest of that argument).
ALTER TABLE miniqueue_jobs ADD COLUMN parents BIGINT[];
ALTER TABLE miniqueue_jobs ADD COLUMN dependents BIGINT[];
ALTER TABLE miniqueue_jobs ADD COLUMN pending_parents INT NOT NULL DEFAULT 0;

-- Someone is waiting for this job to finish (Client.wait): the statement that finishes it
-- sends a notification on the finished-jobs channel. Jobs nobody waits for send none, so the
-- drain pays nothing for the feature.
ALTER TABLE miniqueue_jobs ADD COLUMN awaited BOOLEAN NOT NULL DEFAULT false;

ALTER TABLE miniqueue_jobs DROP CONSTRAINT valid_state;
ALTER TABLE miniqueue_jobs ADD CONSTRAINT valid_state
    CHECK (state IN ('available', 'running', 'completed', 'failed', 'dead', 'cancelled', 'waiting'));

-- Waiting jobs by queue, for stats and `jobs list --state waiting`: its size grows with the
-- jobs blocked right now, never with finished rows.
CREATE INDEX idx_miniqueue_jobs_waiting ON miniqueue_jobs (queue) WHERE state = 'waiting';

-- Settle what the jobs that just finished mean for others: called from a CTE of every
-- statement that finishes jobs (complete, fail, record failures, recover, cancel, delete), and
-- only when one of them has dependents or a waiter.
--
--   notify_ids        finished jobs someone waits for: one notification each on `channel`
--   released          one entry per (completed parent, dependent): the dependent's
--                     pending_parents goes down by the number of its entries, and it becomes
--                     available (and its queue is notified on `queue_channel`) at 0
--   cancel_children,  a dependent of a parent that ended failed, dead or cancelled (or was
--   cancel_parents,   deleted unfinished), with that parent and how it ended: the dependent
--   cancel_states     is cancelled with an error naming the parent, and so, in turn, are
--                     its own waiting dependents
--
-- Why a function: a PL/pgSQL statement takes a fresh snapshot. A dependent enqueued while
-- its parent's completion ran (the completion waited on the parent row the enqueue locked) is
-- not in the completion statement's snapshot, so an UPDATE in a plain CTE would miss it and
-- leave it waiting forever; the function's UPDATE sees it. The parent row itself needs no
-- fresh snapshot: the completion read its newest version (dependents included) when it
-- updated it.
--
-- Cancelled dependents are counted in miniqueue_counts (see migration 011), like every other
-- finished job.
CREATE FUNCTION miniqueue_settle(
    notify_ids BIGINT[], released BIGINT[], cancel_children BIGINT[], cancel_parents BIGINT[],
    cancel_states TEXT[], channel TEXT, queue_channel TEXT
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
    RETURN settled;
END
$$;
