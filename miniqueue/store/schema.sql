-- miniqueue's database schema, written out for reading: every table, column, constraint, index,
-- storage and statistics setting and function that the migrations in `migrations/` leave behind,
-- as of migration 035 (035_priority_aging.sql).
--
-- This file is documentation, not what `miniqueue migrate` runs: migrate applies the numbered
-- files of `migrations/` (and records them in miniqueue_migrations, at the end of this file), and
-- those files say why each change was made. tests/db/test_schema_file.py builds one database from
-- this file and one from the migrations and fails unless the two catalogs describe the same
-- schema, and unless the migration named above is the latest: a new migration must be written
-- in here too.
--
-- Names are unqualified: the tables live in the queue's schema (`--schema`, `public` by default),
-- and migrate runs with search_path pinned to that schema and then pg_catalog, which is what the
-- functions' `SET search_path FROM CURRENT` records. Columns are listed in the order the tables
-- have them (the order the migrations added them), which is the order `SELECT *` returns. The
-- migrations create no triggers, views or types of their own. The history's partitions by finish
-- time are not here: `miniqueue migrate` and the reaper make them as time goes on (see
-- miniqueue.store.history), and record each in miniqueue_history_partitions.


-- ================================================================================================
-- miniqueue_jobs: the queue is this table, one row per job
-- ================================================================================================

-- Partitioned by state: the jobs that can still run are in miniqueue_jobs_live, the hot table
-- every claim reads; a statement that finishes a job moves its row (an UPDATE of its state) to
-- the history, miniqueue_jobs_done or miniqueue_jobs_failed below, and a requeue moves it back.
-- Readers name this table and find a job wherever it is. Ids are unique across the partitions
-- with no index over all of them: every id is drawn from the one sequence, and a row is only
-- ever moved, never copied.
CREATE TABLE miniqueue_jobs (
    -- A BIGSERIAL: bigint fed by the sequence miniqueue_jobs_id_seq (start 1, increment 1,
    -- cache 1), which the column owns. The test kit's clean-up restarts it at 1.
    id               BIGSERIAL,
    queue            TEXT        NOT NULL,
    -- Unique among the jobs that have one, finished or not, through its row in
    -- miniqueue_idempotency_keys (below), which the enqueue takes before it inserts the job.
    idempotency_key  TEXT,
    payload          JSONB       NOT NULL,
    -- One of the states valid_state allows: 'waiting' for parents or its turn in a sequence,
    -- 'available', 'running', or a terminal one. 'cancelled' is an operator's decision, distinct
    -- from 'failed' (the handler said never retry), 'dead' (attempts exhausted) and 'expired'
    -- (not started by its deadline).
    state            TEXT        NOT NULL DEFAULT 'available',
    priority         SMALLINT    NOT NULL DEFAULT 0,
    -- The fencing token: a worker's writes match (id, leased_by, attempt), so it never repeats
    -- for a job. Requeueing raises max_attempts (by attempt_budget) instead of resetting it.
    attempt          INT         NOT NULL DEFAULT 0,
    max_attempts     INT         NOT NULL DEFAULT 5,
    scheduled_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    lease_expires_at TIMESTAMPTZ,
    leased_by        TEXT,
    last_error       TEXT,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at     TIMESTAMPTZ,
    -- The handler's name: jobs are dispatched by it. No default: every enqueue names one.
    task             TEXT        NOT NULL,
    -- Each failed attempt appends {"attempt", "at", "worker", "error"}, in the same UPDATE that
    -- records the failure, so the history never disagrees with the state.
    errors           JSONB       NOT NULL DEFAULT '[]'::jsonb,
    -- When the job reached a terminal state, whichever it was: what retention prunes by.
    finished_at      TIMESTAMPTZ,
    -- The attempts the job was enqueued with; a requeue adds it to max_attempts.
    attempt_budget   INT         NOT NULL,
    -- The limit scopes the job is subject to (rows of miniqueue_limits); NULL for a job without
    -- any, which the claim takes exactly as an unlimited one.
    limits           TEXT[],
    -- What the handler returned, written by the fenced statement that completes the job; NULL
    -- when it returned None.
    result           JSONB,
    -- The job's parents (shown to operators, read by the claim to hand a handler their
    -- results), and a parent's dependents, kept on the parent's row so that a dependent's
    -- enqueue locks it and a completion that waited on that lock sees the new dependent.
    parents          BIGINT[],
    dependents       BIGINT[],
    -- The parents not completed yet; the statement that takes it to 0 makes the job available.
    pending_parents  INT         NOT NULL DEFAULT 0,
    -- Someone waits for this job (Client.wait): finishing it sends a notification on the
    -- finished-jobs channel. Jobs nobody waits for send none.
    awaited          BOOLEAN     NOT NULL DEFAULT false,
    -- The trace context of the span that enqueued the job ({"traceparent", "tracestate", and
    -- baggage when there is some), so that each attempt's span joins the producer's trace (see
    -- miniqueue.observability.tracing). NULL for jobs enqueued without tracing.
    trace_context    JSONB,
    -- The job's unique key: it conflicts with any other job of the key that holds it, as the
    -- unique index idx_miniqueue_jobs_unique_key says (while it waits to run, and while it runs
    -- unless unique_while_running is false).
    unique_key           TEXT,
    unique_while_running BOOLEAN     NOT NULL DEFAULT true,
    -- Jobs of one sequence key run one at a time, in enqueue order (miniqueue_sequences).
    sequence_key         TEXT,
    -- A job not claimed by then never is: the reaper moves it to 'expired'.
    expires_at           TIMESTAMPTZ,
    -- The steps the handler recorded, in order ({"name", "kind", "value" or "timed_out" or
    -- "until", "attempt", "at"}), each appended by a fenced UPDATE; NULL: none (see docs/guides/durable.md).
    steps                JSONB,
    -- The key a parked job waits for: 'waiting' with a signal_key, no lease; its last step is
    -- the wait, marked "waiting" until a signal or its timeout (signal_timeout_at; NULL: none).
    signal_key           TEXT,
    signal_timeout_at    TIMESTAMPTZ,
    -- When a job with parents runs: NULL once every parent completed (a parent that does not
    -- cancels it); 'finished' once every parent finished, in any state; 'failed' once every parent
    -- finished and one did not complete (else it is cancelled). failed_parents counts the parents
    -- that finished without completing.
    run_when             TEXT,
    failed_parents       INT         NOT NULL DEFAULT 0,
    -- What the running handler last reported (job.progress()): {"percent", "meta", "at"}, written
    -- by the heartbeat's fenced lease renewal and once more as the job completes; NULL: none.
    progress             JSONB,
    -- The tokens the job takes from its rate limit's bucket when it is claimed (1 for a job
    -- without one, which no claim reads); checked at enqueue, from 1 to the bucket's size.
    rate_cost            INT         NOT NULL DEFAULT 1,
    -- A job whose worker process died while other handlers ran beside it: none of them was
    -- charged, and it runs alone next (no other handler in its process), so that a death while it
    -- runs is its own. NULL: false.
    run_alone            BOOLEAN,
    -- When the latest run started (the claim sets it); each run's history entry carries its own.
    started_at           TIMESTAMPTZ,
    -- A fair job's key ('' for one without a key) and its turn among its queue's fair jobs (see
    -- miniqueue_rank_fair); NULL for a job that is not fair, which takes its turn by its due time.
    fair_key             TEXT,
    rank_at              TIMESTAMPTZ,
    -- The priority the job was enqueued with, once priority aging raised it (the reaper, in a
    -- queue with age_after); NULL: never raised.
    aged_from            SMALLINT,

    CONSTRAINT positive_attempts CHECK (max_attempts >= 1 AND attempt_budget >= 1),
    CONSTRAINT expires_after_enqueue CHECK (expires_at > created_at),
    CONSTRAINT valid_run_when CHECK (run_when IN ('finished', 'failed')),
    CONSTRAINT valid_state
        CHECK (state IN ('available', 'running', 'completed', 'failed', 'dead', 'cancelled', 'waiting', 'expired'))
) PARTITION BY LIST (state);

