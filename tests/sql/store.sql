-- _enqueue
WITH ins AS (
    INSERT INTO "public"."miniqueue_jobs" (queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
            COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)), %(key)s,
            %(limits)s::text[], %(trace)s::jsonb)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue, scheduled_at
)
SELECT id, false,
       CASE WHEN %(notify)s AND scheduled_at <= now() THEN pg_notify(%(channel)s, queue) END
  FROM ins
UNION ALL
SELECT id, true, NULL FROM "public"."miniqueue_jobs"
 WHERE idempotency_key = %(key)s AND NOT EXISTS (SELECT 1 FROM ins);

-- _enqueue_limited
WITH scoped AS (
    INSERT INTO "public"."miniqueue_limits" AS l (scope, max_running, rate, burst, tokens)
    SELECT scope, max_running, rate, burst, CASE WHEN rate IS NULL THEN 0 ELSE 1 END
      FROM unnest(%(scopes)s::text[], %(maxes)s::int[], %(rates)s::float8[], %(bursts)s::float8[])
           AS s(scope, max_running, rate, burst)
    ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst
     WHERE (l.max_running, l.rate, l.burst) IS DISTINCT FROM (excluded.max_running, excluded.rate, excluded.burst)
),
ins AS (
    INSERT INTO "public"."miniqueue_jobs" (queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
            COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)), %(key)s,
            %(limits)s::text[], %(trace)s::jsonb)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue, scheduled_at
)
SELECT id, false,
       CASE WHEN %(notify)s AND scheduled_at <= now() THEN pg_notify(%(channel)s, queue) END
  FROM ins
UNION ALL
SELECT id, true, NULL FROM "public"."miniqueue_jobs"
 WHERE idempotency_key = %(key)s AND NOT EXISTS (SELECT 1 FROM ins);

-- _enqueue_waiting
WITH ins AS (
    INSERT INTO "public"."miniqueue_jobs" (queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context, state, parents, pending_parents, expires_at)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
            COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)), %(key)s,
            %(limits)s::text[], %(trace)s::jsonb,
            CASE WHEN %(pending)s > 0 THEN 'waiting' ELSE 'available' END, %(parents)s::bigint[], %(pending)s,
            COALESCE(%(expires_at)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8)))
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue, scheduled_at
)
SELECT id, false,
       CASE WHEN %(notify)s AND scheduled_at <= now() THEN pg_notify(%(channel)s, queue) END
  FROM ins
UNION ALL
SELECT id, true, NULL FROM "public"."miniqueue_jobs"
 WHERE idempotency_key = %(key)s AND NOT EXISTS (SELECT 1 FROM ins);

-- _enqueue_waiting_limited
WITH scoped AS (
    INSERT INTO "public"."miniqueue_limits" AS l (scope, max_running, rate, burst, tokens)
    SELECT scope, max_running, rate, burst, CASE WHEN rate IS NULL THEN 0 ELSE 1 END
      FROM unnest(%(scopes)s::text[], %(maxes)s::int[], %(rates)s::float8[], %(bursts)s::float8[])
           AS s(scope, max_running, rate, burst)
    ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst
     WHERE (l.max_running, l.rate, l.burst) IS DISTINCT FROM (excluded.max_running, excluded.rate, excluded.burst)
),
ins AS (
    INSERT INTO "public"."miniqueue_jobs" (queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context, state, parents, pending_parents, expires_at)
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
            COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)), %(key)s,
            %(limits)s::text[], %(trace)s::jsonb,
            CASE WHEN %(pending)s > 0 THEN 'waiting' ELSE 'available' END, %(parents)s::bigint[], %(pending)s,
            COALESCE(%(expires_at)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8)))
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue, scheduled_at
)
SELECT id, false,
       CASE WHEN %(notify)s AND scheduled_at <= now() THEN pg_notify(%(channel)s, queue) END
  FROM ins
UNION ALL
SELECT id, true, NULL FROM "public"."miniqueue_jobs"
 WHERE idempotency_key = %(key)s AND NOT EXISTS (SELECT 1 FROM ins);

-- _lock_parents
SELECT id, state FROM "public"."miniqueue_jobs" WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id FOR NO KEY UPDATE;

-- _link_dependent
UPDATE "public"."miniqueue_jobs" SET dependents = array_append(dependents, %(child)s::bigint) WHERE id = ANY(%(parents)s::bigint[]);

-- _by_key
SELECT id FROM "public"."miniqueue_jobs" WHERE idempotency_key = %(key)s;

-- _enqueue_many
WITH src AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence(%(table)s, 'id'))::regclass) AS id, u.*
      FROM unnest(%(queues)b::text[], %(tasks)b::text[], %(payloads)b::text[], %(priorities)b::int[],
                  %(max_attempts)b::int[], %(run_ats)b::timestamptz[], %(delays)b::float8[], %(keys)b::text[],
                  %(limits)b::text[])
           WITH ORDINALITY AS u(queue, task, payload, priority, max_attempts, run_at, delay, key, limits, ord)
), ins AS (
    INSERT INTO "public"."miniqueue_jobs" (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context)
    SELECT id, queue, task, payload::jsonb, priority, max_attempts, max_attempts,
           COALESCE(run_at, now() + make_interval(secs => COALESCE(delay, 0))), key, string_to_array(limits, chr(31)),
           %(trace)s::jsonb
      FROM src ORDER BY ord
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue, scheduled_at, idempotency_key
), notified AS (
    SELECT pg_notify(%(channel)s, queue)
      FROM (SELECT DISTINCT queue FROM ins WHERE scheduled_at <= now()) q
     WHERE %(notify)s
)
SELECT s.ord, COALESCE(i.id, ik.id, e.id), i.id IS NULL
  FROM src s
  LEFT JOIN ins i ON i.id = s.id
  LEFT JOIN ins ik ON i.id IS NULL AND ik.idempotency_key = s.key
  LEFT JOIN "public"."miniqueue_jobs" e ON i.id IS NULL AND ik.id IS NULL AND e.idempotency_key = s.key
 WHERE (SELECT count(*) FROM notified) >= 0
 ORDER BY s.ord;

-- _enqueue_many_limited
WITH scoped AS (
    INSERT INTO "public"."miniqueue_limits" AS l (scope, max_running, rate, burst, tokens)
    SELECT scope, max_running, rate, burst, CASE WHEN rate IS NULL THEN 0 ELSE 1 END
      FROM unnest(%(scopes)s::text[], %(maxes)s::int[], %(rates)s::float8[], %(bursts)s::float8[])
           AS s(scope, max_running, rate, burst)
    ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst
     WHERE (l.max_running, l.rate, l.burst) IS DISTINCT FROM (excluded.max_running, excluded.rate, excluded.burst)
),
src AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence(%(table)s, 'id'))::regclass) AS id, u.*
      FROM unnest(%(queues)b::text[], %(tasks)b::text[], %(payloads)b::text[], %(priorities)b::int[],
                  %(max_attempts)b::int[], %(run_ats)b::timestamptz[], %(delays)b::float8[], %(keys)b::text[],
                  %(limits)b::text[])
           WITH ORDINALITY AS u(queue, task, payload, priority, max_attempts, run_at, delay, key, limits, ord)
), ins AS (
    INSERT INTO "public"."miniqueue_jobs" (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context)
    SELECT id, queue, task, payload::jsonb, priority, max_attempts, max_attempts,
           COALESCE(run_at, now() + make_interval(secs => COALESCE(delay, 0))), key, string_to_array(limits, chr(31)),
           %(trace)s::jsonb
      FROM src ORDER BY ord
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue, scheduled_at, idempotency_key
), notified AS (
    SELECT pg_notify(%(channel)s, queue)
      FROM (SELECT DISTINCT queue FROM ins WHERE scheduled_at <= now()) q
     WHERE %(notify)s
)
SELECT s.ord, COALESCE(i.id, ik.id, e.id), i.id IS NULL
  FROM src s
  LEFT JOIN ins i ON i.id = s.id
  LEFT JOIN ins ik ON i.id IS NULL AND ik.idempotency_key = s.key
  LEFT JOIN "public"."miniqueue_jobs" e ON i.id IS NULL AND ik.id IS NULL AND e.idempotency_key = s.key
 WHERE (SELECT count(*) FROM notified) >= 0
 ORDER BY s.ord;

-- _enqueue_keyed
WITH scoped AS (
    INSERT INTO "public"."miniqueue_limits" AS l (scope, max_running, rate, burst, tokens)
    SELECT scope, max_running, rate, burst, CASE WHEN rate IS NULL THEN 0 ELSE 1 END
      FROM unnest(%(scopes)s::text[], %(maxes)s::int[], %(rates)s::float8[], %(bursts)s::float8[])
           AS s(scope, max_running, rate, burst)
    ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst
     WHERE (l.max_running, l.rate, l.burst) IS DISTINCT FROM (excluded.max_running, excluded.rate, excluded.burst)
), sequenced AS (
    INSERT INTO "public"."miniqueue_sequences" AS s (key, on_failure)
    SELECT %(sequence)s, %(on_failure)s WHERE %(sequence)s::text IS NOT NULL
    ON CONFLICT (key) DO UPDATE SET on_failure = excluded.on_failure, updated_at = now()
    RETURNING key
), ins AS (
    INSERT INTO "public"."miniqueue_jobs" (queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context, expires_at, unique_key, unique_while_running,
                        sequence_key, state)
    SELECT %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
           COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)), %(key)s,
           %(limits)s::text[], %(trace)s::jsonb,
           COALESCE(%(expires_at)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8)),
           %(unique)s, %(while_running)s, (SELECT key FROM sequenced),
           CASE WHEN EXISTS (SELECT 1 FROM sequenced) THEN 'waiting' ELSE 'available' END
    ON CONFLICT DO NOTHING
    RETURNING id, queue, scheduled_at, state
), advanced AS (
    SELECT "public"."miniqueue_sequence_advance"(ARRAY[%(sequence)s::text], %(channel)s) WHERE EXISTS (SELECT 1 FROM ins WHERE state = 'waiting')
)
SELECT id, false, CASE WHEN %(notify)s AND state = 'available' AND scheduled_at <= now() THEN pg_notify(%(channel)s, queue) END
  FROM ins WHERE (SELECT count(*) FROM advanced) >= 0
UNION ALL
(SELECT id, true, NULL FROM "public"."miniqueue_jobs"
  WHERE NOT EXISTS (SELECT 1 FROM ins)
    AND (idempotency_key = %(key)s OR unique_key = %(unique)s AND unique_key IS NOT NULL
      AND (state IN ('waiting', 'available') AND (attempt = 0 OR unique_while_running)
           OR state = 'running' AND unique_while_running))
  LIMIT 1);

-- _enqueue_replacing
WITH scoped AS (
    INSERT INTO "public"."miniqueue_limits" AS l (scope, max_running, rate, burst, tokens)
    SELECT scope, max_running, rate, burst, CASE WHEN rate IS NULL THEN 0 ELSE 1 END
      FROM unnest(%(scopes)s::text[], %(maxes)s::int[], %(rates)s::float8[], %(bursts)s::float8[])
           AS s(scope, max_running, rate, burst)
    ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst
     WHERE (l.max_running, l.rate, l.burst) IS DISTINCT FROM (excluded.max_running, excluded.rate, excluded.burst)
), sequenced AS (
    INSERT INTO "public"."miniqueue_sequences" AS s (key, on_failure)
    SELECT %(sequence)s, %(on_failure)s WHERE %(sequence)s::text IS NOT NULL
    ON CONFLICT (key) DO UPDATE SET on_failure = excluded.on_failure, updated_at = now()
    RETURNING key
), new AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence(%(table)s, 'id'))::regclass) AS id
), ins AS (
    INSERT INTO "public"."miniqueue_jobs" AS j (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                             limits, trace_context, expires_at, unique_key, unique_while_running, sequence_key, state)
    SELECT new.id, %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
           CASE WHEN %(wait)s::float8 IS NOT NULL THEN now() + make_interval(secs => %(wait)s::float8)
                ELSE COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)) END,
           %(limits)s::text[], %(trace)s::jsonb,
           COALESCE(%(expires_at)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8)),
           %(unique)s, %(while_running)s, (SELECT key FROM sequenced),
           CASE WHEN EXISTS (SELECT 1 FROM sequenced) THEN 'waiting' ELSE 'available' END
      FROM new
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL
      AND (state IN ('waiting', 'available') AND (attempt = 0 OR unique_while_running)
           OR state = 'running' AND unique_while_running)
    DO UPDATE SET payload = excluded.payload, priority = excluded.priority,
                  scheduled_at = CASE WHEN %(wait)s::float8 IS NULL THEN excluded.scheduled_at
                                      ELSE least(excluded.scheduled_at,
                                                 j.created_at + make_interval(secs => %(max_wait)s::float8)) END
     WHERE j.state IN ('waiting', 'available')
    RETURNING j.id, j.queue, j.scheduled_at, j.state, j.id <> (SELECT id FROM new) AS replaced
), advanced AS (
    SELECT "public"."miniqueue_sequence_advance"(ARRAY[%(sequence)s::text], %(channel)s)
     WHERE EXISTS (SELECT 1 FROM ins WHERE state = 'waiting' AND NOT replaced)
)
SELECT id, replaced, replaced,
       CASE WHEN %(notify)s AND state = 'available' AND scheduled_at <= now() THEN pg_notify(%(channel)s, queue) END
  FROM ins WHERE (SELECT count(*) FROM advanced) >= 0
UNION ALL
(SELECT id, true, false, NULL FROM "public"."miniqueue_jobs" WHERE NOT EXISTS (SELECT 1 FROM ins) AND unique_key = %(unique)s AND unique_key IS NOT NULL
      AND (state IN ('waiting', 'available') AND (attempt = 0 OR unique_while_running)
           OR state = 'running' AND unique_while_running)
  LIMIT 1);

-- _holder
SELECT id FROM "public"."miniqueue_jobs"
 WHERE idempotency_key = %(key)s OR unique_key = %(unique)s AND unique_key IS NOT NULL
      AND (state IN ('waiting', 'available') AND (attempt = 0 OR unique_while_running)
           OR state = 'running' AND unique_while_running)
 LIMIT 1;

-- _lock_window
INSERT INTO "public"."miniqueue_unique_windows" AS w (key, job_id, until) VALUES (%(unique)s, 0, '-infinity')
ON CONFLICT (key) DO UPDATE SET key = excluded.key
RETURNING job_id, until > now();

-- _open_window
UPDATE "public"."miniqueue_unique_windows" SET job_id = %(id)s, until = now() + make_interval(secs => %(window)s) WHERE key = %(unique)s;

