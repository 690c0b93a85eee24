-- Fair share by key (see docs/guides/fairness.md): the jobs of a fair queue (or of a task that
-- declares fair_by="key", or given a fair_key) are taken round-robin across their keys, each key
-- in its own order, weighted by the key's weight; and rules that set the limit and the weight of
-- the keys a pattern matches, at run time.
--
-- How. Each fair job gets a rank as it is enqueued (miniqueue_rank_fair below, in the producer's
-- transaction): its key's next turn, in a virtual time that advances by one quantum over the
-- key's weight per job, never before the queue's current turn (the rank of the first available
-- job in the claim's order, so a key that arrives late starts now, not in the past, and a key
-- that had many jobs before does not pay for them once it has none). The claim takes jobs by
-- priority, then rank (a job without one: its due time), then id, from one index: the order is
-- decided as jobs arrive, so a claim reads the first entries of the index as before, whatever
-- the backlog, and a fair queue drains as fast as any other.
--
-- Old workers during an upgrade keep working: their claim orders by the due time, which the new
-- index does not hold, so each of their claims sorts its queue's available jobs until they stop.

-- The job's fair key ('' for a fair job without one), and its turn among its queue's fair jobs
-- (NULL: not a fair job; it takes its turn by its due time).
ALTER TABLE miniqueue_jobs ADD COLUMN fair_key TEXT, ADD COLUMN rank_at TIMESTAMPTZ;
ALTER TABLE miniqueue_jobs_live ALTER COLUMN fair_key SET STATISTICS 10, ALTER COLUMN rank_at SET STATISTICS 0;

-- The claim index in the claim's new order: a job's turn is its rank, or its due time.
DROP INDEX idx_miniqueue_jobs_claim;
CREATE INDEX idx_miniqueue_jobs_claim
    ON miniqueue_jobs_live (queue, priority DESC, (coalesce(rank_at, scheduled_at)), id)
    WHERE state = 'available' AND limits IS NULL;

-- A fair key's available jobs in their order, for re-ranking them when a rule changes its weight
-- and for what `miniqueue keys list` and `miniqueue jobs why` say of it. Only fair jobs are in it.
CREATE INDEX idx_miniqueue_jobs_fair
    ON miniqueue_jobs_live (queue, fair_key, (coalesce(rank_at, scheduled_at)), id)
    WHERE state = 'available' AND fair_key IS NOT NULL;

-- A queue whose every job is fair (`miniqueue queues fair`).
ALTER TABLE miniqueue_queues ADD COLUMN fair BOOLEAN NOT NULL DEFAULT false;

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