-- The hot table: the jobs that can still run.
CREATE TABLE miniqueue_jobs_live PARTITION OF miniqueue_jobs (
    CONSTRAINT miniqueue_jobs_live_pkey PRIMARY KEY (id)
) FOR VALUES IN ('waiting', 'available', 'running') WITH (
    -- Each job is inserted, updated once or twice and moved out: vacuum and analyze the table
    -- early and often (the defaults wait for 20% of the table), and leave room on each page for
    -- updates that stay on their page. The reaper vacuums and analyzes it between autovacuum's
    -- visits.
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0,
    fillfactor = 90
);

-- Planner statistics. The plans of the hot table's statements turn on a few coarse facts (how
-- many rows are available, in which queue, how many carry limits) that a small sample gives as
-- well as the default one: target 10 (ANALYZE samples 300 rows per unit of the largest target).
-- No plan reads a job's contents (payload, result, error history, last error, trace context), so
-- none are collected for them: target 0.
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
    ALTER COLUMN expires_at SET STATISTICS 10,
    ALTER COLUMN steps SET STATISTICS 0,
    ALTER COLUMN signal_key SET STATISTICS 10,
    ALTER COLUMN signal_timeout_at SET STATISTICS 10,
    ALTER COLUMN run_when SET STATISTICS 10,
    ALTER COLUMN failed_parents SET STATISTICS 10,
    ALTER COLUMN progress SET STATISTICS 0,
    ALTER COLUMN rate_cost SET STATISTICS 0,
    ALTER COLUMN run_alone SET STATISTICS 0,
    ALTER COLUMN started_at SET STATISTICS 0,
    ALTER COLUMN fair_key SET STATISTICS 10,
    ALTER COLUMN rank_at SET STATISTICS 0,
    ALTER COLUMN aged_from SET STATISTICS 0;

-- The claim index: available jobs without limits, in the claim's order (priority DESC, then the
-- job's turn: its fair rank, or its due time; then id), so a claim reads the first entries
-- instead of sorting. Partial, so its size never grows with finished rows, nor with a backlog
-- held back by a limit.
CREATE INDEX idx_miniqueue_jobs_claim
    ON miniqueue_jobs_live (queue, priority DESC, (coalesce(rank_at, scheduled_at)), id)
    WHERE state = 'available' AND limits IS NULL;

-- A fair key's available jobs in their order (only fair jobs are in it): for ranking them again
-- when a rule changes the key's weight, and for what `keys list` and `jobs why` say of a key.
CREATE INDEX idx_miniqueue_jobs_fair
    ON miniqueue_jobs_live (queue, fair_key, (coalesce(rank_at, scheduled_at)), id)
    WHERE state = 'available' AND fair_key IS NOT NULL;

-- Available jobs with limits, by their scopes, so that the claim steps from one group of scopes
-- to the next (one probe per group) instead of reading a held-back group's backlog. Disjoint
-- from the claim index: a query over every available job reads both.
CREATE INDEX idx_miniqueue_jobs_limited
    ON miniqueue_jobs_live (queue, limits, priority DESC, scheduled_at, id)
    WHERE state = 'available' AND limits IS NOT NULL;