-- _enqueue_many_keyed
WITH scoped AS (
    INSERT INTO "public"."miniqueue_limits" AS l (scope, max_running, rate, burst, tokens)
    SELECT scope, max_running, rate, burst, CASE WHEN rate IS NULL THEN 0 ELSE 1 END
      FROM unnest(%(scopes)s::text[], %(maxes)s::int[], %(rates)s::float8[], %(bursts)s::float8[])
           AS s(scope, max_running, rate, burst)
    ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst
     WHERE (l.max_running, l.rate, l.burst) IS DISTINCT FROM (excluded.max_running, excluded.rate, excluded.burst)
), sequenced AS (
    INSERT INTO "public"."miniqueue_sequences" AS s (key, on_failure)
    SELECT key, on_failure FROM unnest(%(sequence_keys)s::text[], %(on_failures)s::text[]) AS q(key, on_failure)
     ORDER BY key
    ON CONFLICT (key) DO UPDATE SET on_failure = excluded.on_failure, updated_at = now()
    RETURNING key
), src AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence(%(table)s, 'id'))::regclass) AS id, u.*
      FROM unnest(%(queues)b::text[], %(tasks)b::text[], %(payloads)b::text[], %(priorities)b::int[],
                  %(max_attempts)b::int[], %(run_ats)b::timestamptz[], %(delays)b::float8[], %(keys)b::text[],
                  %(limits)b::text[], %(expires_ats)b::timestamptz[], %(expires_ins)b::float8[], %(uniques)b::text[],
                  %(while_running)b::boolean[], %(sequences)b::text[])
           WITH ORDINALITY AS u(queue, task, payload, priority, max_attempts, run_at, delay, key, limits, expires_at,
                                expires_in, uniq, while_running, sequence, ord)
), ins AS (
    INSERT INTO "public"."miniqueue_jobs" (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context, expires_at, unique_key, unique_while_running,
                        sequence_key, state)
    SELECT id, queue, task, payload::jsonb, priority, max_attempts, max_attempts,
           COALESCE(run_at, now() + make_interval(secs => COALESCE(delay, 0))), key, string_to_array(limits, chr(31)),
           %(trace)s::jsonb, COALESCE(expires_at, now() + make_interval(secs => expires_in)), uniq,
           COALESCE(while_running, true), sequence, CASE WHEN sequence IS NULL THEN 'available' ELSE 'waiting' END
      FROM src WHERE (SELECT count(*) FROM sequenced) >= 0 ORDER BY ord
    ON CONFLICT DO NOTHING
    RETURNING id, queue, scheduled_at, state, idempotency_key, unique_key, sequence_key
), advanced AS (
    SELECT "public"."miniqueue_sequence_advance"(ARRAY(SELECT DISTINCT sequence_key FROM ins WHERE sequence_key IS NOT NULL), %(channel)s)
     WHERE EXISTS (SELECT 1 FROM ins WHERE sequence_key IS NOT NULL)
), notified AS (
    SELECT pg_notify(%(channel)s, queue)
      FROM (SELECT DISTINCT queue FROM ins WHERE state = 'available' AND scheduled_at <= now()) q
     WHERE %(notify)s
)
SELECT s.ord,
       COALESCE(i.id, ik.id, iu.id,
                (SELECT id FROM "public"."miniqueue_jobs" WHERE idempotency_key = s.key),
                (SELECT id FROM "public"."miniqueue_jobs" WHERE unique_key = s.uniq AND unique_key IS NOT NULL
      AND (state IN ('waiting', 'available') AND (attempt = 0 OR unique_while_running)
           OR state = 'running' AND unique_while_running))),
       i.id IS NULL
  FROM src s
  LEFT JOIN ins i ON i.id = s.id
  LEFT JOIN ins ik ON i.id IS NULL AND ik.idempotency_key = s.key
  LEFT JOIN ins iu ON i.id IS NULL AND ik.id IS NULL AND iu.unique_key = s.uniq
 WHERE (SELECT count(*) FROM notified) >= 0 AND (SELECT count(*) FROM advanced) >= 0
 ORDER BY s.ord;

-- _draw_ids
SELECT now(), ARRAY(SELECT nextval((SELECT pg_get_serial_sequence(%(table)s, 'id'))::regclass)
                      FROM generate_series(1, %(count)s));

-- _notify_queues
SELECT pg_notify(%(channel)s, queue) FROM unnest(%(queues)b::text[]) AS q(queue);

-- _copy_due
COPY "public"."miniqueue_jobs" (id, queue, task, payload, priority, max_attempts, attempt_budget) FROM STDIN;

-- _copy_scheduled
COPY "public"."miniqueue_jobs" (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at) FROM STDIN;

-- _copy_due_traced
COPY "public"."miniqueue_jobs" (id, queue, task, payload, priority, max_attempts, attempt_budget, trace_context) FROM STDIN;

-- _copy_scheduled_traced
COPY "public"."miniqueue_jobs" (id, queue, task, payload, priority, max_attempts, attempt_budget, trace_context, scheduled_at) FROM STDIN;

-- _copy_keyed
COPY "public"."miniqueue_jobs" (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at, trace_context,
             unique_key, unique_while_running, expires_at) FROM STDIN;

-- _copy_keyed_due
COPY "public"."miniqueue_jobs" (id, queue, task, payload, priority, max_attempts, attempt_budget, unique_key) FROM STDIN;

-- _claim_one
WITH RECURSIVE 
fast AS MATERIALIZED (
    SELECT id, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
     WHERE state = 'available' AND queue = %(queue)s AND limits IS NULL AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
       AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_queues" WHERE name = %(queue)s AND (paused OR max_running IS NOT NULL))
     ORDER BY priority DESC, scheduled_at, id
     LIMIT %(limit)s FOR UPDATE SKIP LOCKED),
open_queues AS MATERIALIZED (
    SELECT q.name, p.max_running,
           CASE WHEN p.max_running IS NULL THEN '{}'::text[] ELSE ARRAY['queue ' || q.name] END AS scope
      FROM (VALUES (%(queue)s::text)) AS q(name) LEFT JOIN "public"."miniqueue_queues" p ON p.name = q.name
     WHERE NOT coalesce(p.paused, false)
),
kept AS MATERIALIZED (
    SELECT DISTINCT k.queue, k.limits, q.scope FROM (SELECT NULL::text AS queue, NULL::text[] AS limits WHERE false) k JOIN open_queues q ON q.name = k.queue LIMIT %(kept)s
),
groups(queue, scope, limits, depth) AS (
    SELECT q.name, q.scope, f.limits, 1 FROM open_queues q CROSS JOIN LATERAL (
        SELECT limits FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = q.name AND limits > %(after)s::text[]
         ORDER BY limits LIMIT 1) f
    UNION ALL
    SELECT g.queue, g.scope, n.limits, g.depth + 1 FROM groups g CROSS JOIN LATERAL (
        SELECT limits FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits > g.limits
         ORDER BY limits LIMIT 1) n
     WHERE g.depth < %(scan)s
),
snapshot AS MATERIALIZED (  -- this statement's snapshot, xids modulo 2^32 (see _TOUCHED)
    SELECT pg_snapshot_xmax(s)::text::bigint & 4294967295 AS next,
           ARRAY(SELECT x::text::bigint & 4294967295 FROM pg_snapshot_xip(s) AS x) AS running
      FROM pg_current_snapshot() AS s
),
looked AS MATERIALIZED (
    SELECT g.queue, g.limits, g.scopes, s.locked, s.rooms, s.room FROM (
        SELECT q.name AS queue, NULL::text[] AS limits, q.scope AS scopes
          FROM open_queues q WHERE q.max_running IS NOT NULL
        UNION ALL
        SELECT queue, limits, limits || scope FROM kept
        UNION ALL
        SELECT queue, limits, limits || scope FROM groups r
         WHERE NOT EXISTS (SELECT 1 FROM kept k WHERE k.queue = r.queue AND k.limits = r.limits)) g
     CROSS JOIN snapshot t CROSS JOIN LATERAL (
        SELECT array_agg(x.scope) AS locked, array_agg(x.room) AS rooms, min(x.room) AS room
          FROM (SELECT l.scope, CASE WHEN l.max_running = 1 THEN 1 ELSE CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT false)::int
     END END AS room
                  FROM "public"."miniqueue_limits" l WHERE l.scope = ANY(g.scopes) AND NOT (l.xmax <> '0'
               AND ((l.xmax::text::bigint - t.next) & 4294967295 < 1048576 OR l.xmax::text::bigint = ANY(t.running))
               AND l.xmax::text::bigint IS DISTINCT FROM pg_current_xact_id_if_assigned()::text::bigint & 4294967295) AND CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT false)::int
     END > 0
                   FOR UPDATE OF l SKIP LOCKED) x
        OFFSET 0) s
     WHERE cardinality(s.locked) = cardinality(g.scopes)
     LIMIT %(groups)s
),
scopes AS MATERIALIZED (
    SELECT DISTINCT ON (r.scope) r.scope, r.room
      FROM looked g CROSS JOIN LATERAL unnest(g.locked, g.rooms) AS r(scope, room)
     WHERE (SELECT coalesce(bool_or(cardinality(scopes) > 1), false) FROM looked)
),
limited AS MATERIALIZED (
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits = g.limits
           AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NOT NULL
    UNION ALL
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NULL AND queue = g.queue AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NULL
),
need AS (
    SELECT c.id, c.priority, c.scheduled_at, s.scope FROM limited c CROSS JOIN LATERAL unnest(c.scopes) AS s(scope)
),
blocked AS MATERIALIZED (
    SELECT DISTINCT r.id
      FROM (SELECT n.id, n.scope, row_number() OVER (PARTITION BY n.scope
                                                     ORDER BY n.priority DESC, n.scheduled_at, n.id) AS place
              FROM need n WHERE (SELECT coalesce(bool_or(cardinality(scopes) > 1), false) FROM looked)) r
      JOIN scopes m ON m.scope = r.scope
     WHERE r.place > m.room
),
admitted AS (
    SELECT c.id, c.priority, c.scheduled_at, c.attempt, c.scopes FROM limited c
     WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.id = c.id)
),
chosen AS MATERIALIZED (
    SELECT id, attempt, scopes
      FROM (SELECT id, priority, scheduled_at, attempt, NULL::text[] AS scopes FROM fast
            UNION ALL SELECT id, priority, scheduled_at, attempt, scopes FROM admitted) a
     ORDER BY priority DESC, scheduled_at, id LIMIT %(limit)s
),
taken AS (
    UPDATE "public"."miniqueue_limits" l
       SET (holder_ids, holder_attempts) = (
               SELECT CASE WHEN l.max_running IS NULL THEN l.holder_ids
                           ELSE coalesce(array_agg(h.id ORDER BY h.id), '{}') || t.ids END,
                      CASE WHEN l.max_running IS NULL THEN l.holder_attempts
                           ELSE coalesce(array_agg(h.attempt ORDER BY h.id), '{}') || t.attempts END
                 FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt) LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id
                WHERE l.max_running > 1 AND ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT false),
           tokens = CASE WHEN l.rate IS NULL THEN l.tokens ELSE least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) - t.used END,
           refilled_at = CASE WHEN l.rate IS NULL THEN l.refilled_at ELSE greatest(l.refilled_at, now()) END
      FROM (SELECT s.scope, count(*) AS used, array_agg(c.id) AS ids, array_agg(c.attempt + 1) AS attempts
              FROM chosen c CROSS JOIN LATERAL unnest(c.scopes) AS s(scope) GROUP BY s.scope) t
     WHERE l.scope = t.scope
),
claimed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'running', leased_by = %(worker)s, attempt = attempt + 1,
       lease_expires_at = now() + make_interval(secs => %(lease)s)
 WHERE id = ANY(ARRAY(SELECT id FROM chosen))
RETURNING id, queue, task, payload, priority, attempt, max_attempts, scheduled_at, created_at, lease_expires_at,
          limits, parents, trace_context, attempt_budget
)
SELECT * FROM claimed;

-- _claim_many
WITH RECURSIVE 
fast AS MATERIALIZED (
    SELECT c.id, c.priority, c.scheduled_at, c.attempt FROM unnest(%(queues)b::text[]) AS q(name)
     CROSS JOIN LATERAL (
        SELECT id, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND queue = q.name AND limits IS NULL AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c
     WHERE NOT EXISTS (SELECT 1 FROM "public"."miniqueue_queues" p WHERE p.name = q.name AND (p.paused OR p.max_running IS NOT NULL))
     ORDER BY c.priority DESC, c.scheduled_at, c.id
     LIMIT %(limit)s),
open_queues AS MATERIALIZED (
    SELECT q.name, p.max_running,
           CASE WHEN p.max_running IS NULL THEN '{}'::text[] ELSE ARRAY['queue ' || q.name] END AS scope
      FROM unnest(%(queues)b::text[]) AS q(name) LEFT JOIN "public"."miniqueue_queues" p ON p.name = q.name
     WHERE NOT coalesce(p.paused, false)
),
kept AS MATERIALIZED (
    SELECT DISTINCT k.queue, k.limits, q.scope FROM (SELECT NULL::text AS queue, NULL::text[] AS limits WHERE false) k JOIN open_queues q ON q.name = k.queue LIMIT %(kept)s
),
groups(queue, scope, limits, depth) AS (
    SELECT q.name, q.scope, f.limits, 1 FROM open_queues q CROSS JOIN LATERAL (
        SELECT limits FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = q.name AND limits > %(after)s::text[]
         ORDER BY limits LIMIT 1) f
    UNION ALL
    SELECT g.queue, g.scope, n.limits, g.depth + 1 FROM groups g CROSS JOIN LATERAL (
        SELECT limits FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits > g.limits
         ORDER BY limits LIMIT 1) n
     WHERE g.depth < %(scan)s
),
snapshot AS MATERIALIZED (  -- this statement's snapshot, xids modulo 2^32 (see _TOUCHED)
    SELECT pg_snapshot_xmax(s)::text::bigint & 4294967295 AS next,
           ARRAY(SELECT x::text::bigint & 4294967295 FROM pg_snapshot_xip(s) AS x) AS running
      FROM pg_current_snapshot() AS s
),
looked AS MATERIALIZED (
    SELECT g.queue, g.limits, g.scopes, s.locked, s.rooms, s.room FROM (
        SELECT q.name AS queue, NULL::text[] AS limits, q.scope AS scopes
          FROM open_queues q WHERE q.max_running IS NOT NULL
        UNION ALL
        SELECT queue, limits, limits || scope FROM kept
        UNION ALL
        SELECT queue, limits, limits || scope FROM groups r
         WHERE NOT EXISTS (SELECT 1 FROM kept k WHERE k.queue = r.queue AND k.limits = r.limits)) g
     CROSS JOIN snapshot t CROSS JOIN LATERAL (
        SELECT array_agg(x.scope) AS locked, array_agg(x.room) AS rooms, min(x.room) AS room
          FROM (SELECT l.scope, CASE WHEN l.max_running = 1 THEN 1 ELSE CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT false)::int
     END END AS room
                  FROM "public"."miniqueue_limits" l WHERE l.scope = ANY(g.scopes) AND NOT (l.xmax <> '0'
               AND ((l.xmax::text::bigint - t.next) & 4294967295 < 1048576 OR l.xmax::text::bigint = ANY(t.running))
               AND l.xmax::text::bigint IS DISTINCT FROM pg_current_xact_id_if_assigned()::text::bigint & 4294967295) AND CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT false)::int
     END > 0
                   FOR UPDATE OF l SKIP LOCKED) x
        OFFSET 0) s
     WHERE cardinality(s.locked) = cardinality(g.scopes)
     LIMIT %(groups)s
),
scopes AS MATERIALIZED (
    SELECT DISTINCT ON (r.scope) r.scope, r.room
      FROM looked g CROSS JOIN LATERAL unnest(g.locked, g.rooms) AS r(scope, room)
     WHERE true
),
limited AS MATERIALIZED (
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits = g.limits
           AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NOT NULL
    UNION ALL
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NULL AND queue = g.queue AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NULL
),
need AS (
    SELECT c.id, c.priority, c.scheduled_at, s.scope FROM limited c CROSS JOIN LATERAL unnest(c.scopes) AS s(scope)
),
blocked AS MATERIALIZED (
    SELECT DISTINCT r.id
      FROM (SELECT n.id, n.scope, row_number() OVER (PARTITION BY n.scope
                                                     ORDER BY n.priority DESC, n.scheduled_at, n.id) AS place
              FROM need n WHERE true) r
      JOIN scopes m ON m.scope = r.scope
     WHERE r.place > m.room
),
admitted AS (
    SELECT c.id, c.priority, c.scheduled_at, c.attempt, c.scopes FROM limited c
     WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.id = c.id)
),
chosen AS MATERIALIZED (
    SELECT id, attempt, scopes
      FROM (SELECT id, priority, scheduled_at, attempt, NULL::text[] AS scopes FROM fast
            UNION ALL SELECT id, priority, scheduled_at, attempt, scopes FROM admitted) a
     ORDER BY priority DESC, scheduled_at, id LIMIT %(limit)s
),
taken AS (
    UPDATE "public"."miniqueue_limits" l
       SET (holder_ids, holder_attempts) = (
               SELECT CASE WHEN l.max_running IS NULL THEN l.holder_ids
                           ELSE coalesce(array_agg(h.id ORDER BY h.id), '{}') || t.ids END,
                      CASE WHEN l.max_running IS NULL THEN l.holder_attempts
                           ELSE coalesce(array_agg(h.attempt ORDER BY h.id), '{}') || t.attempts END
                 FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt) LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id
                WHERE l.max_running > 1 AND ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT false),
           tokens = CASE WHEN l.rate IS NULL THEN l.tokens ELSE least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) - t.used END,
           refilled_at = CASE WHEN l.rate IS NULL THEN l.refilled_at ELSE greatest(l.refilled_at, now()) END
      FROM (SELECT s.scope, count(*) AS used, array_agg(c.id) AS ids, array_agg(c.attempt + 1) AS attempts
              FROM chosen c CROSS JOIN LATERAL unnest(c.scopes) AS s(scope) GROUP BY s.scope) t
     WHERE l.scope = t.scope
),
claimed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'running', leased_by = %(worker)s, attempt = attempt + 1,
       lease_expires_at = now() + make_interval(secs => %(lease)s)
 WHERE id = ANY(ARRAY(SELECT id FROM chosen))
