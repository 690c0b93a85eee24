-- Autoscaling (see docs/operations/autoscaling.md): how far behind a set of queues is, and how
-- many worker processes would drain it in time, read at a cost that does not grow with the
-- backlog, for `miniqueue-supervise --workers MIN:MAX` and for any autoscaler that runs SQL.

-- The jobs a worker finished per second over the supervisor's last registry refresh (NULL: not
-- known yet, or not a worker).
ALTER TABLE miniqueue_processes ADD COLUMN jobs_per_second DOUBLE PRECISION;

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