-- The reaper's: running jobs by lease expiry, to find expired leases without a scan.
CREATE INDEX idx_miniqueue_jobs_expired_leases
    ON miniqueue_jobs_live (lease_expires_at)
    WHERE state = 'running' AND lease_expires_at IS NOT NULL;

-- Waiting jobs by queue, for stats and `jobs list --state waiting`: its size grows with the jobs
-- blocked right now, never with finished rows.
CREATE INDEX idx_miniqueue_jobs_waiting
    ON miniqueue_jobs_live (queue)
    WHERE state = 'waiting';

-- Unique keys: a job holds its key while it waits to run (waiting, or available and never
-- started), and while it runs and waits out its retries unless unique_while_running is false.
-- With running out, "never started" is `attempt = 0`, so no retry can ever collide with a newer
-- job. Inserts name this predicate in their ON CONFLICT, word for word.
CREATE UNIQUE INDEX idx_miniqueue_jobs_unique_key
    ON miniqueue_jobs_live (unique_key)
    WHERE unique_key IS NOT NULL
      AND (state IN ('waiting', 'available') AND (attempt = 0 OR unique_while_running)
           OR state = 'running' AND unique_while_running);

-- The jobs waiting their turn in a sequence, by key in enqueue order: the next to run is the
-- first entry of its key, one probe, however long another key's line is.
CREATE INDEX idx_miniqueue_jobs_sequence
    ON miniqueue_jobs_live (sequence_key, id)
    WHERE state = 'waiting' AND sequence_key IS NOT NULL;

-- The reaper's: jobs that may still expire, by deadline.
CREATE INDEX idx_miniqueue_jobs_expiring
    ON miniqueue_jobs_live (expires_at)
    WHERE expires_at IS NOT NULL AND state IN ('available', 'waiting');

-- The parked jobs (waiting for a signal): by key, oldest first, for the signal that resumes one;
-- and by timeout, for the reaper. A job that never waits for a signal is in neither.
CREATE INDEX idx_miniqueue_jobs_signal
    ON miniqueue_jobs_live (signal_key, id)
    WHERE state = 'waiting' AND signal_key IS NOT NULL;
CREATE INDEX idx_miniqueue_jobs_signal_timeout
    ON miniqueue_jobs_live (signal_timeout_at)
    WHERE state = 'waiting' AND signal_timeout_at IS NOT NULL;

-- The history: finished jobs by finish time, completed and cancelled ones in a partition per
-- hour, failed, dead and expired ones in a partition per day (made ahead by the reaper, dropped
-- whole once past retention), and in the default partition when none was made for the time.
CREATE TABLE miniqueue_jobs_done PARTITION OF miniqueue_jobs FOR VALUES IN ('completed', 'cancelled')
    PARTITION BY RANGE (finished_at);
CREATE TABLE miniqueue_jobs_failed PARTITION OF miniqueue_jobs FOR VALUES IN ('failed', 'dead', 'expired')
    PARTITION BY RANGE (finished_at);
CREATE TABLE miniqueue_jobs_done_default PARTITION OF miniqueue_jobs_done DEFAULT;
CREATE TABLE miniqueue_jobs_failed_default PARTITION OF miniqueue_jobs_failed DEFAULT;