RETURNING id, queue, task, payload, priority, attempt, max_attempts, scheduled_at, created_at, lease_expires_at,
          limits, parents, trace_context, attempt_budget
)
SELECT * FROM claimed;

-- _claim_one_down
WITH RECURSIVE 
fast AS MATERIALIZED (
    SELECT id, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
     WHERE state = 'available' AND queue = %(queue)s AND limits IS NULL AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
       AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_queues" WHERE name = %(queue)s AND (paused OR max_running IS NOT NULL))
     ORDER BY priority DESC, scheduled_at, id
     LIMIT %(limit)s FOR UPDATE SKIP LOCKED),
open_queues AS MATERIALIZED (
    SELECT q.name, p.max_running,
           CASE WHEN p.max_running IS NULL THEN '{}'::text[] ELSE ARRAY['queue ' || q.name] END AS scope
      FROM (VALUES (%(queue)s::text)) AS q(name) LEFT JOIN "public"."miniqueue_queues" p ON p.name = q.name
     WHERE NOT coalesce(p.paused, false)
),
kept AS MATERIALIZED (
    SELECT DISTINCT k.queue, k.limits, q.scope FROM (SELECT NULL::text AS queue, NULL::text[] AS limits WHERE false) k JOIN open_queues q ON q.name = k.queue LIMIT %(kept)s
),
groups(queue, scope, limits, depth) AS (
    SELECT q.name, q.scope, f.limits, 1 FROM open_queues q CROSS JOIN LATERAL (
        SELECT limits FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = q.name AND limits < %(after)s::text[]
         ORDER BY limits DESC LIMIT 1) f
    UNION ALL
    SELECT g.queue, g.scope, n.limits, g.depth + 1 FROM groups g CROSS JOIN LATERAL (
        SELECT limits FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits < g.limits
         ORDER BY limits DESC LIMIT 1) n
     WHERE g.depth < %(scan)s
),
snapshot AS MATERIALIZED (  -- this statement's snapshot, xids modulo 2^32 (see _TOUCHED)
    SELECT pg_snapshot_xmax(s)::text::bigint & 4294967295 AS next,
           ARRAY(SELECT x::text::bigint & 4294967295 FROM pg_snapshot_xip(s) AS x) AS running
      FROM pg_current_snapshot() AS s
),
looked AS MATERIALIZED (
    SELECT g.queue, g.limits, g.scopes, s.locked, s.rooms, s.room FROM (
        SELECT q.name AS queue, NULL::text[] AS limits, q.scope AS scopes
          FROM open_queues q WHERE q.max_running IS NOT NULL
        UNION ALL
        SELECT queue, limits, limits || scope FROM kept
        UNION ALL
        SELECT queue, limits, limits || scope FROM groups r
         WHERE NOT EXISTS (SELECT 1 FROM kept k WHERE k.queue = r.queue AND k.limits = r.limits)) g
     CROSS JOIN snapshot t CROSS JOIN LATERAL (
        SELECT array_agg(x.scope) AS locked, array_agg(x.room) AS rooms, min(x.room) AS room
          FROM (SELECT l.scope, CASE WHEN l.max_running = 1 THEN 1 ELSE CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT false)::int
     END END AS room
                  FROM "public"."miniqueue_limits" l WHERE l.scope = ANY(g.scopes) AND NOT (l.xmax <> '0'
               AND ((l.xmax::text::bigint - t.next) & 4294967295 < 1048576 OR l.xmax::text::bigint = ANY(t.running))
               AND l.xmax::text::bigint IS DISTINCT FROM pg_current_xact_id_if_assigned()::text::bigint & 4294967295) AND CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT false)::int
     END > 0
                   FOR UPDATE OF l SKIP LOCKED) x
        OFFSET 0) s
     WHERE cardinality(s.locked) = cardinality(g.scopes)
     LIMIT %(groups)s
),
scopes AS MATERIALIZED (
    SELECT DISTINCT ON (r.scope) r.scope, r.room
      FROM looked g CROSS JOIN LATERAL unnest(g.locked, g.rooms) AS r(scope, room)
     WHERE (SELECT coalesce(bool_or(cardinality(scopes) > 1), false) FROM looked)
),
limited AS MATERIALIZED (
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits = g.limits
           AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NOT NULL
    UNION ALL
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NULL AND queue = g.queue AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NULL
),
need AS (
    SELECT c.id, c.priority, c.scheduled_at, s.scope FROM limited c CROSS JOIN LATERAL unnest(c.scopes) AS s(scope)
),
blocked AS MATERIALIZED (
    SELECT DISTINCT r.id
      FROM (SELECT n.id, n.scope, row_number() OVER (PARTITION BY n.scope
                                                     ORDER BY n.priority DESC, n.scheduled_at, n.id) AS place
              FROM need n WHERE (SELECT coalesce(bool_or(cardinality(scopes) > 1), false) FROM looked)) r
      JOIN scopes m ON m.scope = r.scope
     WHERE r.place > m.room
),
admitted AS (
    SELECT c.id, c.priority, c.scheduled_at, c.attempt, c.scopes FROM limited c
     WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.id = c.id)
),
chosen AS MATERIALIZED (
    SELECT id, attempt, scopes
      FROM (SELECT id, priority, scheduled_at, attempt, NULL::text[] AS scopes FROM fast
            UNION ALL SELECT id, priority, scheduled_at, attempt, scopes FROM admitted) a
     ORDER BY priority DESC, scheduled_at, id LIMIT %(limit)s
),
taken AS (
    UPDATE "public"."miniqueue_limits" l
       SET (holder_ids, holder_attempts) = (
               SELECT CASE WHEN l.max_running IS NULL THEN l.holder_ids
                           ELSE coalesce(array_agg(h.id ORDER BY h.id), '{}') || t.ids END,
                      CASE WHEN l.max_running IS NULL THEN l.holder_attempts
                           ELSE coalesce(array_agg(h.attempt ORDER BY h.id), '{}') || t.attempts END
                 FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt) LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id
                WHERE l.max_running > 1 AND ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT false),
           tokens = CASE WHEN l.rate IS NULL THEN l.tokens ELSE least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) - t.used END,
           refilled_at = CASE WHEN l.rate IS NULL THEN l.refilled_at ELSE greatest(l.refilled_at, now()) END
      FROM (SELECT s.scope, count(*) AS used, array_agg(c.id) AS ids, array_agg(c.attempt + 1) AS attempts
              FROM chosen c CROSS JOIN LATERAL unnest(c.scopes) AS s(scope) GROUP BY s.scope) t
     WHERE l.scope = t.scope
),
claimed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'running', leased_by = %(worker)s, attempt = attempt + 1,
       lease_expires_at = now() + make_interval(secs => %(lease)s)
 WHERE id = ANY(ARRAY(SELECT id FROM chosen))
RETURNING id, queue, task, payload, priority, attempt, max_attempts, scheduled_at, created_at, lease_expires_at,
          limits, parents, trace_context, attempt_budget
)
SELECT * FROM claimed;

-- _claim_many_down
WITH RECURSIVE 
fast AS MATERIALIZED (
    SELECT c.id, c.priority, c.scheduled_at, c.attempt FROM unnest(%(queues)b::text[]) AS q(name)
     CROSS JOIN LATERAL (
        SELECT id, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND queue = q.name AND limits IS NULL AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c
     WHERE NOT EXISTS (SELECT 1 FROM "public"."miniqueue_queues" p WHERE p.name = q.name AND (p.paused OR p.max_running IS NOT NULL))
     ORDER BY c.priority DESC, c.scheduled_at, c.id
     LIMIT %(limit)s),
open_queues AS MATERIALIZED (
    SELECT q.name, p.max_running,
           CASE WHEN p.max_running IS NULL THEN '{}'::text[] ELSE ARRAY['queue ' || q.name] END AS scope
      FROM unnest(%(queues)b::text[]) AS q(name) LEFT JOIN "public"."miniqueue_queues" p ON p.name = q.name
     WHERE NOT coalesce(p.paused, false)
),
kept AS MATERIALIZED (
    SELECT DISTINCT k.queue, k.limits, q.scope FROM (SELECT NULL::text AS queue, NULL::text[] AS limits WHERE false) k JOIN open_queues q ON q.name = k.queue LIMIT %(kept)s
),
groups(queue, scope, limits, depth) AS (
    SELECT q.name, q.scope, f.limits, 1 FROM open_queues q CROSS JOIN LATERAL (
        SELECT limits FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = q.name AND limits < %(after)s::text[]
         ORDER BY limits DESC LIMIT 1) f
    UNION ALL
    SELECT g.queue, g.scope, n.limits, g.depth + 1 FROM groups g CROSS JOIN LATERAL (
        SELECT limits FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits < g.limits
         ORDER BY limits DESC LIMIT 1) n
     WHERE g.depth < %(scan)s
),
snapshot AS MATERIALIZED (  -- this statement's snapshot, xids modulo 2^32 (see _TOUCHED)
    SELECT pg_snapshot_xmax(s)::text::bigint & 4294967295 AS next,
           ARRAY(SELECT x::text::bigint & 4294967295 FROM pg_snapshot_xip(s) AS x) AS running
      FROM pg_current_snapshot() AS s
),
looked AS MATERIALIZED (
    SELECT g.queue, g.limits, g.scopes, s.locked, s.rooms, s.room FROM (
        SELECT q.name AS queue, NULL::text[] AS limits, q.scope AS scopes
          FROM open_queues q WHERE q.max_running IS NOT NULL
        UNION ALL
        SELECT queue, limits, limits || scope FROM kept
        UNION ALL
        SELECT queue, limits, limits || scope FROM groups r
         WHERE NOT EXISTS (SELECT 1 FROM kept k WHERE k.queue = r.queue AND k.limits = r.limits)) g
     CROSS JOIN snapshot t CROSS JOIN LATERAL (
        SELECT array_agg(x.scope) AS locked, array_agg(x.room) AS rooms, min(x.room) AS room
          FROM (SELECT l.scope, CASE WHEN l.max_running = 1 THEN 1 ELSE CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT false)::int
     END END AS room
                  FROM "public"."miniqueue_limits" l WHERE l.scope = ANY(g.scopes) AND NOT (l.xmax <> '0'
               AND ((l.xmax::text::bigint - t.next) & 4294967295 < 1048576 OR l.xmax::text::bigint = ANY(t.running))
               AND l.xmax::text::bigint IS DISTINCT FROM pg_current_xact_id_if_assigned()::text::bigint & 4294967295) AND CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT false)::int
     END > 0
                   FOR UPDATE OF l SKIP LOCKED) x
        OFFSET 0) s
     WHERE cardinality(s.locked) = cardinality(g.scopes)
     LIMIT %(groups)s
),
scopes AS MATERIALIZED (
    SELECT DISTINCT ON (r.scope) r.scope, r.room
      FROM looked g CROSS JOIN LATERAL unnest(g.locked, g.rooms) AS r(scope, room)
     WHERE true
),
limited AS MATERIALIZED (
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits = g.limits
           AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NOT NULL
    UNION ALL
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NULL AND queue = g.queue AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NULL
),
need AS (
    SELECT c.id, c.priority, c.scheduled_at, s.scope FROM limited c CROSS JOIN LATERAL unnest(c.scopes) AS s(scope)
),
blocked AS MATERIALIZED (
    SELECT DISTINCT r.id
      FROM (SELECT n.id, n.scope, row_number() OVER (PARTITION BY n.scope
                                                     ORDER BY n.priority DESC, n.scheduled_at, n.id) AS place
              FROM need n WHERE true) r
      JOIN scopes m ON m.scope = r.scope
     WHERE r.place > m.room
),
admitted AS (
    SELECT c.id, c.priority, c.scheduled_at, c.attempt, c.scopes FROM limited c
     WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.id = c.id)
),
chosen AS MATERIALIZED (
    SELECT id, attempt, scopes
      FROM (SELECT id, priority, scheduled_at, attempt, NULL::text[] AS scopes FROM fast
            UNION ALL SELECT id, priority, scheduled_at, attempt, scopes FROM admitted) a
     ORDER BY priority DESC, scheduled_at, id LIMIT %(limit)s
),
taken AS (
    UPDATE "public"."miniqueue_limits" l
       SET (holder_ids, holder_attempts) = (
               SELECT CASE WHEN l.max_running IS NULL THEN l.holder_ids
                           ELSE coalesce(array_agg(h.id ORDER BY h.id), '{}') || t.ids END,
                      CASE WHEN l.max_running IS NULL THEN l.holder_attempts
                           ELSE coalesce(array_agg(h.attempt ORDER BY h.id), '{}') || t.attempts END
                 FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt) LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id
                WHERE l.max_running > 1 AND ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT false),
           tokens = CASE WHEN l.rate IS NULL THEN l.tokens ELSE least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) - t.used END,
           refilled_at = CASE WHEN l.rate IS NULL THEN l.refilled_at ELSE greatest(l.refilled_at, now()) END
      FROM (SELECT s.scope, count(*) AS used, array_agg(c.id) AS ids, array_agg(c.attempt + 1) AS attempts
              FROM chosen c CROSS JOIN LATERAL unnest(c.scopes) AS s(scope) GROUP BY s.scope) t
     WHERE l.scope = t.scope
),
claimed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'running', leased_by = %(worker)s, attempt = attempt + 1,
       lease_expires_at = now() + make_interval(secs => %(lease)s)
 WHERE id = ANY(ARRAY(SELECT id FROM chosen))
RETURNING id, queue, task, payload, priority, attempt, max_attempts, scheduled_at, created_at, lease_expires_at,
          limits, parents, trace_context, attempt_budget
)
SELECT * FROM claimed;

-- _complete_and_claim_one
WITH RECURSIVE completed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'completed', completed_at = now(), finished_at = now(), lease_expires_at = NULL, leased_by = NULL,
       result = CASE WHEN cardinality(%(results)b::text[]) > 0
                     THEN ((%(results)b::text[])[width_bucket(id, %(ids)b::bigint[])])::jsonb END
 WHERE id = ANY(%(ids)b::bigint[])
   AND attempt = (%(attempts)b::int[])[width_bucket(id, %(ids)b::bigint[])]
   AND state = 'running' AND leased_by = %(worker)s
