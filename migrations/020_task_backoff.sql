-- A task's retry backoff, published with its declaration, so that an attempt charged without
-- the app (a crashed worker's job, charged by the supervisor; an expired lease, by the reaper)
-- waits the same full-jitter delay as one the worker charges (see the README's "Who pays an
-- attempt"). NULL: the task's backoff is a function of its app's own, which only its workers
-- can apply; elsewhere the default backoff applies.
ALTER TABLE miniqueue_tasks ADD COLUMN backoff_base DOUBLE PRECISION CHECK (backoff_base > 0),
                            ADD COLUMN backoff_cap  DOUBLE PRECISION CHECK (backoff_cap > 0);

-- The delay before retrying `task` after its failed attempt `attempt` (1-based), in seconds:
-- uniform in [0, min(cap, base * 2^attempt)], the task's published base and cap, or the
-- defaults given (those of miniqueue.retry) for a task that published none.
CREATE FUNCTION miniqueue_retry_delay(task TEXT, attempt INT, default_base DOUBLE PRECISION,
                                      default_cap DOUBLE PRECISION) RETURNS DOUBLE PRECISION
LANGUAGE sql VOLATILE SET search_path FROM CURRENT AS $$
    SELECT random() * least(coalesce(max(t.backoff_cap), default_cap),
                            coalesce(max(t.backoff_base), default_base) * 2.0 ^ least(greatest(attempt, 1), 64))
      FROM miniqueue_tasks t WHERE t.task = miniqueue_retry_delay.task
$$;