-- A finished job is looked up by id; the idempotency keys of a partition's jobs (few: the index
-- is sparse) are let go before it is dropped.
CREATE INDEX idx_miniqueue_jobs_done_id ON miniqueue_jobs_done (id);
CREATE INDEX idx_miniqueue_jobs_failed_id ON miniqueue_jobs_failed (id);
CREATE INDEX idx_miniqueue_jobs_done_idempotency_key ON miniqueue_jobs_done (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX idx_miniqueue_jobs_failed_idempotency_key ON miniqueue_jobs_failed (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- The history's partitions by finish time, as they were made: what the reaper drops, and when.
-- A partition's name says its table and start (miniqueue_jobs_done_20261201t13,
-- miniqueue_jobs_failed_20261201).
CREATE TABLE miniqueue_history_partitions (
    name      TEXT        PRIMARY KEY,
    class     TEXT        NOT NULL CHECK (class IN ('done', 'failed')),
    starts_at TIMESTAMPTZ NOT NULL,
    ends_at   TIMESTAMPTZ NOT NULL
);

-- Idempotency keys, one row per key held: taken by the enqueue before it inserts the job (which
-- goes in only if it took the key), let go when the job is deleted or pruned. A table of their
-- own, because a key must hold for finished jobs too, and no index spans the partitions.
CREATE TABLE miniqueue_idempotency_keys (
    key    TEXT   PRIMARY KEY,
    job_id BIGINT NOT NULL
);


-- The mailbox: signals sent while no job waited for their key, kept until one does, then
-- delivered once, oldest first. Sender and waiter of a key take the same transaction-scoped
-- advisory lock first, so a signal and a wait that cross are never both left waiting.
CREATE TABLE miniqueue_signals (
    id      BIGSERIAL   PRIMARY KEY,
    key     TEXT        NOT NULL,
    data    JSONB       NOT NULL,
    sent_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX idx_miniqueue_signals_key ON miniqueue_signals (key, id);

-- This database's place in a shard map (see docs/guides/shards.md), recorded when it
-- joins one: its name and index. From then on its job ids are drawn from 2^52 up, each with the
-- index as its residue modulo 1024 (the id sequence's increment and start, set as it joins).
CREATE TABLE miniqueue_shard (
    only_row  BOOLEAN     PRIMARY KEY DEFAULT true CHECK (only_row),
    name      TEXT        NOT NULL,
    idx       INT         NOT NULL CHECK (idx >= 0 AND idx < 1024),
    joined_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- miniqueue_settle: what the jobs that just finished mean for others. Called from a CTE of every
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
--                     its own waiting dependents; but one that runs whatever its parents'
--                     outcome (run_when) counts the parent as finished without completing
--                     (failed_parents) instead, and becomes available at 0 pending
--   sequence_keys     the sequence keys of the jobs that finished: each is handed to its next
--                     job if the job holding it let go (miniqueue_sequence_advance)
--
-- A function because a PL/pgSQL statement takes a fresh snapshot: a dependent enqueued while its
-- parent's completion ran is not in the completion statement's snapshot, so an UPDATE in a plain
-- CTE would miss it and leave it waiting forever. Cancelled dependents are counted in
-- miniqueue_counts, like every other finished job (but not in miniqueue_finished_minutes).
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


-- ================================================================================================
-- Counts of finished jobs, kept by the statements that finish them
-- ================================================================================================

-- Finished jobs per queue and terminal state, so that stats, /metrics and the dashboard need no
-- count(*) over finished rows. The statements that finish, requeue, prune or delete jobs add to
-- it (one upsert per statement, not per job), each to the row of its own shard (the backend's
-- pid modulo 64) so that workers committing at once seldom wait on each other's row lock; a
-- reader sums the shards. Available and running jobs are counted from their partial indexes.
CREATE TABLE miniqueue_counts (
    queue  TEXT        NOT NULL,
    state  TEXT        NOT NULL CHECK (state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')),
    shard  SMALLINT    NOT NULL,
    count  BIGINT      NOT NULL,
    -- The hour (UTC) the counted jobs finished in: dropping a partition of the history deletes
    -- the rows of its hours, without reading the partition. '-infinity': rows finished before
    -- migration 022, until the reaper moves them (and their counts) to the history.
    bucket TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (queue, state, shard, bucket)
) WITH (
    -- Small and updated on every batch: keep it vacuumed.
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 200
);

-- Jobs finished per minute, for the dashboard's throughput chart, counted the same way (one
-- upsert per statement into its shard's row). These count finishing events: a job pruned,
-- requeued or deleted later still finished in its minute (dependents that miniqueue_settle
-- cancels are not among them). The reaper drops minutes older than two hours.
CREATE TABLE miniqueue_finished_minutes (
    minute TIMESTAMPTZ NOT NULL,
    state  TEXT        NOT NULL CHECK (state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')),
    shard  SMALLINT    NOT NULL,
    count  BIGINT      NOT NULL,
    PRIMARY KEY (minute, state, shard)
) WITH (
    -- Small and updated on every batch: keep it vacuumed.
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 200
);


-- ================================================================================================
-- Limits, queues and tasks: what the claim and the producers read
-- ================================================================================================

-- Fleet-wide limits, enforced by the claim, one row per limit scope a job names in its `limits`:
--   * a concurrency scope (max_running set) records the leases holding its slots, as parallel
--     arrays of job id and attempt. A slot is held while that job is running at that attempt,
--     so it is free as soon as the lease ends, with no statement to forget to run; the claim
--     prunes ended holders when it next takes a slot of the scope.
--   * a rate scope (rate set) is a token bucket: `tokens` as of `refilled_at`, refilled at
--     `rate` per second up to `burst`.
-- The claim locks the scope rows it needs (skipping those another claim holds) and takes slots
-- and tokens in the same statement that leases the jobs.
CREATE TABLE miniqueue_limits (
    scope           TEXT        PRIMARY KEY,
    max_running     INT         CHECK (max_running > 0),
    rate            FLOAT8      CHECK (rate > 0),
    burst           FLOAT8      CHECK (burst >= 1),
    tokens          FLOAT8      NOT NULL DEFAULT 0,
    refilled_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    holder_ids      BIGINT[]    NOT NULL DEFAULT '{}',
    holder_attempts INT[]       NOT NULL DEFAULT '{}',
    -- A pause (back-pressure, see migration 027): no job naming this scope is claimed before
    -- `paused_until` (NULL or past: not paused); `paused_by` is the job that paused it last.
    paused_until    TIMESTAMPTZ,
    paused_by       BIGINT,
    -- A scope is either a concurrency scope or a rate scope, and a rate comes with its burst.
    CONSTRAINT miniqueue_limits_check CHECK ((max_running IS NULL) <> (rate IS NULL)),
    CONSTRAINT miniqueue_limits_check1 CHECK ((rate IS NULL) = (burst IS NULL))
) WITH (
    -- Rewritten on every limited claim: keep it vacuumed, and leave half of each page free so
    -- that a rewrite stays on its page (a heap-only update, with no new index entry).
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 200,
    fillfactor = 50
);

-- Back-pressure pauses by key (see migration 029): the latest end of a pause of each key, so that
-- a limit row created while it lasts (by the enqueue of a task's first job of the key) starts
-- paused. The reaper deletes the rows whose pause has ended.
CREATE TABLE miniqueue_pauses (
    key          TEXT        PRIMARY KEY,
    paused_until TIMESTAMPTZ NOT NULL,
    paused_by    BIGINT      NOT NULL
);

-- Queue settings. Absent row = not paused and no cap, so the claim's check is one primary-key
-- probe and queues need no registration.
CREATE TABLE miniqueue_queues (
    name        TEXT        PRIMARY KEY,
    -- A paused queue is claimed by no worker on any host, without stopping the workers.
    paused      BOOLEAN     NOT NULL DEFAULT false,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- A fleet-wide cap on the queue's running jobs (`miniqueue queues limit`): its slots are the
    -- concurrency scope 'queue:<name>' of miniqueue_limits.
    max_running INT         CHECK (max_running > 0),
    -- Every job of the queue is fair (`miniqueue queues fair`): see miniqueue_fair_keys.
    fair        BOOLEAN     NOT NULL DEFAULT false,
    -- Priority aging (`miniqueue queues age`): the reaper raises the queue's due jobs one priority
    -- step per this many seconds due, up to its top; NULL: off.
    age_after   DOUBLE PRECISION CHECK (age_after > 0)
);

-- What each task declares, published by the workers of the apps that run against this database,
-- so that a task's queue, priority, attempts, limits and backoff apply however its jobs are
-- enqueued: a producer without the app (a Client, the CLI, an integration) fills what its caller
-- left unset from here. One row per task; the latest worker to start with a changed declaration
-- rewrites it (see docs/guides/tasks.md). A key computed from each job's
-- payload by a function of the app cannot be computed here: `*_computed` says so, and a producer
-- without the app must pass the key itself.
CREATE TABLE miniqueue_tasks (
    task                     TEXT             PRIMARY KEY,
    queue                    TEXT             NOT NULL,
    priority                 SMALLINT         NOT NULL,
    max_attempts             INT              NOT NULL CHECK (max_attempts > 0),
    concurrency_key          TEXT,
    concurrency_key_computed BOOLEAN          NOT NULL DEFAULT false,
    max_concurrent           INT              CHECK (max_concurrent > 0),
    rate_limit               TEXT,
    rate_limit_key           TEXT,
    rate_limit_key_computed  BOOLEAN          NOT NULL DEFAULT false,
    published_at             TIMESTAMPTZ      NOT NULL DEFAULT now(),
    -- The task's retry backoff, so that an attempt charged without the app (by the supervisor
    -- or the reaper) waits the same delay as one its worker charges (see "Who pays
    -- an attempt" in docs/guarantees.md). NULL: the backoff is a function of the app's own, which only its workers
    -- can apply; elsewhere the default backoff applies.
    backoff_base             DOUBLE PRECISION CHECK (backoff_base > 0),
    backoff_cap              DOUBLE PRECISION CHECK (backoff_cap > 0),
    -- What the task declares of its jobs' keys and deadline (miniqueue.core.records.KeyOptions,
    -- as a JSON object); NULL: none.
    keys                     JSONB,
    -- The tokens each of its jobs takes from its rate limit's bucket; NULL: 1.
    rate_cost                INT              CHECK (rate_cost > 0)
);

-- The delay before retrying `task` after its failed attempt `attempt` (1-based), in seconds:
-- uniform in [0, min(cap, base * 2^attempt)], with the task's published base and cap, or the
-- defaults given (those of miniqueue.core.backoff) for a task that published none.
CREATE FUNCTION miniqueue_retry_delay(task TEXT, attempt INT, default_base DOUBLE PRECISION,
                                      default_cap DOUBLE PRECISION) RETURNS DOUBLE PRECISION
LANGUAGE sql VOLATILE SET search_path FROM CURRENT AS $$
    SELECT random() * least(coalesce(max(t.backoff_cap), default_cap),
                            coalesce(max(t.backoff_base), default_base) * 2.0 ^ least(greatest(attempt, 1), 64))
      FROM miniqueue_tasks t WHERE t.task = miniqueue_retry_delay.task
$$;

-- The queues some worker has served, and when one last started serving each: a job waiting in a
-- queue that no worker has ever served is shown as such (`miniqueue stats`, the dashboard).
CREATE TABLE miniqueue_served_queues (
    queue     TEXT        PRIMARY KEY,
    served_at TIMESTAMPTZ NOT NULL DEFAULT now()
);


-- ================================================================================================
-- Sequences and unique keys' windows
-- ================================================================================================

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


-- ================================================================================================
-- Periodic schedules and the process registry
-- ================================================================================================

-- The last cron slot enqueued for each periodic schedule. A scheduler claims a slot by advancing
-- last_slot with a conditional upsert in the same transaction as the enqueue, so each slot is
-- enqueued once however many schedulers (hosts) run, with no leader election; and the record
-- outlives the pruning of the job it made.
CREATE TABLE miniqueue_periodic (
    name       TEXT        PRIMARY KEY,
    last_slot  TIMESTAMPTZ NOT NULL,
    enabled    BOOLEAN     NOT NULL DEFAULT true,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Periodic schedules created at run time (client.schedules, `miniqueue periodic add`): only the
-- definition; whether one is enabled and its last slot are its row in miniqueue_periodic, so
-- runtime and code schedules share one namespace and one claim. Every reaper reads the table once
-- a pass; a scheduler claims a slot only while the definition it read (updated_at) is still the
-- stored one, so a change or a delete takes effect at the next pass (migration 026).
CREATE TABLE miniqueue_schedules (
    name       TEXT             PRIMARY KEY,
    cron       TEXT             NOT NULL,
    task       TEXT             NOT NULL,
    payload    JSONB,
    timezone   TEXT             NOT NULL DEFAULT 'UTC',
    catch_up   TEXT             NOT NULL DEFAULT 'skip' CHECK (catch_up IN ('latest', 'skip')),
    grace      DOUBLE PRECISION NOT NULL DEFAULT 300 CHECK (grace >= 0),
    created_at TIMESTAMPTZ      NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ      NOT NULL DEFAULT now()
);

-- Supervisors and their children, refreshed by each supervisor every few seconds, so that
-- dashboards show every host's processes from the one place they all share. Rows not refreshed
-- for a while belong to a supervisor that is gone.
CREATE TABLE miniqueue_processes (
    id           TEXT        PRIMARY KEY,   -- worker id, or host:pid of a supervisor or reaper
    supervisor   TEXT        NOT NULL,      -- the supervisor's id (itself for a supervisor row)
    kind         TEXT        NOT NULL CHECK (kind IN ('supervisor', 'worker', 'reaper')),
    host         TEXT        NOT NULL,
    pid          INT         NOT NULL,
    title        TEXT        NOT NULL,
    started_at   TIMESTAMPTZ NOT NULL,
    last_seen    TIMESTAMPTZ NOT NULL DEFAULT now(),
    rss_bytes    BIGINT,
    jobs_done    BIGINT      NOT NULL DEFAULT 0,
    restarts     INT         NOT NULL DEFAULT 0,
    current_jobs BIGINT[]    NOT NULL DEFAULT '{}',
    queues       TEXT[],                    -- a worker's queues (NULL: not reported)
    tasks        TEXT[],                    -- the tasks a worker's app declares (NULL: not reported)
    -- The jobs a worker finished per second over its supervisor's last refresh (NULL: not known).
    jobs_per_second DOUBLE PRECISION
);

CREATE INDEX idx_miniqueue_processes_supervisor ON miniqueue_processes (supervisor);

-- Autoscaling (docs/operations/autoscaling.md), at a cost that does not grow with the backlog.
-- The backlog of `queues`, from the first `walk` available jobs in the claim's order (jobs
-- without limits first): `due`, how many of them are due now; `walked`, how many were read (at
-- `walk`, `due` is a lower bound); `oldest_seconds`, how long the oldest due one among them has
-- been due (0: none); `running`, the queues' running jobs (up to `walk`).
CREATE FUNCTION miniqueue_backlog(queues TEXT[], walk INT DEFAULT 10000,
                                  OUT due BIGINT, OUT walked BIGINT, OUT oldest_seconds DOUBLE PRECISION,
                                  OUT running BIGINT)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT count(*) FILTER (WHERE a.scheduled_at <= now()), count(*),
           coalesce(extract(epoch FROM now() - min(a.scheduled_at) FILTER (WHERE a.scheduled_at <= now())), 0)::float8,
           (SELECT count(*) FROM (SELECT 1 FROM miniqueue_jobs r
                                   WHERE r.state = 'running' AND r.lease_expires_at IS NOT NULL
                                     AND r.queue = ANY(miniqueue_backlog.queues)
                                   LIMIT miniqueue_backlog.walk) r)
      FROM (SELECT u.scheduled_at FROM (
                SELECT j.scheduled_at FROM miniqueue_jobs j
                 WHERE j.state = 'available' AND j.limits IS NULL AND j.queue = ANY(miniqueue_backlog.queues)
                UNION ALL
                SELECT j.scheduled_at FROM miniqueue_jobs j
                 WHERE j.state = 'available' AND j.limits IS NOT NULL AND j.queue = ANY(miniqueue_backlog.queues)) u
             LIMIT miniqueue_backlog.walk) a
$$;

-- How many worker processes would drain `queues` within `target_seconds`, at the rate their live
-- workers (those seen in the last 30 s that serve one of them) finished jobs lately, at most
-- `max_workers`: 0 when nothing is due or running; while nothing is due, as many as run jobs;
-- while the rate is not known (no worker yet), one more than the workers there are, at least 1;
-- else the due jobs over what one worker drains in `target_seconds`, and one more than the
-- workers there are whenever the oldest due job has waited longer than `target_seconds`.
CREATE FUNCTION miniqueue_desired_workers(queues TEXT[], target_seconds DOUBLE PRECISION,
                                          max_workers INT DEFAULT 100) RETURNS INT
LANGUAGE plpgsql STABLE SET search_path FROM CURRENT AS $$
DECLARE
    b record;
    workers BIGINT;
    rate DOUBLE PRECISION;
    late BOOLEAN;
BEGIN
    IF target_seconds IS NULL OR NOT target_seconds > 0 THEN
        RAISE EXCEPTION 'target_seconds % is invalid: use a positive number of seconds', target_seconds
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF max_workers IS NULL OR max_workers < 1 THEN
        RAISE EXCEPTION 'max_workers % is invalid: use 1 or more', max_workers
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT * INTO b FROM miniqueue_backlog(queues);
    SELECT count(*), coalesce(sum(p.jobs_per_second), 0) INTO workers, rate
      FROM miniqueue_processes p
     WHERE p.kind = 'worker' AND p.queues && miniqueue_desired_workers.queues
       AND p.last_seen > now() - interval '30 seconds';
    late := b.oldest_seconds > target_seconds;
    IF b.due = 0 THEN
        RETURN least(max_workers, CASE WHEN b.running = 0 THEN 0 ELSE greatest(least(workers, b.running), 1) END);
    ELSIF rate <= 0 THEN
        RETURN least(max_workers, greatest(workers + 1, 1));
    END IF;
    RETURN least(max_workers, greatest(
        ceil(b.due * workers / (rate * target_seconds))::BIGINT,
        CASE WHEN late THEN workers + 1 ELSE 1 END,
        1));
END
$$;


-- ================================================================================================
-- Fair share by key (docs/guides/fairness.md)
-- ================================================================================================

-- Each fair key of each queue: its weight (from the rule that matches it, else 1) and its next
-- turn. Written by the enqueue of its jobs (one row per key, locked in key order by each enqueue
-- that ranks a job of the key) and by a rule's change.
CREATE TABLE miniqueue_fair_keys (
    queue   TEXT             NOT NULL,
    key     TEXT             NOT NULL,
    weight  DOUBLE PRECISION NOT NULL DEFAULT 1 CHECK (weight > 0),
    next_at TIMESTAMPTZ      NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (queue, key)
);
CREATE INDEX idx_miniqueue_fair_keys_next ON miniqueue_fair_keys (queue, next_at);

-- Rules by key pattern (`miniqueue keys set`): the limit on running jobs and the weight of every
-- key the pattern matches (`like`: the pattern as a LIKE pattern, `*` matching any characters).
-- A key takes each of the two from the most specific rule that sets it: a pattern without `*`
-- (the key itself) first, then the longest pattern.
CREATE TABLE miniqueue_key_rules (
    pattern     TEXT             PRIMARY KEY,
    "like"      TEXT             NOT NULL,
    max_running INT              CHECK (max_running > 0),
    weight      DOUBLE PRECISION CHECK (weight > 0),
    set_at      TIMESTAMPTZ      NOT NULL DEFAULT now(),
    CHECK (max_running IS NOT NULL OR weight IS NOT NULL)
);

-- The weight and the limit the rules give `key` (NULL: no rule sets it).
CREATE FUNCTION miniqueue_key_rule(key TEXT, OUT weight DOUBLE PRECISION, OUT max_running INT)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $$
    SELECT (SELECT r.weight FROM miniqueue_key_rules r
             WHERE r.weight IS NOT NULL AND miniqueue_key_rule.key LIKE r."like"
             ORDER BY strpos(r.pattern, '*') = 0 DESC, length(r.pattern) DESC LIMIT 1),
           (SELECT r.max_running FROM miniqueue_key_rules r
             WHERE r.max_running IS NOT NULL AND miniqueue_key_rule.key LIKE r."like"
             ORDER BY strpos(r.pattern, '*') = 0 DESC, length(r.pattern) DESC LIMIT 1)
$$;

-- Rank the fair jobs `ids`, just inserted, each of the key at the same place in `keys`: per queue
-- and key, in id order, from the key's next turn or the queue's current one, whichever is later,
-- one quantum (1 ms) over the key's weight apart; and give each job whose key a rule limits the
-- key's limit (the scope 'concurrency * <key>', over every task). The key rows are locked in
-- order, so two enqueues of the same keys wait for each other rather than deadlock, and the
-- second ranks after the first. The jobs are looked up by `j.id = ANY(ids)`, which the planner
-- reads as probes of the primary key (a join on the unnested ids alone it may hash over a scan of
-- the whole backlog); each call is planned for its arrays (a generic plan, guessing ten jobs,
-- compared every job with every other). A transaction reads a queue's current turn once and keeps it
-- (a setting local to the transaction): the jobs it ranked in an earlier call left versions
-- without a rank at the head of the claim index, which a later call's probe would walk past, a
-- walk that grows with every call. Returns the jobs ranked.
CREATE FUNCTION miniqueue_rank_fair(ids BIGINT[], keys TEXT[]) RETURNS INT
LANGUAGE plpgsql SET search_path FROM CURRENT SET plan_cache_mode = force_custom_plan AS $$
DECLARE
    ranked INT;
BEGIN
    INSERT INTO miniqueue_fair_keys AS k (queue, key, weight)
    SELECT DISTINCT j.queue, u.key, coalesce((miniqueue_key_rule(u.key)).weight, 1)
      FROM unnest(ids, keys) AS u(id, key) JOIN miniqueue_jobs_live j ON j.id = u.id
     WHERE j.id = ANY(ids)
     ORDER BY 1, 2
    ON CONFLICT (queue, key) DO UPDATE SET key = excluded.key;

    WITH fresh AS (
        SELECT j.id, j.queue, u.key, j.limits,
               row_number() OVER (PARTITION BY j.queue, u.key ORDER BY j.id) AS n
          FROM unnest(ids, keys) AS u(id, key) JOIN miniqueue_jobs_live j ON j.id = u.id
         WHERE j.id = ANY(ids) AND j.state IN ('waiting', 'available')
    ), clock AS (
        SELECT q.queue, coalesce(
                   nullif(current_setting(q.kept, true), '')::timestamptz,
                   set_config(q.kept, coalesce(
                       (SELECT coalesce(h.rank_at, h.scheduled_at) FROM miniqueue_jobs_live h
                         WHERE h.state = 'available' AND h.limits IS NULL AND h.queue = q.queue AND h.rank_at IS NOT NULL
                         ORDER BY h.priority DESC, coalesce(h.rank_at, h.scheduled_at), h.id LIMIT 1),
                       (SELECT k.next_at FROM miniqueue_fair_keys k WHERE k.queue = q.queue AND k.next_at > '-infinity'
                         ORDER BY k.next_at DESC LIMIT 1),
                       now())::text, true)::timestamptz) AS now_at
          FROM (SELECT DISTINCT queue, 'miniqueue.fair_clock_' || md5(queue) AS kept FROM fresh) q
    ), ranked AS (
        -- Each job with its key's first turn and step: a probe of the key's row per job, whatever
        -- the planner guesses of the arrays' sizes.
        SELECT f.id, f.queue, f.key, f.n, greatest(k.next_at, c.now_at) AS first_at,
               interval '1 millisecond' / k.weight AS step, (miniqueue_key_rule(f.key)).max_running AS max_running
          FROM fresh f JOIN clock c ON c.queue = f.queue
          JOIN miniqueue_fair_keys k ON k.queue = f.queue AND k.key = f.key
    ), scoped AS (
        INSERT INTO miniqueue_limits AS l (scope, max_running)
        SELECT DISTINCT 'concurrency * ' || r.key, r.max_running FROM ranked r WHERE r.max_running IS NOT NULL
         ORDER BY 1
        ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running
         WHERE l.max_running IS DISTINCT FROM excluded.max_running
    ), stamped AS (
        UPDATE miniqueue_jobs_live j
           SET rank_at = r.first_at + r.step * (r.n - 1), fair_key = r.key,
               limits = CASE WHEN r.max_running IS NULL THEN j.limits
                             ELSE ARRAY(SELECT DISTINCT s FROM unnest(coalesce(j.limits, '{}') || ('concurrency * ' || r.key)) AS s
                                         ORDER BY s) END
          FROM ranked r
         WHERE j.id = r.id AND j.id = ANY(ids)
        RETURNING r.queue, r.key, r.first_at, r.step
    ), moved AS (
        UPDATE miniqueue_fair_keys k SET next_at = s.first_at + s.step * s.n
          FROM (SELECT queue, key, min(first_at) AS first_at, min(step) AS step, count(*) AS n
                  FROM stamped GROUP BY queue, key) s
         WHERE k.queue = s.queue AND k.key = s.key
    )
    SELECT count(*) INTO ranked FROM stamped;
    RETURN ranked;
END
$$;

-- Apply the rules again to the keys a pattern matches (its LIKE form, `matching`), after a rule
-- of that pattern was set or removed: each matching key's weight, with its available jobs ranked
-- again from the first one's turn, the new weight apart (so a new weight holds from the next
-- claim, not only for jobs enqueued after); and each matching key's limit, on its limit row and on
-- its fair jobs that wait (a key no rule limits any more: its jobs lose the scope, and run
-- without it). Returns the jobs changed.
CREATE FUNCTION miniqueue_apply_key_rules(matching TEXT) RETURNS INT
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
    changed INT;
    limited INT;
BEGIN
    WITH weighed AS (
        UPDATE miniqueue_fair_keys k SET weight = coalesce((miniqueue_key_rule(k.key)).weight, 1)
         WHERE k.key LIKE matching AND k.weight <> coalesce((miniqueue_key_rule(k.key)).weight, 1)
        RETURNING k.queue, k.key, interval '1 millisecond' / k.weight AS step
    ), queued AS (
        SELECT j.id, w.queue, w.key, w.step,
               min(coalesce(j.rank_at, j.scheduled_at)) OVER (PARTITION BY w.queue, w.key) AS first_at,
               row_number() OVER (PARTITION BY w.queue, w.key ORDER BY coalesce(j.rank_at, j.scheduled_at), j.id) AS n
          FROM weighed w JOIN miniqueue_jobs_live j
            ON j.state = 'available' AND j.queue = w.queue AND j.fair_key = w.key
    ), ranked AS (
        UPDATE miniqueue_jobs_live j SET rank_at = q.first_at + q.step * (q.n - 1)
          FROM queued q WHERE j.id = q.id AND j.state = 'available'
        RETURNING q.queue, q.key, q.first_at + q.step * q.n AS next_at
    ), moved AS (
        UPDATE miniqueue_fair_keys k SET next_at = r.next_at
          FROM (SELECT queue, key, max(next_at) AS next_at FROM ranked GROUP BY queue, key) r
         WHERE k.queue = r.queue AND k.key = r.key
    )
    SELECT count(*) INTO changed FROM ranked;

    WITH rules AS (
        SELECT k.key, 'concurrency * ' || k.key AS scope, (miniqueue_key_rule(k.key)).max_running AS max_running
          FROM (SELECT DISTINCT key FROM miniqueue_fair_keys WHERE key LIKE matching) k
    ), scoped AS (
        INSERT INTO miniqueue_limits AS l (scope, max_running)
        SELECT scope, max_running FROM rules WHERE max_running IS NOT NULL ORDER BY scope
        ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running
         WHERE l.max_running IS DISTINCT FROM excluded.max_running
    ), relimited AS (
        UPDATE miniqueue_jobs_live j
           SET limits = CASE WHEN r.max_running IS NULL THEN nullif(array_remove(j.limits, r.scope), '{}')
                             ELSE ARRAY(SELECT DISTINCT s FROM unnest(coalesce(j.limits, '{}') || r.scope) AS s ORDER BY s) END
          FROM rules r
         WHERE j.fair_key = r.key AND j.state IN ('waiting', 'available')
           AND (r.max_running IS NULL) = (r.scope = ANY(coalesce(j.limits, '{}')))
        RETURNING j.id
    )
    SELECT count(*) INTO limited FROM relimited;
    RETURN changed + limited;
END
$$;


-- ================================================================================================
-- miniqueue_migrations: the migrations applied
-- ================================================================================================

-- Created by `miniqueue migrate` itself (miniqueue.store.store), not by a migration file: one row
-- per migration applied, which is how migrate knows what is pending and `check_schema_version`
-- whether the schema is up to date. A database built from this file has it empty, so migrate
-- would try to apply every migration to it (and fail on the first).
CREATE TABLE miniqueue_migrations (
    version      INT         PRIMARY KEY,
    name         TEXT        NOT NULL,
    applied_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- The oldest workers' version (their latest migration) that can serve the schema once this
    -- migration is applied, from its file's `-- miniqueue: workers from NNN` line; NULL: any.
    workers_from INT
);