RETURNING id, queue, state, dependents, awaited, limits, sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, count)
SELECT queue, state, pg_backend_pid() %% 64, count(*) FROM completed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard) DO UPDATE SET count = c.count + excluded.count
RETURNING 1), per_minute AS (
INSERT INTO "public"."miniqueue_finished_minutes" AS m (minute, state, shard, count)
SELECT date_trunc('minute', now()), state, pg_backend_pid() %% 64, count(*) FROM completed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY state
ON CONFLICT (minute, state, shard) DO UPDATE SET count = m.count + excluded.count
RETURNING 1), settled AS (
SELECT "public"."miniqueue_settle"(
    notify_ids => ARRAY(SELECT id FROM completed WHERE awaited AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')),
    released => ARRAY(SELECT d FROM completed, unnest(dependents) AS d WHERE state = 'completed'),
    cancel_children => ARRAY(SELECT d FROM completed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_parents => ARRAY(SELECT id FROM completed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_states => ARRAY(SELECT state FROM completed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    channel => 'miniqueue_public_finished', queue_channel => 'miniqueue_public',
    sequence_keys => ARRAY(SELECT DISTINCT sequence_key FROM completed WHERE sequence_key IS NOT NULL AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')))
 WHERE EXISTS (SELECT 1 FROM completed WHERE (dependents IS NOT NULL OR awaited OR sequence_key IS NOT NULL) AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted'))
   AND (SELECT count(*) FROM counted) >= 0), 
fast AS MATERIALIZED (
    SELECT id, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
     WHERE state = 'available' AND queue = %(queue)s AND limits IS NULL AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
       AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_queues" WHERE name = %(queue)s AND (paused OR max_running IS NOT NULL))
     ORDER BY priority DESC, scheduled_at, id
     LIMIT %(limit)s FOR UPDATE SKIP LOCKED),
open_queues AS MATERIALIZED (
    SELECT q.name, p.max_running,
           CASE WHEN p.max_running IS NULL THEN '{}'::text[] ELSE ARRAY['queue ' || q.name] END AS scope
      FROM (VALUES (%(queue)s::text)) AS q(name) LEFT JOIN "public"."miniqueue_queues" p ON p.name = q.name
     WHERE NOT coalesce(p.paused, false)
),
kept AS MATERIALIZED (
    SELECT DISTINCT k.queue, k.limits, q.scope FROM (SELECT queue, limits FROM completed WHERE limits IS NOT NULL) k JOIN open_queues q ON q.name = k.queue LIMIT %(kept)s
),
groups(queue, scope, limits, depth) AS (
    SELECT q.name, q.scope, f.limits, 1 FROM open_queues q CROSS JOIN LATERAL (
        SELECT limits FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = q.name AND limits > %(after)s::text[]
         ORDER BY limits LIMIT 1) f
    UNION ALL
    SELECT g.queue, g.scope, n.limits, g.depth + 1 FROM groups g CROSS JOIN LATERAL (
        SELECT limits FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits > g.limits
         ORDER BY limits LIMIT 1) n
     WHERE g.depth < %(scan)s
),
snapshot AS MATERIALIZED (  -- this statement's snapshot, xids modulo 2^32 (see _TOUCHED)
    SELECT pg_snapshot_xmax(s)::text::bigint & 4294967295 AS next,
           ARRAY(SELECT x::text::bigint & 4294967295 FROM pg_snapshot_xip(s) AS x) AS running
      FROM pg_current_snapshot() AS s
),
looked AS MATERIALIZED (
    SELECT g.queue, g.limits, g.scopes, s.locked, s.rooms, s.room FROM (
        SELECT q.name AS queue, NULL::text[] AS limits, q.scope AS scopes
          FROM open_queues q WHERE q.max_running IS NOT NULL
        UNION ALL
        SELECT queue, limits, limits || scope FROM kept
        UNION ALL
        SELECT queue, limits, limits || scope FROM groups r
         WHERE NOT EXISTS (SELECT 1 FROM kept k WHERE k.queue = r.queue AND k.limits = r.limits)) g
     CROSS JOIN snapshot t CROSS JOIN LATERAL (
        SELECT array_agg(x.scope) AS locked, array_agg(x.room) AS rooms, min(x.room) AS room
          FROM (SELECT l.scope, CASE WHEN l.max_running = 1 THEN 1 ELSE CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT EXISTS (SELECT 1 FROM unnest(%(ids)b::bigint[], %(attempts)b::int[]) AS c(id, attempt)
                WHERE c.id = h.id AND c.attempt = h.attempt))::int
     END END AS room
                  FROM "public"."miniqueue_limits" l WHERE l.scope = ANY(g.scopes) AND NOT (l.xmax <> '0'
               AND ((l.xmax::text::bigint - t.next) & 4294967295 < 1048576 OR l.xmax::text::bigint = ANY(t.running))
               AND l.xmax::text::bigint IS DISTINCT FROM pg_current_xact_id_if_assigned()::text::bigint & 4294967295) AND CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT EXISTS (SELECT 1 FROM unnest(%(ids)b::bigint[], %(attempts)b::int[]) AS c(id, attempt)
                WHERE c.id = h.id AND c.attempt = h.attempt))::int
     END > 0
                   FOR UPDATE OF l SKIP LOCKED) x
        OFFSET 0) s
     WHERE cardinality(s.locked) = cardinality(g.scopes)
     LIMIT %(groups)s
),
scopes AS MATERIALIZED (
    SELECT DISTINCT ON (r.scope) r.scope, r.room
      FROM looked g CROSS JOIN LATERAL unnest(g.locked, g.rooms) AS r(scope, room)
     WHERE (SELECT coalesce(bool_or(cardinality(scopes) > 1), false) FROM looked)
),
limited AS MATERIALIZED (
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits = g.limits
           AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NOT NULL
    UNION ALL
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NULL AND queue = g.queue AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NULL
),
need AS (
    SELECT c.id, c.priority, c.scheduled_at, s.scope FROM limited c CROSS JOIN LATERAL unnest(c.scopes) AS s(scope)
),
blocked AS MATERIALIZED (
    SELECT DISTINCT r.id
      FROM (SELECT n.id, n.scope, row_number() OVER (PARTITION BY n.scope
                                                     ORDER BY n.priority DESC, n.scheduled_at, n.id) AS place
              FROM need n WHERE (SELECT coalesce(bool_or(cardinality(scopes) > 1), false) FROM looked)) r
      JOIN scopes m ON m.scope = r.scope
     WHERE r.place > m.room
),
admitted AS (
    SELECT c.id, c.priority, c.scheduled_at, c.attempt, c.scopes FROM limited c
     WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.id = c.id)
),
chosen AS MATERIALIZED (
    SELECT id, attempt, scopes
      FROM (SELECT id, priority, scheduled_at, attempt, NULL::text[] AS scopes FROM fast
            UNION ALL SELECT id, priority, scheduled_at, attempt, scopes FROM admitted) a
     ORDER BY priority DESC, scheduled_at, id LIMIT %(limit)s
),
taken AS (
    UPDATE "public"."miniqueue_limits" l
       SET (holder_ids, holder_attempts) = (
               SELECT CASE WHEN l.max_running IS NULL THEN l.holder_ids
                           ELSE coalesce(array_agg(h.id ORDER BY h.id), '{}') || t.ids END,
                      CASE WHEN l.max_running IS NULL THEN l.holder_attempts
                           ELSE coalesce(array_agg(h.attempt ORDER BY h.id), '{}') || t.attempts END
                 FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt) LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id
                WHERE l.max_running > 1 AND ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT EXISTS (SELECT 1 FROM unnest(%(ids)b::bigint[], %(attempts)b::int[]) AS c(id, attempt)
                WHERE c.id = h.id AND c.attempt = h.attempt)),
           tokens = CASE WHEN l.rate IS NULL THEN l.tokens ELSE least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) - t.used END,
           refilled_at = CASE WHEN l.rate IS NULL THEN l.refilled_at ELSE greatest(l.refilled_at, now()) END
      FROM (SELECT s.scope, count(*) AS used, array_agg(c.id) AS ids, array_agg(c.attempt + 1) AS attempts
              FROM chosen c CROSS JOIN LATERAL unnest(c.scopes) AS s(scope) GROUP BY s.scope) t
     WHERE l.scope = t.scope
),
claimed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'running', leased_by = %(worker)s, attempt = attempt + 1,
       lease_expires_at = now() + make_interval(secs => %(lease)s)
 WHERE id = ANY(ARRAY(SELECT id FROM chosen))
RETURNING id, queue, task, payload, priority, attempt, max_attempts, scheduled_at, created_at, lease_expires_at,
          limits, parents, trace_context, attempt_budget
)
SELECT CASE WHEN row_number() OVER () = 1 THEN d.ids END, c.*
  FROM (SELECT array_agg(id) AS ids FROM completed) d LEFT JOIN claimed c ON true
 WHERE (SELECT count(*) FROM settled) >= 0;

-- _complete_and_claim_many
WITH RECURSIVE completed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'completed', completed_at = now(), finished_at = now(), lease_expires_at = NULL, leased_by = NULL,
       result = CASE WHEN cardinality(%(results)b::text[]) > 0
                     THEN ((%(results)b::text[])[width_bucket(id, %(ids)b::bigint[])])::jsonb END
 WHERE id = ANY(%(ids)b::bigint[])
   AND attempt = (%(attempts)b::int[])[width_bucket(id, %(ids)b::bigint[])]
   AND state = 'running' AND leased_by = %(worker)s
RETURNING id, queue, state, dependents, awaited, limits, sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, count)
SELECT queue, state, pg_backend_pid() %% 64, count(*) FROM completed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard) DO UPDATE SET count = c.count + excluded.count
RETURNING 1), per_minute AS (
INSERT INTO "public"."miniqueue_finished_minutes" AS m (minute, state, shard, count)
SELECT date_trunc('minute', now()), state, pg_backend_pid() %% 64, count(*) FROM completed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY state
ON CONFLICT (minute, state, shard) DO UPDATE SET count = m.count + excluded.count
RETURNING 1), settled AS (
SELECT "public"."miniqueue_settle"(
    notify_ids => ARRAY(SELECT id FROM completed WHERE awaited AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')),
    released => ARRAY(SELECT d FROM completed, unnest(dependents) AS d WHERE state = 'completed'),
    cancel_children => ARRAY(SELECT d FROM completed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_parents => ARRAY(SELECT id FROM completed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_states => ARRAY(SELECT state FROM completed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    channel => 'miniqueue_public_finished', queue_channel => 'miniqueue_public',
    sequence_keys => ARRAY(SELECT DISTINCT sequence_key FROM completed WHERE sequence_key IS NOT NULL AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')))
 WHERE EXISTS (SELECT 1 FROM completed WHERE (dependents IS NOT NULL OR awaited OR sequence_key IS NOT NULL) AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted'))
   AND (SELECT count(*) FROM counted) >= 0), 
fast AS MATERIALIZED (
    SELECT c.id, c.priority, c.scheduled_at, c.attempt FROM unnest(%(queues)b::text[]) AS q(name)
     CROSS JOIN LATERAL (
        SELECT id, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND queue = q.name AND limits IS NULL AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c
     WHERE NOT EXISTS (SELECT 1 FROM "public"."miniqueue_queues" p WHERE p.name = q.name AND (p.paused OR p.max_running IS NOT NULL))
     ORDER BY c.priority DESC, c.scheduled_at, c.id
     LIMIT %(limit)s),
open_queues AS MATERIALIZED (
    SELECT q.name, p.max_running,
           CASE WHEN p.max_running IS NULL THEN '{}'::text[] ELSE ARRAY['queue ' || q.name] END AS scope
      FROM unnest(%(queues)b::text[]) AS q(name) LEFT JOIN "public"."miniqueue_queues" p ON p.name = q.name
     WHERE NOT coalesce(p.paused, false)
),
kept AS MATERIALIZED (
    SELECT DISTINCT k.queue, k.limits, q.scope FROM (SELECT queue, limits FROM completed WHERE limits IS NOT NULL) k JOIN open_queues q ON q.name = k.queue LIMIT %(kept)s
),
groups(queue, scope, limits, depth) AS (
    SELECT q.name, q.scope, f.limits, 1 FROM open_queues q CROSS JOIN LATERAL (
        SELECT limits FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = q.name AND limits > %(after)s::text[]
         ORDER BY limits LIMIT 1) f
    UNION ALL
    SELECT g.queue, g.scope, n.limits, g.depth + 1 FROM groups g CROSS JOIN LATERAL (
        SELECT limits FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits > g.limits
         ORDER BY limits LIMIT 1) n
     WHERE g.depth < %(scan)s
),
snapshot AS MATERIALIZED (  -- this statement's snapshot, xids modulo 2^32 (see _TOUCHED)
    SELECT pg_snapshot_xmax(s)::text::bigint & 4294967295 AS next,
           ARRAY(SELECT x::text::bigint & 4294967295 FROM pg_snapshot_xip(s) AS x) AS running
      FROM pg_current_snapshot() AS s
),
looked AS MATERIALIZED (
    SELECT g.queue, g.limits, g.scopes, s.locked, s.rooms, s.room FROM (
        SELECT q.name AS queue, NULL::text[] AS limits, q.scope AS scopes
          FROM open_queues q WHERE q.max_running IS NOT NULL
        UNION ALL
        SELECT queue, limits, limits || scope FROM kept
        UNION ALL
        SELECT queue, limits, limits || scope FROM groups r
         WHERE NOT EXISTS (SELECT 1 FROM kept k WHERE k.queue = r.queue AND k.limits = r.limits)) g
     CROSS JOIN snapshot t CROSS JOIN LATERAL (
        SELECT array_agg(x.scope) AS locked, array_agg(x.room) AS rooms, min(x.room) AS room
          FROM (SELECT l.scope, CASE WHEN l.max_running = 1 THEN 1 ELSE CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT EXISTS (SELECT 1 FROM unnest(%(ids)b::bigint[], %(attempts)b::int[]) AS c(id, attempt)
                WHERE c.id = h.id AND c.attempt = h.attempt))::int
     END END AS room
                  FROM "public"."miniqueue_limits" l WHERE l.scope = ANY(g.scopes) AND NOT (l.xmax <> '0'
               AND ((l.xmax::text::bigint - t.next) & 4294967295 < 1048576 OR l.xmax::text::bigint = ANY(t.running))
               AND l.xmax::text::bigint IS DISTINCT FROM pg_current_xact_id_if_assigned()::text::bigint & 4294967295) AND CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT EXISTS (SELECT 1 FROM unnest(%(ids)b::bigint[], %(attempts)b::int[]) AS c(id, attempt)
                WHERE c.id = h.id AND c.attempt = h.attempt))::int
     END > 0
                   FOR UPDATE OF l SKIP LOCKED) x
        OFFSET 0) s
     WHERE cardinality(s.locked) = cardinality(g.scopes)
     LIMIT %(groups)s
),
scopes AS MATERIALIZED (
    SELECT DISTINCT ON (r.scope) r.scope, r.room
      FROM looked g CROSS JOIN LATERAL unnest(g.locked, g.rooms) AS r(scope, room)
     WHERE true
),
limited AS MATERIALIZED (
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits = g.limits
           AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NOT NULL
    UNION ALL
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NULL AND queue = g.queue AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NULL
),
need AS (
    SELECT c.id, c.priority, c.scheduled_at, s.scope FROM limited c CROSS JOIN LATERAL unnest(c.scopes) AS s(scope)
),
blocked AS MATERIALIZED (
    SELECT DISTINCT r.id
      FROM (SELECT n.id, n.scope, row_number() OVER (PARTITION BY n.scope
                                                     ORDER BY n.priority DESC, n.scheduled_at, n.id) AS place
              FROM need n WHERE true) r
      JOIN scopes m ON m.scope = r.scope
     WHERE r.place > m.room
),
admitted AS (
    SELECT c.id, c.priority, c.scheduled_at, c.attempt, c.scopes FROM limited c
     WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.id = c.id)
),
chosen AS MATERIALIZED (
    SELECT id, attempt, scopes
      FROM (SELECT id, priority, scheduled_at, attempt, NULL::text[] AS scopes FROM fast
            UNION ALL SELECT id, priority, scheduled_at, attempt, scopes FROM admitted) a
     ORDER BY priority DESC, scheduled_at, id LIMIT %(limit)s
),
taken AS (
    UPDATE "public"."miniqueue_limits" l
       SET (holder_ids, holder_attempts) = (
               SELECT CASE WHEN l.max_running IS NULL THEN l.holder_ids
                           ELSE coalesce(array_agg(h.id ORDER BY h.id), '{}') || t.ids END,
                      CASE WHEN l.max_running IS NULL THEN l.holder_attempts
                           ELSE coalesce(array_agg(h.attempt ORDER BY h.id), '{}') || t.attempts END
                 FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt) LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id
                WHERE l.max_running > 1 AND ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT EXISTS (SELECT 1 FROM unnest(%(ids)b::bigint[], %(attempts)b::int[]) AS c(id, attempt)
                WHERE c.id = h.id AND c.attempt = h.attempt)),
           tokens = CASE WHEN l.rate IS NULL THEN l.tokens ELSE least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) - t.used END,
           refilled_at = CASE WHEN l.rate IS NULL THEN l.refilled_at ELSE greatest(l.refilled_at, now()) END
      FROM (SELECT s.scope, count(*) AS used, array_agg(c.id) AS ids, array_agg(c.attempt + 1) AS attempts
              FROM chosen c CROSS JOIN LATERAL unnest(c.scopes) AS s(scope) GROUP BY s.scope) t
     WHERE l.scope = t.scope
),
claimed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'running', leased_by = %(worker)s, attempt = attempt + 1,
       lease_expires_at = now() + make_interval(secs => %(lease)s)
 WHERE id = ANY(ARRAY(SELECT id FROM chosen))
RETURNING id, queue, task, payload, priority, attempt, max_attempts, scheduled_at, created_at, lease_expires_at,
          limits, parents, trace_context, attempt_budget
)
SELECT CASE WHEN row_number() OVER () = 1 THEN d.ids END, c.*
  FROM (SELECT array_agg(id) AS ids FROM completed) d LEFT JOIN claimed c ON true
 WHERE (SELECT count(*) FROM settled) >= 0;

-- _complete_and_claim_one_down
WITH RECURSIVE completed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'completed', completed_at = now(), finished_at = now(), lease_expires_at = NULL, leased_by = NULL,
       result = CASE WHEN cardinality(%(results)b::text[]) > 0
                     THEN ((%(results)b::text[])[width_bucket(id, %(ids)b::bigint[])])::jsonb END
 WHERE id = ANY(%(ids)b::bigint[])
   AND attempt = (%(attempts)b::int[])[width_bucket(id, %(ids)b::bigint[])]
   AND state = 'running' AND leased_by = %(worker)s
RETURNING id, queue, state, dependents, awaited, limits, sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, count)
SELECT queue, state, pg_backend_pid() %% 64, count(*) FROM completed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard) DO UPDATE SET count = c.count + excluded.count
RETURNING 1), per_minute AS (
INSERT INTO "public"."miniqueue_finished_minutes" AS m (minute, state, shard, count)
SELECT date_trunc('minute', now()), state, pg_backend_pid() %% 64, count(*) FROM completed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY state
ON CONFLICT (minute, state, shard) DO UPDATE SET count = m.count + excluded.count
RETURNING 1), settled AS (
SELECT "public"."miniqueue_settle"(
    notify_ids => ARRAY(SELECT id FROM completed WHERE awaited AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')),
    released => ARRAY(SELECT d FROM completed, unnest(dependents) AS d WHERE state = 'completed'),
    cancel_children => ARRAY(SELECT d FROM completed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_parents => ARRAY(SELECT id FROM completed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_states => ARRAY(SELECT state FROM completed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    channel => 'miniqueue_public_finished', queue_channel => 'miniqueue_public',
    sequence_keys => ARRAY(SELECT DISTINCT sequence_key FROM completed WHERE sequence_key IS NOT NULL AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')))
 WHERE EXISTS (SELECT 1 FROM completed WHERE (dependents IS NOT NULL OR awaited OR sequence_key IS NOT NULL) AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted'))
   AND (SELECT count(*) FROM counted) >= 0), 
fast AS MATERIALIZED (
    SELECT id, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
     WHERE state = 'available' AND queue = %(queue)s AND limits IS NULL AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
       AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_queues" WHERE name = %(queue)s AND (paused OR max_running IS NOT NULL))
     ORDER BY priority DESC, scheduled_at, id
     LIMIT %(limit)s FOR UPDATE SKIP LOCKED),
open_queues AS MATERIALIZED (
    SELECT q.name, p.max_running,
           CASE WHEN p.max_running IS NULL THEN '{}'::text[] ELSE ARRAY['queue ' || q.name] END AS scope
      FROM (VALUES (%(queue)s::text)) AS q(name) LEFT JOIN "public"."miniqueue_queues" p ON p.name = q.name
     WHERE NOT coalesce(p.paused, false)
),
kept AS MATERIALIZED (
    SELECT DISTINCT k.queue, k.limits, q.scope FROM (SELECT queue, limits FROM completed WHERE limits IS NOT NULL) k JOIN open_queues q ON q.name = k.queue LIMIT %(kept)s
),
groups(queue, scope, limits, depth) AS (
    SELECT q.name, q.scope, f.limits, 1 FROM open_queues q CROSS JOIN LATERAL (
        SELECT limits FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = q.name AND limits < %(after)s::text[]
         ORDER BY limits DESC LIMIT 1) f
    UNION ALL
    SELECT g.queue, g.scope, n.limits, g.depth + 1 FROM groups g CROSS JOIN LATERAL (
        SELECT limits FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits < g.limits
         ORDER BY limits DESC LIMIT 1) n
     WHERE g.depth < %(scan)s
),
snapshot AS MATERIALIZED (  -- this statement's snapshot, xids modulo 2^32 (see _TOUCHED)
    SELECT pg_snapshot_xmax(s)::text::bigint & 4294967295 AS next,
           ARRAY(SELECT x::text::bigint & 4294967295 FROM pg_snapshot_xip(s) AS x) AS running
      FROM pg_current_snapshot() AS s
),
looked AS MATERIALIZED (
    SELECT g.queue, g.limits, g.scopes, s.locked, s.rooms, s.room FROM (
        SELECT q.name AS queue, NULL::text[] AS limits, q.scope AS scopes
          FROM open_queues q WHERE q.max_running IS NOT NULL
        UNION ALL
        SELECT queue, limits, limits || scope FROM kept
        UNION ALL
        SELECT queue, limits, limits || scope FROM groups r
         WHERE NOT EXISTS (SELECT 1 FROM kept k WHERE k.queue = r.queue AND k.limits = r.limits)) g
     CROSS JOIN snapshot t CROSS JOIN LATERAL (
        SELECT array_agg(x.scope) AS locked, array_agg(x.room) AS rooms, min(x.room) AS room
          FROM (SELECT l.scope, CASE WHEN l.max_running = 1 THEN 1 ELSE CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT EXISTS (SELECT 1 FROM unnest(%(ids)b::bigint[], %(attempts)b::int[]) AS c(id, attempt)
                WHERE c.id = h.id AND c.attempt = h.attempt))::int
     END END AS room
                  FROM "public"."miniqueue_limits" l WHERE l.scope = ANY(g.scopes) AND NOT (l.xmax <> '0'
               AND ((l.xmax::text::bigint - t.next) & 4294967295 < 1048576 OR l.xmax::text::bigint = ANY(t.running))
               AND l.xmax::text::bigint IS DISTINCT FROM pg_current_xact_id_if_assigned()::text::bigint & 4294967295) AND CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT EXISTS (SELECT 1 FROM unnest(%(ids)b::bigint[], %(attempts)b::int[]) AS c(id, attempt)
                WHERE c.id = h.id AND c.attempt = h.attempt))::int
     END > 0
                   FOR UPDATE OF l SKIP LOCKED) x
        OFFSET 0) s
     WHERE cardinality(s.locked) = cardinality(g.scopes)
     LIMIT %(groups)s
),
scopes AS MATERIALIZED (
    SELECT DISTINCT ON (r.scope) r.scope, r.room
      FROM looked g CROSS JOIN LATERAL unnest(g.locked, g.rooms) AS r(scope, room)
     WHERE (SELECT coalesce(bool_or(cardinality(scopes) > 1), false) FROM looked)
),
limited AS MATERIALIZED (
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits = g.limits
           AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NOT NULL
    UNION ALL
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NULL AND queue = g.queue AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NULL
),
need AS (
    SELECT c.id, c.priority, c.scheduled_at, s.scope FROM limited c CROSS JOIN LATERAL unnest(c.scopes) AS s(scope)
),
blocked AS MATERIALIZED (
    SELECT DISTINCT r.id
      FROM (SELECT n.id, n.scope, row_number() OVER (PARTITION BY n.scope
                                                     ORDER BY n.priority DESC, n.scheduled_at, n.id) AS place
              FROM need n WHERE (SELECT coalesce(bool_or(cardinality(scopes) > 1), false) FROM looked)) r
      JOIN scopes m ON m.scope = r.scope
     WHERE r.place > m.room
),
admitted AS (
    SELECT c.id, c.priority, c.scheduled_at, c.attempt, c.scopes FROM limited c
     WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.id = c.id)
),
chosen AS MATERIALIZED (
    SELECT id, attempt, scopes
      FROM (SELECT id, priority, scheduled_at, attempt, NULL::text[] AS scopes FROM fast
            UNION ALL SELECT id, priority, scheduled_at, attempt, scopes FROM admitted) a
     ORDER BY priority DESC, scheduled_at, id LIMIT %(limit)s
),
taken AS (
    UPDATE "public"."miniqueue_limits" l
       SET (holder_ids, holder_attempts) = (
               SELECT CASE WHEN l.max_running IS NULL THEN l.holder_ids
                           ELSE coalesce(array_agg(h.id ORDER BY h.id), '{}') || t.ids END,
                      CASE WHEN l.max_running IS NULL THEN l.holder_attempts
                           ELSE coalesce(array_agg(h.attempt ORDER BY h.id), '{}') || t.attempts END
                 FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt) LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id
                WHERE l.max_running > 1 AND ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT EXISTS (SELECT 1 FROM unnest(%(ids)b::bigint[], %(attempts)b::int[]) AS c(id, attempt)
                WHERE c.id = h.id AND c.attempt = h.attempt)),
           tokens = CASE WHEN l.rate IS NULL THEN l.tokens ELSE least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) - t.used END,
           refilled_at = CASE WHEN l.rate IS NULL THEN l.refilled_at ELSE greatest(l.refilled_at, now()) END
      FROM (SELECT s.scope, count(*) AS used, array_agg(c.id) AS ids, array_agg(c.attempt + 1) AS attempts
              FROM chosen c CROSS JOIN LATERAL unnest(c.scopes) AS s(scope) GROUP BY s.scope) t
     WHERE l.scope = t.scope
),
claimed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'running', leased_by = %(worker)s, attempt = attempt + 1,
       lease_expires_at = now() + make_interval(secs => %(lease)s)
 WHERE id = ANY(ARRAY(SELECT id FROM chosen))
RETURNING id, queue, task, payload, priority, attempt, max_attempts, scheduled_at, created_at, lease_expires_at,
          limits, parents, trace_context, attempt_budget
)
SELECT CASE WHEN row_number() OVER () = 1 THEN d.ids END, c.*
  FROM (SELECT array_agg(id) AS ids FROM completed) d LEFT JOIN claimed c ON true
 WHERE (SELECT count(*) FROM settled) >= 0;

-- _complete_and_claim_many_down
WITH RECURSIVE completed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'completed', completed_at = now(), finished_at = now(), lease_expires_at = NULL, leased_by = NULL,
       result = CASE WHEN cardinality(%(results)b::text[]) > 0
                     THEN ((%(results)b::text[])[width_bucket(id, %(ids)b::bigint[])])::jsonb END
 WHERE id = ANY(%(ids)b::bigint[])
   AND attempt = (%(attempts)b::int[])[width_bucket(id, %(ids)b::bigint[])]
   AND state = 'running' AND leased_by = %(worker)s
RETURNING id, queue, state, dependents, awaited, limits, sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, count)
SELECT queue, state, pg_backend_pid() %% 64, count(*) FROM completed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard) DO UPDATE SET count = c.count + excluded.count
RETURNING 1), per_minute AS (
INSERT INTO "public"."miniqueue_finished_minutes" AS m (minute, state, shard, count)
SELECT date_trunc('minute', now()), state, pg_backend_pid() %% 64, count(*) FROM completed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY state
ON CONFLICT (minute, state, shard) DO UPDATE SET count = m.count + excluded.count
RETURNING 1), settled AS (
SELECT "public"."miniqueue_settle"(
    notify_ids => ARRAY(SELECT id FROM completed WHERE awaited AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')),
    released => ARRAY(SELECT d FROM completed, unnest(dependents) AS d WHERE state = 'completed'),
    cancel_children => ARRAY(SELECT d FROM completed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_parents => ARRAY(SELECT id FROM completed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_states => ARRAY(SELECT state FROM completed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    channel => 'miniqueue_public_finished', queue_channel => 'miniqueue_public',
    sequence_keys => ARRAY(SELECT DISTINCT sequence_key FROM completed WHERE sequence_key IS NOT NULL AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')))
 WHERE EXISTS (SELECT 1 FROM completed WHERE (dependents IS NOT NULL OR awaited OR sequence_key IS NOT NULL) AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted'))
   AND (SELECT count(*) FROM counted) >= 0), 
fast AS MATERIALIZED (
    SELECT c.id, c.priority, c.scheduled_at, c.attempt FROM unnest(%(queues)b::text[]) AS q(name)
     CROSS JOIN LATERAL (
        SELECT id, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND queue = q.name AND limits IS NULL AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c
     WHERE NOT EXISTS (SELECT 1 FROM "public"."miniqueue_queues" p WHERE p.name = q.name AND (p.paused OR p.max_running IS NOT NULL))
     ORDER BY c.priority DESC, c.scheduled_at, c.id
     LIMIT %(limit)s),
open_queues AS MATERIALIZED (
    SELECT q.name, p.max_running,
           CASE WHEN p.max_running IS NULL THEN '{}'::text[] ELSE ARRAY['queue ' || q.name] END AS scope
      FROM unnest(%(queues)b::text[]) AS q(name) LEFT JOIN "public"."miniqueue_queues" p ON p.name = q.name
     WHERE NOT coalesce(p.paused, false)
),
kept AS MATERIALIZED (
    SELECT DISTINCT k.queue, k.limits, q.scope FROM (SELECT queue, limits FROM completed WHERE limits IS NOT NULL) k JOIN open_queues q ON q.name = k.queue LIMIT %(kept)s
),
groups(queue, scope, limits, depth) AS (
    SELECT q.name, q.scope, f.limits, 1 FROM open_queues q CROSS JOIN LATERAL (
        SELECT limits FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = q.name AND limits < %(after)s::text[]
         ORDER BY limits DESC LIMIT 1) f
    UNION ALL
    SELECT g.queue, g.scope, n.limits, g.depth + 1 FROM groups g CROSS JOIN LATERAL (
        SELECT limits FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits < g.limits
         ORDER BY limits DESC LIMIT 1) n
     WHERE g.depth < %(scan)s
),
snapshot AS MATERIALIZED (  -- this statement's snapshot, xids modulo 2^32 (see _TOUCHED)
    SELECT pg_snapshot_xmax(s)::text::bigint & 4294967295 AS next,
           ARRAY(SELECT x::text::bigint & 4294967295 FROM pg_snapshot_xip(s) AS x) AS running
      FROM pg_current_snapshot() AS s
),
looked AS MATERIALIZED (
    SELECT g.queue, g.limits, g.scopes, s.locked, s.rooms, s.room FROM (
        SELECT q.name AS queue, NULL::text[] AS limits, q.scope AS scopes
          FROM open_queues q WHERE q.max_running IS NOT NULL
        UNION ALL
        SELECT queue, limits, limits || scope FROM kept
        UNION ALL
        SELECT queue, limits, limits || scope FROM groups r
         WHERE NOT EXISTS (SELECT 1 FROM kept k WHERE k.queue = r.queue AND k.limits = r.limits)) g
     CROSS JOIN snapshot t CROSS JOIN LATERAL (
        SELECT array_agg(x.scope) AS locked, array_agg(x.room) AS rooms, min(x.room) AS room
          FROM (SELECT l.scope, CASE WHEN l.max_running = 1 THEN 1 ELSE CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT EXISTS (SELECT 1 FROM unnest(%(ids)b::bigint[], %(attempts)b::int[]) AS c(id, attempt)
                WHERE c.id = h.id AND c.attempt = h.attempt))::int
     END END AS room
                  FROM "public"."miniqueue_limits" l WHERE l.scope = ANY(g.scopes) AND NOT (l.xmax <> '0'
               AND ((l.xmax::text::bigint - t.next) & 4294967295 < 1048576 OR l.xmax::text::bigint = ANY(t.running))
               AND l.xmax::text::bigint IS DISTINCT FROM pg_current_xact_id_if_assigned()::text::bigint & 4294967295) AND CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT EXISTS (SELECT 1 FROM unnest(%(ids)b::bigint[], %(attempts)b::int[]) AS c(id, attempt)
                WHERE c.id = h.id AND c.attempt = h.attempt))::int
     END > 0
                   FOR UPDATE OF l SKIP LOCKED) x
        OFFSET 0) s
     WHERE cardinality(s.locked) = cardinality(g.scopes)
     LIMIT %(groups)s
),
scopes AS MATERIALIZED (
    SELECT DISTINCT ON (r.scope) r.scope, r.room
      FROM looked g CROSS JOIN LATERAL unnest(g.locked, g.rooms) AS r(scope, room)
     WHERE true
),
limited AS MATERIALIZED (
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits = g.limits
           AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NOT NULL
    UNION ALL
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NULL AND queue = g.queue AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NULL
),
need AS (
    SELECT c.id, c.priority, c.scheduled_at, s.scope FROM limited c CROSS JOIN LATERAL unnest(c.scopes) AS s(scope)
),
blocked AS MATERIALIZED (
    SELECT DISTINCT r.id
      FROM (SELECT n.id, n.scope, row_number() OVER (PARTITION BY n.scope
                                                     ORDER BY n.priority DESC, n.scheduled_at, n.id) AS place
              FROM need n WHERE true) r
      JOIN scopes m ON m.scope = r.scope
     WHERE r.place > m.room
),
admitted AS (
    SELECT c.id, c.priority, c.scheduled_at, c.attempt, c.scopes FROM limited c
     WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.id = c.id)
),
chosen AS MATERIALIZED (
    SELECT id, attempt, scopes
      FROM (SELECT id, priority, scheduled_at, attempt, NULL::text[] AS scopes FROM fast
            UNION ALL SELECT id, priority, scheduled_at, attempt, scopes FROM admitted) a
     ORDER BY priority DESC, scheduled_at, id LIMIT %(limit)s
),
taken AS (
    UPDATE "public"."miniqueue_limits" l
       SET (holder_ids, holder_attempts) = (
               SELECT CASE WHEN l.max_running IS NULL THEN l.holder_ids
                           ELSE coalesce(array_agg(h.id ORDER BY h.id), '{}') || t.ids END,
                      CASE WHEN l.max_running IS NULL THEN l.holder_attempts
                           ELSE coalesce(array_agg(h.attempt ORDER BY h.id), '{}') || t.attempts END
                 FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt) LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id
                WHERE l.max_running > 1 AND ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT EXISTS (SELECT 1 FROM unnest(%(ids)b::bigint[], %(attempts)b::int[]) AS c(id, attempt)
                WHERE c.id = h.id AND c.attempt = h.attempt)),
           tokens = CASE WHEN l.rate IS NULL THEN l.tokens ELSE least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) - t.used END,
           refilled_at = CASE WHEN l.rate IS NULL THEN l.refilled_at ELSE greatest(l.refilled_at, now()) END
      FROM (SELECT s.scope, count(*) AS used, array_agg(c.id) AS ids, array_agg(c.attempt + 1) AS attempts
              FROM chosen c CROSS JOIN LATERAL unnest(c.scopes) AS s(scope) GROUP BY s.scope) t
     WHERE l.scope = t.scope
),
claimed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'running', leased_by = %(worker)s, attempt = attempt + 1,
       lease_expires_at = now() + make_interval(secs => %(lease)s)
 WHERE id = ANY(ARRAY(SELECT id FROM chosen))
RETURNING id, queue, task, payload, priority, attempt, max_attempts, scheduled_at, created_at, lease_expires_at,
          limits, parents, trace_context, attempt_budget
)
SELECT CASE WHEN row_number() OVER () = 1 THEN d.ids END, c.*
  FROM (SELECT array_agg(id) AS ids FROM completed) d LEFT JOIN claimed c ON true
 WHERE (SELECT count(*) FROM settled) >= 0;

-- _complete
WITH completed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'completed', completed_at = now(), finished_at = now(), lease_expires_at = NULL, leased_by = NULL,
       result = CASE WHEN cardinality(%(results)b::text[]) > 0
                     THEN ((%(results)b::text[])[width_bucket(id, %(ids)b::bigint[])])::jsonb END
 WHERE id = ANY(%(ids)b::bigint[])
   AND attempt = (%(attempts)b::int[])[width_bucket(id, %(ids)b::bigint[])]
   AND state = 'running' AND leased_by = %(worker)s
RETURNING id, queue, state, dependents, awaited, limits, sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, count)
SELECT queue, state, pg_backend_pid() %% 64, count(*) FROM completed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard) DO UPDATE SET count = c.count + excluded.count
RETURNING 1), per_minute AS (
INSERT INTO "public"."miniqueue_finished_minutes" AS m (minute, state, shard, count)
SELECT date_trunc('minute', now()), state, pg_backend_pid() %% 64, count(*) FROM completed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY state
ON CONFLICT (minute, state, shard) DO UPDATE SET count = m.count + excluded.count
RETURNING 1), settled AS (
SELECT "public"."miniqueue_settle"(
    notify_ids => ARRAY(SELECT id FROM completed WHERE awaited AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')),
    released => ARRAY(SELECT d FROM completed, unnest(dependents) AS d WHERE state = 'completed'),
    cancel_children => ARRAY(SELECT d FROM completed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_parents => ARRAY(SELECT id FROM completed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_states => ARRAY(SELECT state FROM completed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    channel => 'miniqueue_public_finished', queue_channel => 'miniqueue_public',
    sequence_keys => ARRAY(SELECT DISTINCT sequence_key FROM completed WHERE sequence_key IS NOT NULL AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')))
 WHERE EXISTS (SELECT 1 FROM completed WHERE (dependents IS NOT NULL OR awaited OR sequence_key IS NOT NULL) AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted'))
   AND (SELECT count(*) FROM counted) >= 0)
SELECT id FROM completed WHERE (SELECT count(*) FROM settled) >= 0;

-- _renew
UPDATE "public"."miniqueue_jobs"
   SET lease_expires_at = now() + make_interval(secs => %(lease)s)
 WHERE id = ANY(%(ids)b::bigint[])
   AND attempt = (%(attempts)b::int[])[width_bucket(id, %(ids)b::bigint[])]
   AND state = 'running' AND leased_by = %(worker)s
RETURNING id, lease_expires_at;

-- _record_failures
WITH failed AS (
UPDATE "public"."miniqueue_jobs" j
   SET state = CASE WHEN j.attempt >= j.max_attempts THEN 'dead' ELSE 'available' END,
       scheduled_at = CASE WHEN j.attempt >= j.max_attempts THEN j.scheduled_at
                           ELSE now() + make_interval(secs => coalesce(
                               f.backoff, "public"."miniqueue_retry_delay"(task => j.task, attempt => j.attempt,
                                   default_base => %(base)s, default_cap => %(cap)s))) END,
       finished_at = CASE WHEN j.attempt >= j.max_attempts THEN now() END,
       last_error = f.error, errors = j.errors || jsonb_build_array(jsonb_build_object(
       'attempt', j.attempt, 'at', now(), 'worker', j.leased_by, 'error', f.error)), lease_expires_at = NULL, leased_by = NULL
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(errors)s::text[], %(backoffs)s::float8[])
       AS f(id, attempt, error, backoff)
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = f.id AND j.attempt = f.attempt AND state = 'running' AND leased_by = %(worker)s
RETURNING j.id, j.queue, j.state, j.dependents, j.awaited, j.sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, count)
SELECT queue, state, pg_backend_pid() %% 64, count(*) FROM failed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard) DO UPDATE SET count = c.count + excluded.count
RETURNING 1), per_minute AS (
INSERT INTO "public"."miniqueue_finished_minutes" AS m (minute, state, shard, count)
SELECT date_trunc('minute', now()), state, pg_backend_pid() %% 64, count(*) FROM failed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY state
ON CONFLICT (minute, state, shard) DO UPDATE SET count = m.count + excluded.count
RETURNING 1), settled AS (
SELECT "public"."miniqueue_settle"(
    notify_ids => ARRAY(SELECT id FROM failed WHERE awaited AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')),
    released => ARRAY(SELECT d FROM failed, unnest(dependents) AS d WHERE state = 'completed'),
    cancel_children => ARRAY(SELECT d FROM failed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_parents => ARRAY(SELECT id FROM failed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_states => ARRAY(SELECT state FROM failed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    channel => 'miniqueue_public_finished', queue_channel => 'miniqueue_public',
    sequence_keys => ARRAY(SELECT DISTINCT sequence_key FROM failed WHERE sequence_key IS NOT NULL AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')))
 WHERE EXISTS (SELECT 1 FROM failed WHERE (dependents IS NOT NULL OR awaited OR sequence_key IS NOT NULL) AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted'))
   AND (SELECT count(*) FROM counted) >= 0)
SELECT id, state FROM failed WHERE (SELECT count(*) FROM settled) >= 0;

-- _fail
WITH failed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'failed', finished_at = now(), last_error = %(error)s, errors = errors || jsonb_build_array(jsonb_build_object(
       'attempt', attempt, 'at', now(), 'worker', leased_by, 'error', %(error)s::text)),
       lease_expires_at = NULL, leased_by = NULL
 WHERE id = %(id)s AND attempt = %(attempt)s AND state = 'running' AND leased_by = %(worker)s
RETURNING id, queue, state, dependents, awaited, sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, count)
SELECT queue, state, pg_backend_pid() %% 64, count(*) FROM failed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard) DO UPDATE SET count = c.count + excluded.count
RETURNING 1), per_minute AS (
INSERT INTO "public"."miniqueue_finished_minutes" AS m (minute, state, shard, count)
SELECT date_trunc('minute', now()), state, pg_backend_pid() %% 64, count(*) FROM failed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY state
ON CONFLICT (minute, state, shard) DO UPDATE SET count = m.count + excluded.count
RETURNING 1), settled AS (
SELECT "public"."miniqueue_settle"(
    notify_ids => ARRAY(SELECT id FROM failed WHERE awaited AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')),
    released => ARRAY(SELECT d FROM failed, unnest(dependents) AS d WHERE state = 'completed'),
    cancel_children => ARRAY(SELECT d FROM failed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_parents => ARRAY(SELECT id FROM failed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_states => ARRAY(SELECT state FROM failed, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    channel => 'miniqueue_public_finished', queue_channel => 'miniqueue_public',
    sequence_keys => ARRAY(SELECT DISTINCT sequence_key FROM failed WHERE sequence_key IS NOT NULL AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')))
 WHERE EXISTS (SELECT 1 FROM failed WHERE (dependents IS NOT NULL OR awaited OR sequence_key IS NOT NULL) AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted'))
   AND (SELECT count(*) FROM counted) >= 0)
SELECT id FROM failed WHERE (SELECT count(*) FROM settled) >= 0;

-- _snooze
UPDATE "public"."miniqueue_jobs"
   SET state = 'available', scheduled_at = now() + make_interval(secs => %(delay)s),
       max_attempts = max_attempts + 1, lease_expires_at = NULL, leased_by = NULL
 WHERE id = %(id)s AND attempt = %(attempt)s AND state = 'running' AND leased_by = %(worker)s
RETURNING id;

-- _release
UPDATE "public"."miniqueue_jobs" j
   SET state = 'available', max_attempts = j.max_attempts + 1, errors = j.errors || jsonb_build_array(jsonb_build_object(
       'attempt', j.attempt, 'at', now(), 'worker', j.leased_by, 'error', r.note)),
       lease_expires_at = NULL, leased_by = NULL
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(notes)s::text[]) AS r(id, attempt, note)
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = r.id AND j.attempt = r.attempt AND state = 'running' AND leased_by = %(worker)s
RETURNING j.id, pg_notify('miniqueue_public', j.queue);

-- _leases_of
SELECT id, attempt FROM "public"."miniqueue_jobs"
 WHERE state = 'running' AND leased_by = %(worker)s AND lease_expires_at IS NOT NULL;

-- _recover
WITH recovered AS (
UPDATE "public"."miniqueue_jobs"
   SET state = CASE WHEN attempt >= max_attempts THEN 'dead' ELSE 'available' END,
       scheduled_at = CASE WHEN attempt >= max_attempts THEN scheduled_at
                           ELSE now() + make_interval(secs => "public"."miniqueue_retry_delay"(task => task, attempt => attempt,
                               default_base => %(base)s, default_cap => %(cap)s)) END,
       finished_at = CASE WHEN attempt >= max_attempts THEN now() END,
       last_error = format('worker lost: %%s stopped renewing its lease on attempt %%s of %%s',
                           leased_by, attempt_budget - (max_attempts - attempt), attempt_budget),
       errors = errors || jsonb_build_array(jsonb_build_object(
       'attempt', attempt, 'at', now(), 'worker', leased_by, 'error', 'worker lost: lease expired without renewal')), lease_expires_at = NULL, leased_by = NULL
 WHERE id = ANY(ARRAY(
        SELECT id FROM "public"."miniqueue_jobs"
         WHERE state = 'running' AND lease_expires_at < now()
         ORDER BY lease_expires_at
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
   AND state = 'running' AND lease_expires_at < now()
RETURNING id, queue, state, dependents, awaited, sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, count)
SELECT queue, state, pg_backend_pid() %% 64, count(*) FROM recovered
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard) DO UPDATE SET count = c.count + excluded.count
RETURNING 1), per_minute AS (
INSERT INTO "public"."miniqueue_finished_minutes" AS m (minute, state, shard, count)
SELECT date_trunc('minute', now()), state, pg_backend_pid() %% 64, count(*) FROM recovered
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY state
ON CONFLICT (minute, state, shard) DO UPDATE SET count = m.count + excluded.count
RETURNING 1), settled AS (
SELECT "public"."miniqueue_settle"(
    notify_ids => ARRAY(SELECT id FROM recovered WHERE awaited AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')),
    released => ARRAY(SELECT d FROM recovered, unnest(dependents) AS d WHERE state = 'completed'),
    cancel_children => ARRAY(SELECT d FROM recovered, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_parents => ARRAY(SELECT id FROM recovered, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_states => ARRAY(SELECT state FROM recovered, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    channel => 'miniqueue_public_finished', queue_channel => 'miniqueue_public',
    sequence_keys => ARRAY(SELECT DISTINCT sequence_key FROM recovered WHERE sequence_key IS NOT NULL AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')))
 WHERE EXISTS (SELECT 1 FROM recovered WHERE (dependents IS NOT NULL OR awaited OR sequence_key IS NOT NULL) AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted'))
   AND (SELECT count(*) FROM counted) >= 0)
SELECT id, state FROM recovered WHERE (SELECT count(*) FROM settled) >= 0;

-- _expire
WITH expired AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'expired', finished_at = now(), pending_parents = 0,
       last_error = format('expired: not started by its deadline, %%s', expires_at),
       errors = errors || jsonb_build_array(jsonb_build_object(
       'attempt', attempt, 'at', now(), 'worker', leased_by, 'error', format('expired: not started by its deadline, %%s', expires_at)))
 WHERE id = ANY(ARRAY(
        SELECT id FROM "public"."miniqueue_jobs"
         WHERE expires_at <= now() AND expires_at IS NOT NULL AND state IN ('available', 'waiting')
         ORDER BY expires_at
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
   AND state IN ('available', 'waiting') AND expires_at <= now()
RETURNING id, queue, state, dependents, awaited, sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, count)
SELECT queue, state, pg_backend_pid() %% 64, count(*) FROM expired
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard) DO UPDATE SET count = c.count + excluded.count
RETURNING 1), per_minute AS (
INSERT INTO "public"."miniqueue_finished_minutes" AS m (minute, state, shard, count)
SELECT date_trunc('minute', now()), state, pg_backend_pid() %% 64, count(*) FROM expired
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY state
ON CONFLICT (minute, state, shard) DO UPDATE SET count = m.count + excluded.count
RETURNING 1), settled AS (
SELECT "public"."miniqueue_settle"(
    notify_ids => ARRAY(SELECT id FROM expired WHERE awaited AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')),
    released => ARRAY(SELECT d FROM expired, unnest(dependents) AS d WHERE state = 'completed'),
    cancel_children => ARRAY(SELECT d FROM expired, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_parents => ARRAY(SELECT id FROM expired, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_states => ARRAY(SELECT state FROM expired, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    channel => 'miniqueue_public_finished', queue_channel => 'miniqueue_public',
    sequence_keys => ARRAY(SELECT DISTINCT sequence_key FROM expired WHERE sequence_key IS NOT NULL AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')))
 WHERE EXISTS (SELECT 1 FROM expired WHERE (dependents IS NOT NULL OR awaited OR sequence_key IS NOT NULL) AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted'))
   AND (SELECT count(*) FROM counted) >= 0)
SELECT id FROM expired WHERE (SELECT count(*) FROM settled) >= 0;

-- _drop_windows
DELETE FROM "public"."miniqueue_unique_windows"
 WHERE key = ANY(ARRAY(SELECT key FROM "public"."miniqueue_unique_windows" WHERE until < now() LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
   AND until < now();

-- _drop_idle_sequences
DELETE FROM "public"."miniqueue_sequences" s
 WHERE key = ANY(ARRAY(SELECT key FROM "public"."miniqueue_sequences"
                        WHERE head IS NULL AND updated_at < now() - interval '1 hour'
                        LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
   AND head IS NULL AND updated_at < now() - interval '1 hour';

-- _recount[0]
LOCK TABLE "public"."miniqueue_counts" IN EXCLUSIVE MODE;

-- _recount[1]
DELETE FROM "public"."miniqueue_counts";

-- _recount[2]
INSERT INTO "public"."miniqueue_counts" (queue, state, shard, count)
SELECT queue, state, 0, count(*) FROM "public"."miniqueue_jobs"
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state;

-- _trim_minutes
DELETE FROM "public"."miniqueue_finished_minutes" WHERE minute < now() - interval '2 hours';

-- _prune
WITH pruned AS (
    DELETE FROM "public"."miniqueue_jobs"
     WHERE id = ANY(ARRAY(
            SELECT id FROM "public"."miniqueue_jobs"
             WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired') AND state = ANY(%(states)s::text[])
               AND finished_at < now() - make_interval(secs => %(age)s)
             LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
    RETURNING queue, state
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, count)
SELECT queue, state, pg_backend_pid() %% 64, -count(*) FROM pruned
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard) DO UPDATE SET count = c.count + excluded.count
RETURNING 1)
SELECT count(*) FROM pruned;

-- _jobs_churn
SELECT pg_stat_get_live_tuples(c.oid) AS live, pg_stat_get_tuples_inserted(c.oid) AS inserted,
       pg_stat_get_tuples_updated(c.oid) AS updated, pg_stat_get_mod_since_analyze(c.oid) AS changed,
       greatest(pg_stat_get_last_vacuum_time(c.oid), pg_stat_get_last_autovacuum_time(c.oid)) AS last_vacuum,
       greatest(pg_stat_get_last_analyze_time(c.oid), pg_stat_get_last_autoanalyze_time(c.oid)) AS last_analyze,
       pg_has_role(c.relowner, 'USAGE') AS may_maintain
  FROM pg_class c
 WHERE c.oid = %(table)s::regclass;

-- _vacuum_jobs
VACUUM (SKIP_LOCKED, ANALYZE) "public"."miniqueue_jobs";

-- _analyze_jobs
ANALYZE (SKIP_LOCKED) "public"."miniqueue_jobs";

-- _requeue
WITH picked AS (
    SELECT id, queue, state FROM "public"."miniqueue_jobs"
     WHERE state = ANY(%(states)s::text[])
       AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
       AND (%(queue)s::text IS NULL OR queue = %(queue)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       FOR UPDATE
), requeued AS (
    UPDATE "public"."miniqueue_jobs" j
       SET state = CASE WHEN j.sequence_key IS NULL THEN 'available' ELSE 'waiting' END, scheduled_at = now(),
           max_attempts = j.attempt + j.attempt_budget,
           finished_at = NULL, completed_at = NULL, lease_expires_at = NULL, leased_by = NULL
      FROM picked p WHERE j.id = p.id
    RETURNING j.id, p.queue, p.state, j.sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, count)
SELECT queue, state, pg_backend_pid() %% 64, -count(*) FROM requeued
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard) DO UPDATE SET count = c.count + excluded.count
RETURNING 1), advanced AS (
SELECT "public"."miniqueue_sequence_advance"(ARRAY(SELECT DISTINCT sequence_key FROM requeued WHERE sequence_key IS NOT NULL), 'miniqueue_public')
 WHERE EXISTS (SELECT 1 FROM requeued WHERE sequence_key IS NOT NULL))
SELECT id FROM requeued WHERE (SELECT count(*) FROM advanced) >= 0;

-- _cancel
WITH cancelled AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'cancelled', finished_at = now(), lease_expires_at = NULL, leased_by = NULL, pending_parents = 0
 WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('available', 'running', 'waiting')
RETURNING id, queue, state, dependents, awaited, sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, count)
SELECT queue, state, pg_backend_pid() %% 64, count(*) FROM cancelled
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard) DO UPDATE SET count = c.count + excluded.count
RETURNING 1), per_minute AS (
INSERT INTO "public"."miniqueue_finished_minutes" AS m (minute, state, shard, count)
SELECT date_trunc('minute', now()), state, pg_backend_pid() %% 64, count(*) FROM cancelled
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY state
ON CONFLICT (minute, state, shard) DO UPDATE SET count = m.count + excluded.count
RETURNING 1), settled AS (
SELECT "public"."miniqueue_settle"(
    notify_ids => ARRAY(SELECT id FROM cancelled WHERE awaited AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')),
    released => ARRAY(SELECT d FROM cancelled, unnest(dependents) AS d WHERE state = 'completed'),
    cancel_children => ARRAY(SELECT d FROM cancelled, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_parents => ARRAY(SELECT id FROM cancelled, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_states => ARRAY(SELECT state FROM cancelled, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    channel => 'miniqueue_public_finished', queue_channel => 'miniqueue_public',
    sequence_keys => ARRAY(SELECT DISTINCT sequence_key FROM cancelled WHERE sequence_key IS NOT NULL AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')))
 WHERE EXISTS (SELECT 1 FROM cancelled WHERE (dependents IS NOT NULL OR awaited OR sequence_key IS NOT NULL) AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted'))
   AND (SELECT count(*) FROM counted) >= 0)
SELECT id FROM cancelled WHERE (SELECT count(*) FROM settled) >= 0;

-- _delete
WITH deleted AS (
    DELETE FROM "public"."miniqueue_jobs" WHERE id = ANY(%(ids)b::bigint[]) AND state <> 'running'
    RETURNING id, queue, state, dependents, awaited, sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, count)
SELECT queue, state, pg_backend_pid() %% 64, -count(*) FROM deleted
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard) DO UPDATE SET count = c.count + excluded.count
RETURNING 1), unfinished AS (
    SELECT id, 'deleted' AS state, CASE WHEN state IN ('available', 'waiting') THEN dependents END AS dependents,
           awaited AND state IN ('available', 'waiting') AS awaited, sequence_key
      FROM deleted WHERE state IN ('available', 'waiting') OR sequence_key IS NOT NULL
), settled AS (
SELECT "public"."miniqueue_settle"(
    notify_ids => ARRAY(SELECT id FROM unfinished WHERE awaited AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')),
    released => ARRAY(SELECT d FROM unfinished, unnest(dependents) AS d WHERE state = 'completed'),
    cancel_children => ARRAY(SELECT d FROM unfinished, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_parents => ARRAY(SELECT id FROM unfinished, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    cancel_states => ARRAY(SELECT state FROM unfinished, unnest(dependents) AS d WHERE state IN ('failed', 'dead', 'cancelled', 'expired', 'deleted') ORDER BY id, d),
    channel => 'miniqueue_public_finished', queue_channel => 'miniqueue_public',
    sequence_keys => ARRAY(SELECT DISTINCT sequence_key FROM unfinished WHERE sequence_key IS NOT NULL AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted')))
 WHERE EXISTS (SELECT 1 FROM unfinished WHERE (dependents IS NOT NULL OR awaited OR sequence_key IS NOT NULL) AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired', 'deleted'))
   AND (SELECT count(*) FROM counted) >= 0)
SELECT id FROM deleted WHERE (SELECT count(*) FROM settled) >= 0;

-- _states
SELECT id, state, attempt FROM "public"."miniqueue_jobs" WHERE id = ANY(%(ids)s::bigint[]);

-- _get
SELECT id, queue, task, payload, state, priority, attempt, max_attempts, idempotency_key, scheduled_at,
       created_at, lease_expires_at, leased_by, last_error, completed_at, finished_at, errors, result, parents,
       dependents, pending_parents, attempt_budget, unique_key, unique_while_running, sequence_key, expires_at
  FROM "public"."miniqueue_jobs" WHERE id = %(id)s;

-- _result
SELECT state, result, last_error FROM "public"."miniqueue_jobs" WHERE id = %(id)s;

-- _await
UPDATE "public"."miniqueue_jobs" SET awaited = true
 WHERE id = %(id)s AND NOT awaited AND state IN ('available', 'running', 'waiting')
RETURNING CASE WHEN state = 'available' AND scheduled_at <= now() THEN pg_notify('miniqueue_public', queue) END;

-- _list
SELECT id, queue, task, payload, state, priority, attempt, max_attempts, idempotency_key, scheduled_at,
       created_at, lease_expires_at, leased_by, last_error, completed_at, finished_at, errors, result, parents,
       dependents, pending_parents, attempt_budget, unique_key, unique_while_running, sequence_key, expires_at
  FROM "public"."miniqueue_jobs"
 WHERE (%(state)s::text IS NULL OR state = %(state)s)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task = %(task)s)
   AND (%(search)s::text IS NULL OR strpos(payload::text, %(search)s) > 0)
   AND (%(after)s::timestamptz IS NULL OR created_at >= %(after)s)
   AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s)
   AND (%(before)s::bigint IS NULL OR id < %(before)s)
 ORDER BY id DESC
 LIMIT %(limit)s;

-- _count_matching
SELECT count(*) FROM "public"."miniqueue_jobs" WHERE (%(state)s::text IS NULL OR state = %(state)s)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task = %(task)s)
   AND (%(search)s::text IS NULL OR strpos(payload::text, %(search)s) > 0)
   AND (%(after)s::timestamptz IS NULL OR created_at >= %(after)s)
   AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s);

-- _ids_matching
SELECT id FROM "public"."miniqueue_jobs" WHERE (%(state)s::text IS NULL OR state = %(state)s)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task = %(task)s)
   AND (%(search)s::text IS NULL OR strpos(payload::text, %(search)s) > 0)
   AND (%(after)s::timestamptz IS NULL OR created_at >= %(after)s)
   AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s) ORDER BY id LIMIT %(limit)s;

-- _queue_stats
WITH ready AS (
    SELECT queue, count(*) AS available, count(*) FILTER (WHERE scheduled_at > now()) AS scheduled,
           extract(epoch FROM now() - min(scheduled_at) FILTER (WHERE scheduled_at <= now()))
               AS oldest_available_seconds
      FROM (SELECT queue, scheduled_at FROM "public"."miniqueue_jobs" WHERE state = 'available' AND limits IS NULL
            UNION ALL
            SELECT queue, scheduled_at FROM "public"."miniqueue_jobs" WHERE state = 'available' AND limits IS NOT NULL) a
     GROUP BY queue
), blocked AS (
    SELECT queue, count(*) AS waiting FROM "public"."miniqueue_jobs" WHERE state = 'waiting' GROUP BY queue
), leased AS (
    SELECT queue, count(*) AS running, count(*) FILTER (WHERE lease_expires_at < now()) AS expired_leases
      FROM "public"."miniqueue_jobs" WHERE state = 'running' AND lease_expires_at IS NOT NULL GROUP BY queue
), finished AS (
    SELECT queue,
           greatest(0, coalesce(sum(count) FILTER (WHERE state = 'completed'), 0)) AS completed,
           greatest(0, coalesce(sum(count) FILTER (WHERE state = 'failed'), 0)) AS failed,
           greatest(0, coalesce(sum(count) FILTER (WHERE state = 'dead'), 0)) AS dead,
           greatest(0, coalesce(sum(count) FILTER (WHERE state = 'cancelled'), 0)) AS cancelled,
           greatest(0, coalesce(sum(count) FILTER (WHERE state = 'expired'), 0)) AS expired
      FROM "public"."miniqueue_counts" GROUP BY queue
)
SELECT queue, coalesce(available, 0) AS available, coalesce(running, 0) AS running,
       coalesce(completed, 0) AS completed, coalesce(failed, 0) AS failed, coalesce(dead, 0) AS dead,
       coalesce(cancelled, 0) AS cancelled, coalesce(waiting, 0) AS waiting, coalesce(expired, 0) AS expired,
       coalesce(scheduled, 0) AS scheduled, oldest_available_seconds, coalesce(expired_leases, 0) AS expired_leases
  FROM ready FULL JOIN blocked USING (queue) FULL JOIN leased USING (queue) FULL JOIN finished USING (queue)
 WHERE coalesce(available, 0) + coalesce(running, 0) + coalesce(completed, 0) + coalesce(failed, 0)
       + coalesce(dead, 0) + coalesce(cancelled, 0) + coalesce(waiting, 0) + coalesce(expired, 0) > 0
 ORDER BY queue;

-- _parent_results
SELECT p.id, p.result FROM unnest(%(ids)s::bigint[]) WITH ORDINALITY AS u(id, ord) JOIN "public"."miniqueue_jobs" p ON p.id = u.id
 ORDER BY u.ord;

-- _limit_waits
WITH waiting AS (
    SELECT s.scope, count(*) AS waiting
      FROM "public"."miniqueue_jobs" j CROSS JOIN LATERAL unnest(j.limits) AS s(scope)
     WHERE j.state = 'available' AND j.limits IS NOT NULL AND j.scheduled_at <= now()
     GROUP BY s.scope
    UNION ALL
    SELECT 'queue ' || q.name,
           (SELECT count(*) FROM "public"."miniqueue_jobs" j
             WHERE j.state = 'available' AND j.limits IS NULL AND j.queue = q.name AND j.scheduled_at <= now())
           + (SELECT count(*) FROM "public"."miniqueue_jobs" j
               WHERE j.state = 'available' AND j.limits IS NOT NULL AND j.queue = q.name AND j.scheduled_at <= now())
      FROM "public"."miniqueue_queues" q WHERE q.max_running IS NOT NULL
    UNION ALL
    SELECT DISTINCT s.scope, 0
      FROM "public"."miniqueue_jobs" j CROSS JOIN LATERAL unnest(j.limits) AS s(scope)
     WHERE j.state = 'running' AND j.lease_expires_at IS NOT NULL AND j.limits IS NOT NULL
), scopes AS (
    SELECT scope, sum(waiting)::bigint AS waiting FROM waiting GROUP BY scope
)
SELECT w.scope, w.waiting, l.max_running, l.rate, cardinality(h.holders) AS held,
       least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) AS tokens,
       h.holders
  FROM scopes w LEFT JOIN "public"."miniqueue_limits" l USING (scope)
 CROSS JOIN LATERAL (
       SELECT ARRAY(SELECT h.id FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                      JOIN "public"."miniqueue_jobs" j ON j.id = h.id AND j.state = 'running' AND j.attempt = h.attempt
                     ORDER BY h.id) AS holders) h
 WHERE w.waiting > 0 OR cardinality(h.holders) > 0
 ORDER BY w.waiting DESC, cardinality(h.holders) DESC, w.scope
 LIMIT %(limit)s;

-- _throughput
SELECT minute, state, sum(count)::bigint FROM "public"."miniqueue_finished_minutes"
 WHERE minute > now() - interval '1 hour'
 GROUP BY 1, 2 ORDER BY 1, 2;

-- _periodic_state
SELECT name, last_slot, enabled FROM "public"."miniqueue_periodic";

-- _claim_slot
INSERT INTO "public"."miniqueue_periodic" (name, last_slot) VALUES (%(name)s, %(slot)s)
ON CONFLICT (name) DO UPDATE SET last_slot = excluded.last_slot, updated_at = now()
 WHERE "public"."miniqueue_periodic".last_slot < excluded.last_slot AND "public"."miniqueue_periodic".enabled
RETURNING name;

-- _set_periodic_enabled
INSERT INTO "public"."miniqueue_periodic" (name, last_slot, enabled) VALUES (%(name)s, now(), %(enabled)s)
ON CONFLICT (name) DO UPDATE SET enabled = excluded.enabled, updated_at = now()
RETURNING xmax = 0;

-- _publish_tasks
INSERT INTO "public"."miniqueue_tasks" AS t (task, queue, priority, max_attempts, concurrency_key, concurrency_key_computed,
                          max_concurrent, rate_limit, rate_limit_key, rate_limit_key_computed, backoff_base,
                          backoff_cap, keys)
SELECT task, queue, priority, max_attempts, concurrency_key, concurrency_computed, max_concurrent, rate_limit,
       rate_limit_key, rate_computed, backoff_base, backoff_cap, keys::jsonb
  FROM unnest(%(tasks)s::text[], %(queues)s::text[], %(priorities)s::smallint[], %(max_attempts)s::int[],
              %(concurrency_keys)s::text[], %(concurrency_computed)s::boolean[], %(max_concurrent)s::int[],
              %(rate_limits)s::text[], %(rate_limit_keys)s::text[], %(rate_computed)s::boolean[],
              %(backoff_bases)s::float8[], %(backoff_caps)s::float8[], %(keys)s::text[])
       AS d(task, queue, priority, max_attempts, concurrency_key, concurrency_computed, max_concurrent, rate_limit,
            rate_limit_key, rate_computed, backoff_base, backoff_cap, keys)
 ORDER BY 1
ON CONFLICT (task) DO UPDATE
   SET queue = excluded.queue, priority = excluded.priority, max_attempts = excluded.max_attempts,
       concurrency_key = excluded.concurrency_key, concurrency_key_computed = excluded.concurrency_key_computed,
       max_concurrent = excluded.max_concurrent, rate_limit = excluded.rate_limit,
       rate_limit_key = excluded.rate_limit_key, rate_limit_key_computed = excluded.rate_limit_key_computed,
       backoff_base = excluded.backoff_base, backoff_cap = excluded.backoff_cap, keys = excluded.keys,
       published_at = now()
 WHERE (t.queue, t.priority, t.max_attempts, t.concurrency_key, t.concurrency_key_computed, t.max_concurrent,
        t.rate_limit, t.rate_limit_key, t.rate_limit_key_computed, t.backoff_base, t.backoff_cap, t.keys)
       IS DISTINCT FROM
       (excluded.queue, excluded.priority, excluded.max_attempts, excluded.concurrency_key,
        excluded.concurrency_key_computed, excluded.max_concurrent, excluded.rate_limit, excluded.rate_limit_key,
        excluded.rate_limit_key_computed, excluded.backoff_base, excluded.backoff_cap, excluded.keys);

-- _serve_queues
INSERT INTO "public"."miniqueue_served_queues" (queue) SELECT q FROM unnest(%(queues)s::text[]) AS q ORDER BY q
ON CONFLICT (queue) DO UPDATE SET served_at = now();

-- _task_declarations
SELECT task, queue, priority, max_attempts, concurrency_key, concurrency_key_computed, max_concurrent, rate_limit,
       rate_limit_key, rate_limit_key_computed, backoff_base, backoff_cap, keys
  FROM "public"."miniqueue_tasks";

-- _unserved_queues
SELECT q FROM unnest(%(queues)s::text[]) AS q WHERE NOT EXISTS (SELECT 1 FROM "public"."miniqueue_served_queues" s WHERE s.queue = q);

-- _set_paused
INSERT INTO "public"."miniqueue_queues" (name, paused) VALUES (%(name)s, %(paused)s)
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = now();

-- _paused
SELECT name FROM "public"."miniqueue_queues" WHERE paused ORDER BY name;

-- _set_queue_limit
WITH capped AS (
    INSERT INTO "public"."miniqueue_queues" (name, max_running) VALUES (%(name)s, %(max)s::int)
    ON CONFLICT (name) DO UPDATE SET max_running = excluded.max_running, updated_at = now()
)
INSERT INTO "public"."miniqueue_limits" (scope, max_running) SELECT %(scope)s, %(max)s::int WHERE %(max)s::int IS NOT NULL
ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running;

-- _queue_limits
SELECT name, max_running FROM "public"."miniqueue_queues" WHERE max_running IS NOT NULL ORDER BY name;

-- _known_queues
SELECT q.name FROM unnest(%(names)s::text[]) AS q(name)
 WHERE EXISTS (SELECT 1 FROM "public"."miniqueue_queues" WHERE name = q.name)
    OR EXISTS (SELECT 1 FROM "public"."miniqueue_served_queues" WHERE queue = q.name)
    OR EXISTS (SELECT 1 FROM "public"."miniqueue_counts" WHERE queue = q.name AND count > 0)
    OR EXISTS (SELECT 1 FROM "public"."miniqueue_jobs" WHERE state = 'available' AND limits IS NULL AND queue = q.name)
    OR EXISTS (SELECT 1 FROM "public"."miniqueue_jobs" WHERE state = 'available' AND limits IS NOT NULL AND queue = q.name)
    OR EXISTS (SELECT 1 FROM "public"."miniqueue_jobs" WHERE state = 'running' AND lease_expires_at IS NOT NULL AND queue = q.name);

-- _known_queue_names
WITH RECURSIVE waiting(queue) AS (
    (SELECT queue FROM "public"."miniqueue_jobs" WHERE state = 'available' AND limits IS NULL ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM "public"."miniqueue_jobs" j WHERE j.state = 'available' AND j.limits IS NULL AND j.queue > w.queue
             ORDER BY j.queue LIMIT 1)
      FROM waiting w WHERE w.queue IS NOT NULL
), limited(queue) AS (
    (SELECT queue FROM "public"."miniqueue_jobs" WHERE state = 'available' AND limits IS NOT NULL ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM "public"."miniqueue_jobs" j WHERE j.state = 'available' AND j.limits IS NOT NULL AND j.queue > w.queue
             ORDER BY j.queue LIMIT 1)
      FROM limited w WHERE w.queue IS NOT NULL
)
SELECT queue FROM waiting WHERE queue IS NOT NULL
 UNION SELECT queue FROM limited WHERE queue IS NOT NULL
 UNION SELECT queue FROM "public"."miniqueue_jobs" WHERE state = 'running' AND lease_expires_at IS NOT NULL
 UNION SELECT name FROM "public"."miniqueue_queues"
 UNION SELECT queue FROM "public"."miniqueue_served_queues"
 UNION SELECT queue FROM "public"."miniqueue_counts" WHERE count > 0
 ORDER BY 1 LIMIT %(limit)s;

-- _upsert_processes
WITH incoming AS (
    SELECT * FROM unnest(%(ids)s::text[], %(kinds)s::text[], %(pids)s::int[], %(titles)s::text[],
                         %(started)s::timestamptz[], %(rss)s::bigint[], %(done)s::bigint[], %(restarts)s::int[],
                         %(current)s::text[])
           AS i(id, kind, pid, title, started_at, rss_bytes, jobs_done, restarts, current_jobs)
), gone AS (
    DELETE FROM "public"."miniqueue_processes" WHERE supervisor = %(supervisor)s AND id <> ALL(%(ids)s::text[])
)
INSERT INTO "public"."miniqueue_processes" AS p (id, supervisor, kind, host, pid, title, started_at, last_seen, rss_bytes, jobs_done,
                              restarts, current_jobs)
SELECT id, %(supervisor)s, kind, %(host)s, pid, title, started_at, now(), rss_bytes, jobs_done, restarts,
       current_jobs::bigint[]
  FROM incoming
ON CONFLICT (id) DO UPDATE SET title = excluded.title, last_seen = now(), rss_bytes = excluded.rss_bytes,
    jobs_done = excluded.jobs_done, restarts = excluded.restarts, current_jobs = excluded.current_jobs;

-- _delete_processes
DELETE FROM "public"."miniqueue_processes" WHERE supervisor = %(supervisor)s;

-- _processes
SELECT id, supervisor, kind, host, pid, title, started_at, last_seen, rss_bytes, jobs_done, restarts, current_jobs
  FROM "public"."miniqueue_processes"
 WHERE last_seen > now() - make_interval(secs => %(max_age)s)
 ORDER BY host, supervisor, kind <> 'supervisor', kind, pid;

-- _schema_version
SELECT coalesce(max(version), 0) FROM "public"."miniqueue_migrations";

-- _workers_from
SELECT coalesce(max(workers_from), 0) FROM "public"."miniqueue_migrations";

-- _versions_table
"public"."miniqueue_migrations";

-- _migration_ddl[0]
CREATE SCHEMA IF NOT EXISTS "public";

-- _migration_ddl[1]
CREATE TABLE IF NOT EXISTS "public"."miniqueue_migrations" (
    version INT PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now());

-- _migration_ddl[2]
ALTER TABLE "public"."miniqueue_migrations" ADD COLUMN IF NOT EXISTS workers_from INT;

-- _applied_versions
SELECT version FROM "public"."miniqueue_migrations";

-- _pin_search_path
SET LOCAL search_path TO "public", pg_catalog;

-- _pin_session_search_path
SET search_path TO "public", pg_catalog;

-- _record_version
INSERT INTO "public"."miniqueue_migrations" (version, name, workers_from) VALUES (%(version)s, %(name)s, %(workers_from)s);

-- _horizon
SELECT kind, pid, name, state, since, extract(epoch FROM now() - since)::float8 AS seconds, age, query FROM (
    SELECT 'transaction' AS kind, pid, nullif(application_name, '') AS name, state,
           coalesce(xact_start, query_start) AS since, greatest(age(backend_xmin), age(backend_xid)) AS age,
           left(query, 200) AS query
      FROM pg_stat_activity
     WHERE (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL) AND pid <> pg_backend_pid()
       AND backend_type = 'client backend' AND datname = current_database()
    UNION ALL
    SELECT 'prepared transaction', NULL, gid, NULL, prepared, age(transaction), NULL
      FROM pg_prepared_xacts WHERE database = current_database()
    UNION ALL
    SELECT 'replication slot', active_pid, slot_name, CASE WHEN active THEN 'active' ELSE 'inactive' END, NULL,
           age(xmin), NULL
      FROM pg_replication_slots WHERE xmin IS NOT NULL
    UNION ALL
    SELECT 'standby feedback', pid, nullif(application_name, ''), state, backend_start, age(backend_xmin), NULL
      FROM pg_stat_replication WHERE backend_xmin IS NOT NULL
) holders
 ORDER BY age DESC NULLS LAST, since NULLS LAST
 LIMIT %(limit)s;

-- _table_health
SELECT pg_stat_get_live_tuples(c.oid) AS live_rows, pg_stat_get_dead_tuples(c.oid) AS dead_rows,
       pg_table_size(c.oid) AS table_bytes, pg_indexes_size(c.oid) AS index_bytes,
       pg_relation_size(to_regclass(%(claim_index)s)) AS claim_index_bytes,
       greatest(pg_stat_get_last_vacuum_time(c.oid), pg_stat_get_last_autovacuum_time(c.oid)) AS last_vacuum,
       current_setting('autovacuum')::boolean AS autovacuum,
       coalesce((SELECT split_part(o, '=', 2) FROM unnest(c.reloptions) AS o
                  WHERE o LIKE 'autovacuum_vacuum_scale_factor=%%'),
                current_setting('autovacuum_vacuum_scale_factor')) AS vacuum_scale_factor,
       coalesce((SELECT split_part(o, '=', 2) FROM unnest(c.reloptions) AS o
                  WHERE o LIKE 'autovacuum_vacuum_threshold=%%'),
                current_setting('autovacuum_vacuum_threshold')) AS vacuum_threshold,
       extract(epoch FROM now())::float8 AS database_clock
  FROM pg_class c
 WHERE c.oid = %(table)s::regclass;

-- _release_sequence
WITH blocked AS (
    SELECT s.head FROM "public"."miniqueue_sequences" s JOIN "public"."miniqueue_jobs" h ON h.id = s.head
     WHERE s.key = %(key)s AND h.state IN ('failed', 'dead')
       FOR UPDATE OF s
), released AS (
    SELECT "public"."miniqueue_sequence_advance"(ARRAY[%(key)s::text], 'miniqueue_public', force => true) WHERE EXISTS (SELECT 1 FROM blocked)
)
SELECT head FROM blocked WHERE (SELECT count(*) FROM released) >= 0;

-- _blocked_sequences
SELECT s.key, s.head, h.state, h.task, h.last_error,
       (SELECT count(*) FROM "public"."miniqueue_jobs" w WHERE w.sequence_key = s.key AND w.state = 'waiting') AS waiting
  FROM "public"."miniqueue_sequences" s JOIN "public"."miniqueue_jobs" h ON h.id = s.head
 WHERE h.state IN ('failed', 'dead') AND s.on_failure = 'block'
 ORDER BY s.key LIMIT %(limit)s;

-- _sequence
SELECT s.head, h.state, s.on_failure,
       (SELECT count(*) FROM "public"."miniqueue_jobs" w WHERE w.sequence_key = s.key AND w.state = 'waiting') AS waiting
  FROM "public"."miniqueue_sequences" s LEFT JOIN "public"."miniqueue_jobs" h ON h.id = s.head
 WHERE s.key = %(key)s;
