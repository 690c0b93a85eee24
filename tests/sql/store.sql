-- _enqueue
WITH held AS (
    INSERT INTO "public"."miniqueue_idempotency_keys" (key, job_id)
    SELECT %(key)s, nextval('"public"."miniqueue_jobs_id_seq"') WHERE %(key)s::text IS NOT NULL
    ON CONFLICT (key) DO NOTHING
    RETURNING job_id
), ins AS (
    INSERT INTO "public"."miniqueue_jobs_live" (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context)
    SELECT coalesce((SELECT job_id FROM held), nextval('"public"."miniqueue_jobs_id_seq"')),
           %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
           COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)), %(key)s,
           %(limits)s::text[], %(trace)s::jsonb
     WHERE %(key)s::text IS NULL OR EXISTS (SELECT 1 FROM held)
    RETURNING id, queue, scheduled_at
)
SELECT id, false,
       CASE WHEN %(notify)s AND scheduled_at <= now() THEN pg_notify(%(channel)s, queue) END
  FROM ins
UNION ALL
SELECT job_id, true, NULL FROM "public"."miniqueue_idempotency_keys"
 WHERE key = %(key)s AND NOT EXISTS (SELECT 1 FROM ins);

-- _enqueue_limited
WITH scoped AS (
    INSERT INTO "public"."miniqueue_limits" AS l (scope, max_running, rate, burst, tokens, paused_until, paused_by)
    SELECT s.scope, s.max_running, s.rate, s.burst, CASE WHEN s.rate IS NULL THEN 0 ELSE 1 END,
           p.paused_until, p.paused_by
      FROM unnest(%(scopes)s::text[], %(maxes)s::int[], %(rates)s::float8[], %(bursts)s::float8[])
           AS s(scope, max_running, rate, burst)
      LEFT JOIN "public"."miniqueue_pauses" p ON p.key = substring(s.scope FROM '^(?:concurrency|rate) [^ ]+ (.*)$')
    ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst
     WHERE (l.max_running, l.rate, l.burst) IS DISTINCT FROM (excluded.max_running, excluded.rate, excluded.burst)
), held AS (
    INSERT INTO "public"."miniqueue_idempotency_keys" (key, job_id)
    SELECT %(key)s, nextval('"public"."miniqueue_jobs_id_seq"') WHERE %(key)s::text IS NOT NULL
    ON CONFLICT (key) DO NOTHING
    RETURNING job_id
), ins AS (
    INSERT INTO "public"."miniqueue_jobs_live" (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context, rate_cost)
    SELECT coalesce((SELECT job_id FROM held), nextval('"public"."miniqueue_jobs_id_seq"')),
           %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
           COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)), %(key)s,
           %(limits)s::text[], %(trace)s::jsonb, %(rate_cost)s
     WHERE %(key)s::text IS NULL OR EXISTS (SELECT 1 FROM held)
    RETURNING id, queue, scheduled_at
)
SELECT id, false,
       CASE WHEN %(notify)s AND scheduled_at <= now() THEN pg_notify(%(channel)s, queue) END
  FROM ins
UNION ALL
SELECT job_id, true, NULL FROM "public"."miniqueue_idempotency_keys"
 WHERE key = %(key)s AND NOT EXISTS (SELECT 1 FROM ins);

-- _enqueue_waiting
WITH held AS (
    INSERT INTO "public"."miniqueue_idempotency_keys" (key, job_id)
    SELECT %(key)s, nextval('"public"."miniqueue_jobs_id_seq"') WHERE %(key)s::text IS NOT NULL
    ON CONFLICT (key) DO NOTHING
    RETURNING job_id
), ins AS (
    INSERT INTO "public"."miniqueue_jobs_live" (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context, state, parents, pending_parents, expires_at,
                        run_when, failed_parents)
    SELECT coalesce((SELECT job_id FROM held), nextval('"public"."miniqueue_jobs_id_seq"')),
           %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
           COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)), %(key)s,
           %(limits)s::text[], %(trace)s::jsonb,
           CASE WHEN %(pending)s > 0 THEN 'waiting' ELSE 'available' END, %(parents)s::bigint[], %(pending)s,
           COALESCE(%(expires_at)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8)),
           %(run_when)s, %(failed)s
     WHERE %(key)s::text IS NULL OR EXISTS (SELECT 1 FROM held)
    RETURNING id, queue, scheduled_at
)
SELECT id, false,
       CASE WHEN %(notify)s AND scheduled_at <= now() THEN pg_notify(%(channel)s, queue) END
  FROM ins
UNION ALL
SELECT job_id, true, NULL FROM "public"."miniqueue_idempotency_keys"
 WHERE key = %(key)s AND NOT EXISTS (SELECT 1 FROM ins);

-- _enqueue_waiting_limited
WITH scoped AS (
    INSERT INTO "public"."miniqueue_limits" AS l (scope, max_running, rate, burst, tokens, paused_until, paused_by)
    SELECT s.scope, s.max_running, s.rate, s.burst, CASE WHEN s.rate IS NULL THEN 0 ELSE 1 END,
           p.paused_until, p.paused_by
      FROM unnest(%(scopes)s::text[], %(maxes)s::int[], %(rates)s::float8[], %(bursts)s::float8[])
           AS s(scope, max_running, rate, burst)
      LEFT JOIN "public"."miniqueue_pauses" p ON p.key = substring(s.scope FROM '^(?:concurrency|rate) [^ ]+ (.*)$')
    ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst
     WHERE (l.max_running, l.rate, l.burst) IS DISTINCT FROM (excluded.max_running, excluded.rate, excluded.burst)
), held AS (
    INSERT INTO "public"."miniqueue_idempotency_keys" (key, job_id)
    SELECT %(key)s, nextval('"public"."miniqueue_jobs_id_seq"') WHERE %(key)s::text IS NOT NULL
    ON CONFLICT (key) DO NOTHING
    RETURNING job_id
), ins AS (
    INSERT INTO "public"."miniqueue_jobs_live" (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context, state, parents, pending_parents, expires_at,
                        run_when, failed_parents, rate_cost)
    SELECT coalesce((SELECT job_id FROM held), nextval('"public"."miniqueue_jobs_id_seq"')),
           %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
           COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)), %(key)s,
           %(limits)s::text[], %(trace)s::jsonb,
           CASE WHEN %(pending)s > 0 THEN 'waiting' ELSE 'available' END, %(parents)s::bigint[], %(pending)s,
           COALESCE(%(expires_at)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8)),
           %(run_when)s, %(failed)s, %(rate_cost)s
     WHERE %(key)s::text IS NULL OR EXISTS (SELECT 1 FROM held)
    RETURNING id, queue, scheduled_at
)
SELECT id, false,
       CASE WHEN %(notify)s AND scheduled_at <= now() THEN pg_notify(%(channel)s, queue) END
  FROM ins
UNION ALL
SELECT job_id, true, NULL FROM "public"."miniqueue_idempotency_keys"
 WHERE key = %(key)s AND NOT EXISTS (SELECT 1 FROM ins);

-- _lock_parents
SELECT id, state FROM "public"."miniqueue_jobs" WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id FOR NO KEY UPDATE;

-- _link_dependent
UPDATE "public"."miniqueue_jobs" SET dependents = array_append(dependents, %(child)s::bigint) WHERE id = ANY(%(parents)s::bigint[]);

-- _by_key
SELECT job_id FROM "public"."miniqueue_idempotency_keys" WHERE key = %(key)s;

-- _enqueue_many
WITH src AS MATERIALIZED (
    SELECT nextval('"public"."miniqueue_jobs_id_seq"') AS id, u.*
      FROM unnest(%(queues)b::text[], %(tasks)b::text[], %(payloads)b::text[], %(priorities)b::int[],
                  %(max_attempts)b::int[], %(run_ats)b::timestamptz[], %(delays)b::float8[], %(keys)b::text[],
                  %(limits)b::text[], %(rate_costs)b::int[])
           WITH ORDINALITY AS u(queue, task, payload, priority, max_attempts, run_at, delay, key, limits, rate_cost,
                                ord)
), held AS (
    INSERT INTO "public"."miniqueue_idempotency_keys" (key, job_id)
    SELECT key, id FROM src WHERE key IS NOT NULL ORDER BY ord
    ON CONFLICT (key) DO NOTHING
    RETURNING key, job_id
), ins AS (
    INSERT INTO "public"."miniqueue_jobs_live" (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context, rate_cost)
    SELECT id, queue, task, payload::jsonb, priority, max_attempts, max_attempts,
           COALESCE(run_at, now() + make_interval(secs => COALESCE(delay, 0))), key, string_to_array(limits, chr(31)),
           %(trace)s::jsonb, COALESCE(rate_cost, 1)
      FROM src WHERE key IS NULL OR id IN (SELECT job_id FROM held) ORDER BY ord
    RETURNING id, queue, scheduled_at
), notified AS (
    SELECT pg_notify(%(channel)s, queue)
      FROM (SELECT DISTINCT queue FROM ins WHERE scheduled_at <= now()) q
     WHERE %(notify)s
)
SELECT s.ord, COALESCE(i.id, h.job_id, e.job_id), i.id IS NULL
  FROM src s
  LEFT JOIN ins i ON i.id = s.id
  LEFT JOIN held h ON i.id IS NULL AND h.key = s.key
  LEFT JOIN "public"."miniqueue_idempotency_keys" e ON i.id IS NULL AND h.key IS NULL AND e.key = s.key
 WHERE (SELECT count(*) FROM notified) >= 0
 ORDER BY s.ord;

-- _enqueue_many_limited
WITH scoped AS (
    INSERT INTO "public"."miniqueue_limits" AS l (scope, max_running, rate, burst, tokens, paused_until, paused_by)
    SELECT s.scope, s.max_running, s.rate, s.burst, CASE WHEN s.rate IS NULL THEN 0 ELSE 1 END,
           p.paused_until, p.paused_by
      FROM unnest(%(scopes)s::text[], %(maxes)s::int[], %(rates)s::float8[], %(bursts)s::float8[])
           AS s(scope, max_running, rate, burst)
      LEFT JOIN "public"."miniqueue_pauses" p ON p.key = substring(s.scope FROM '^(?:concurrency|rate) [^ ]+ (.*)$')
    ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst
     WHERE (l.max_running, l.rate, l.burst) IS DISTINCT FROM (excluded.max_running, excluded.rate, excluded.burst)
),
src AS MATERIALIZED (
    SELECT nextval('"public"."miniqueue_jobs_id_seq"') AS id, u.*
      FROM unnest(%(queues)b::text[], %(tasks)b::text[], %(payloads)b::text[], %(priorities)b::int[],
                  %(max_attempts)b::int[], %(run_ats)b::timestamptz[], %(delays)b::float8[], %(keys)b::text[],
                  %(limits)b::text[], %(rate_costs)b::int[])
           WITH ORDINALITY AS u(queue, task, payload, priority, max_attempts, run_at, delay, key, limits, rate_cost,
                                ord)
), held AS (
    INSERT INTO "public"."miniqueue_idempotency_keys" (key, job_id)
    SELECT key, id FROM src WHERE key IS NOT NULL ORDER BY ord
    ON CONFLICT (key) DO NOTHING
    RETURNING key, job_id
), ins AS (
    INSERT INTO "public"."miniqueue_jobs_live" (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context, rate_cost)
    SELECT id, queue, task, payload::jsonb, priority, max_attempts, max_attempts,
           COALESCE(run_at, now() + make_interval(secs => COALESCE(delay, 0))), key, string_to_array(limits, chr(31)),
           %(trace)s::jsonb, COALESCE(rate_cost, 1)
      FROM src WHERE key IS NULL OR id IN (SELECT job_id FROM held) ORDER BY ord
    RETURNING id, queue, scheduled_at
), notified AS (
    SELECT pg_notify(%(channel)s, queue)
      FROM (SELECT DISTINCT queue FROM ins WHERE scheduled_at <= now()) q
     WHERE %(notify)s
)
SELECT s.ord, COALESCE(i.id, h.job_id, e.job_id), i.id IS NULL
  FROM src s
  LEFT JOIN ins i ON i.id = s.id
  LEFT JOIN held h ON i.id IS NULL AND h.key = s.key
  LEFT JOIN "public"."miniqueue_idempotency_keys" e ON i.id IS NULL AND h.key IS NULL AND e.key = s.key
 WHERE (SELECT count(*) FROM notified) >= 0
 ORDER BY s.ord;

-- _enqueue_keyed
WITH scoped AS (
    INSERT INTO "public"."miniqueue_limits" AS l (scope, max_running, rate, burst, tokens, paused_until, paused_by)
    SELECT s.scope, s.max_running, s.rate, s.burst, CASE WHEN s.rate IS NULL THEN 0 ELSE 1 END,
           p.paused_until, p.paused_by
      FROM unnest(%(scopes)s::text[], %(maxes)s::int[], %(rates)s::float8[], %(bursts)s::float8[])
           AS s(scope, max_running, rate, burst)
      LEFT JOIN "public"."miniqueue_pauses" p ON p.key = substring(s.scope FROM '^(?:concurrency|rate) [^ ]+ (.*)$')
    ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst
     WHERE (l.max_running, l.rate, l.burst) IS DISTINCT FROM (excluded.max_running, excluded.rate, excluded.burst)
), sequenced AS (
    INSERT INTO "public"."miniqueue_sequences" AS s (key, on_failure)
    SELECT %(sequence)s, %(on_failure)s WHERE %(sequence)s::text IS NOT NULL
    ON CONFLICT (key) DO UPDATE SET on_failure = excluded.on_failure, updated_at = now()
    RETURNING key
), held AS (
    INSERT INTO "public"."miniqueue_idempotency_keys" (key, job_id)
    SELECT %(key)s, nextval('"public"."miniqueue_jobs_id_seq"') WHERE %(key)s::text IS NOT NULL
    ON CONFLICT (key) DO NOTHING
    RETURNING job_id
), ins AS (
    INSERT INTO "public"."miniqueue_jobs_live" (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context, expires_at, unique_key, unique_while_running,
                        sequence_key, state, rate_cost)
    SELECT coalesce((SELECT job_id FROM held), nextval('"public"."miniqueue_jobs_id_seq"')), %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
           COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)), %(key)s,
           %(limits)s::text[], %(trace)s::jsonb,
           COALESCE(%(expires_at)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8)),
           %(unique)s, %(while_running)s, (SELECT key FROM sequenced),
           CASE WHEN EXISTS (SELECT 1 FROM sequenced) THEN 'waiting' ELSE 'available' END, %(rate_cost)s
     WHERE %(key)s::text IS NULL OR EXISTS (SELECT 1 FROM held)
    ON CONFLICT DO NOTHING
    RETURNING id, queue, scheduled_at, state
), advanced AS (
    SELECT "public"."miniqueue_sequence_advance"(ARRAY[%(sequence)s::text], %(channel)s) WHERE EXISTS (SELECT 1 FROM ins WHERE state = 'waiting')
)
SELECT id, false, CASE WHEN %(notify)s AND state = 'available' AND scheduled_at <= now() THEN pg_notify(%(channel)s, queue) END,
       NULL::bigint
  FROM ins WHERE (SELECT count(*) FROM advanced) >= 0
UNION ALL
(SELECT holder, true, NULL, (SELECT job_id FROM held)
   FROM (SELECT job_id AS holder FROM "public"."miniqueue_idempotency_keys" WHERE key = %(key)s
         UNION ALL
         SELECT id FROM "public"."miniqueue_jobs_live" WHERE unique_key = %(unique)s AND unique_key IS NOT NULL
      AND (state IN ('waiting', 'available') AND (attempt = 0 OR unique_while_running)
           OR state = 'running' AND unique_while_running)) h
  WHERE NOT EXISTS (SELECT 1 FROM ins)
  LIMIT 1);

-- _enqueue_replacing
WITH scoped AS (
    INSERT INTO "public"."miniqueue_limits" AS l (scope, max_running, rate, burst, tokens, paused_until, paused_by)
    SELECT s.scope, s.max_running, s.rate, s.burst, CASE WHEN s.rate IS NULL THEN 0 ELSE 1 END,
           p.paused_until, p.paused_by
      FROM unnest(%(scopes)s::text[], %(maxes)s::int[], %(rates)s::float8[], %(bursts)s::float8[])
           AS s(scope, max_running, rate, burst)
      LEFT JOIN "public"."miniqueue_pauses" p ON p.key = substring(s.scope FROM '^(?:concurrency|rate) [^ ]+ (.*)$')
    ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst
     WHERE (l.max_running, l.rate, l.burst) IS DISTINCT FROM (excluded.max_running, excluded.rate, excluded.burst)
), sequenced AS (
    INSERT INTO "public"."miniqueue_sequences" AS s (key, on_failure)
    SELECT %(sequence)s, %(on_failure)s WHERE %(sequence)s::text IS NOT NULL
    ON CONFLICT (key) DO UPDATE SET on_failure = excluded.on_failure, updated_at = now()
    RETURNING key
), new AS MATERIALIZED (
    SELECT nextval('"public"."miniqueue_jobs_id_seq"') AS id
), ins AS (
    INSERT INTO "public"."miniqueue_jobs_live" AS j (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                             limits, trace_context, expires_at, unique_key, unique_while_running, sequence_key, state,
                             rate_cost)
    SELECT new.id, %(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
           CASE WHEN %(wait)s::float8 IS NOT NULL THEN now() + make_interval(secs => %(wait)s::float8)
                ELSE COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)) END,
           %(limits)s::text[], %(trace)s::jsonb,
           COALESCE(%(expires_at)s::timestamptz, now() + make_interval(secs => %(expires_in)s::float8)),
           %(unique)s, %(while_running)s, (SELECT key FROM sequenced),
           CASE WHEN EXISTS (SELECT 1 FROM sequenced) THEN 'waiting' ELSE 'available' END, %(rate_cost)s
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
(SELECT id, true, false, NULL FROM "public"."miniqueue_jobs_live" WHERE NOT EXISTS (SELECT 1 FROM ins) AND unique_key = %(unique)s AND unique_key IS NOT NULL
      AND (state IN ('waiting', 'available') AND (attempt = 0 OR unique_while_running)
           OR state = 'running' AND unique_while_running)
  LIMIT 1);

-- _holder
SELECT job_id FROM "public"."miniqueue_idempotency_keys" WHERE key = %(key)s
UNION ALL
SELECT id FROM "public"."miniqueue_jobs_live" WHERE unique_key = %(unique)s AND unique_key IS NOT NULL
      AND (state IN ('waiting', 'available') AND (attempt = 0 OR unique_while_running)
           OR state = 'running' AND unique_while_running)
 LIMIT 1;

-- _drop_key
DELETE FROM "public"."miniqueue_idempotency_keys" WHERE key = %(key)s AND job_id = %(id)s;

-- _lock_window
INSERT INTO "public"."miniqueue_unique_windows" AS w (key, job_id, until) VALUES (%(unique)s, 0, '-infinity')
ON CONFLICT (key) DO UPDATE SET key = excluded.key
RETURNING job_id, until > now();

-- _open_window
UPDATE "public"."miniqueue_unique_windows" SET job_id = %(id)s, until = now() + make_interval(secs => %(window)s) WHERE key = %(unique)s;

-- _enqueue_many_keyed
WITH scoped AS (
    INSERT INTO "public"."miniqueue_limits" AS l (scope, max_running, rate, burst, tokens, paused_until, paused_by)
    SELECT s.scope, s.max_running, s.rate, s.burst, CASE WHEN s.rate IS NULL THEN 0 ELSE 1 END,
           p.paused_until, p.paused_by
      FROM unnest(%(scopes)s::text[], %(maxes)s::int[], %(rates)s::float8[], %(bursts)s::float8[])
           AS s(scope, max_running, rate, burst)
      LEFT JOIN "public"."miniqueue_pauses" p ON p.key = substring(s.scope FROM '^(?:concurrency|rate) [^ ]+ (.*)$')
    ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst
     WHERE (l.max_running, l.rate, l.burst) IS DISTINCT FROM (excluded.max_running, excluded.rate, excluded.burst)
), sequenced AS (
    INSERT INTO "public"."miniqueue_sequences" AS s (key, on_failure)
    SELECT key, on_failure FROM unnest(%(sequence_keys)s::text[], %(on_failures)s::text[]) AS q(key, on_failure)
     ORDER BY key
    ON CONFLICT (key) DO UPDATE SET on_failure = excluded.on_failure, updated_at = now()
    RETURNING key
), src AS MATERIALIZED (
    SELECT nextval('"public"."miniqueue_jobs_id_seq"') AS id, u.*
      FROM unnest(%(queues)b::text[], %(tasks)b::text[], %(payloads)b::text[], %(priorities)b::int[],
                  %(max_attempts)b::int[], %(run_ats)b::timestamptz[], %(delays)b::float8[], %(keys)b::text[],
                  %(limits)b::text[], %(expires_ats)b::timestamptz[], %(expires_ins)b::float8[], %(uniques)b::text[],
                  %(while_running)b::boolean[], %(sequences)b::text[], %(rate_costs)b::int[])
           WITH ORDINALITY AS u(queue, task, payload, priority, max_attempts, run_at, delay, key, limits, expires_at,
                                expires_in, uniq, while_running, sequence, rate_cost, ord)
), held AS (
    INSERT INTO "public"."miniqueue_idempotency_keys" (key, job_id)
    SELECT key, id FROM src WHERE key IS NOT NULL ORDER BY ord
    ON CONFLICT (key) DO NOTHING
    RETURNING key, job_id
), ins AS (
    INSERT INTO "public"."miniqueue_jobs_live" (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context, expires_at, unique_key, unique_while_running,
                        sequence_key, state, rate_cost)
    SELECT id, queue, task, payload::jsonb, priority, max_attempts, max_attempts,
           COALESCE(run_at, now() + make_interval(secs => COALESCE(delay, 0))), key, string_to_array(limits, chr(31)),
           %(trace)s::jsonb, COALESCE(expires_at, now() + make_interval(secs => expires_in)), uniq,
           COALESCE(while_running, true), sequence, CASE WHEN sequence IS NULL THEN 'available' ELSE 'waiting' END,
           COALESCE(rate_cost, 1)
      FROM src WHERE (SELECT count(*) FROM sequenced) >= 0 AND (key IS NULL OR id IN (SELECT job_id FROM held))
     ORDER BY ord
    ON CONFLICT DO NOTHING
    RETURNING id, queue, scheduled_at, state, unique_key, sequence_key
), advanced AS (
    SELECT "public"."miniqueue_sequence_advance"(ARRAY(SELECT DISTINCT sequence_key FROM ins WHERE sequence_key IS NOT NULL), %(channel)s)
     WHERE EXISTS (SELECT 1 FROM ins WHERE sequence_key IS NOT NULL)
), notified AS (
    SELECT pg_notify(%(channel)s, queue)
      FROM (SELECT DISTINCT queue FROM ins WHERE state = 'available' AND scheduled_at <= now()) q
     WHERE %(notify)s
)
SELECT s.ord,
       COALESCE(i.id, ik.job_id, iu.id,
                (SELECT job_id FROM "public"."miniqueue_idempotency_keys" WHERE key = s.key),
                (SELECT id FROM "public"."miniqueue_jobs_live" WHERE unique_key = s.uniq AND unique_key IS NOT NULL
      AND (state IN ('waiting', 'available') AND (attempt = 0 OR unique_while_running)
           OR state = 'running' AND unique_while_running))),
       i.id IS NULL
  FROM src s
  LEFT JOIN ins i ON i.id = s.id
  LEFT JOIN held ik ON i.id IS NULL AND ik.key = s.key
  LEFT JOIN ins iu ON i.id IS NULL AND ik.job_id IS NULL AND iu.unique_key = s.uniq
 WHERE (SELECT count(*) FROM notified) >= 0 AND (SELECT count(*) FROM advanced) >= 0
 ORDER BY s.ord;

-- _draw_ids
SELECT now(), ARRAY(SELECT nextval('"public"."miniqueue_jobs_id_seq"') FROM generate_series(1, %(count)s));

-- _notify_queues
SELECT pg_notify(%(channel)s, queue) FROM unnest(%(queues)b::text[]) AS q(queue);

-- _copy_due
COPY "public"."miniqueue_jobs_live" (id, queue, task, payload, priority, max_attempts, attempt_budget) FROM STDIN;

-- _copy_scheduled
COPY "public"."miniqueue_jobs_live" (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at) FROM STDIN;

-- _copy_due_traced
COPY "public"."miniqueue_jobs_live" (id, queue, task, payload, priority, max_attempts, attempt_budget, trace_context) FROM STDIN;

-- _copy_scheduled_traced
COPY "public"."miniqueue_jobs_live" (id, queue, task, payload, priority, max_attempts, attempt_budget, trace_context, scheduled_at) FROM STDIN;

-- _copy_keyed
COPY "public"."miniqueue_jobs_live" (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at, trace_context,
             unique_key, unique_while_running, expires_at) FROM STDIN;

-- _copy_keyed_due
COPY "public"."miniqueue_jobs_live" (id, queue, task, payload, priority, max_attempts, attempt_budget, unique_key) FROM STDIN;

-- _lock_callbacks
SELECT id, state FROM "public"."miniqueue_jobs" WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id FOR NO KEY UPDATE;

-- _dependents_of_held
SELECT dependents FROM "public"."miniqueue_jobs"
 WHERE id = %(id)s AND attempt = %(attempt)s AND state = 'running' AND leased_by = %(worker)s
   FOR NO KEY UPDATE;

-- _join_group
WITH joined AS (
    UPDATE "public"."miniqueue_jobs" SET parents = array_append(parents, %(id)s::bigint), pending_parents = pending_parents + 1
     WHERE id = ANY(%(callbacks)s::bigint[]) AND state = 'waiting'
    RETURNING id
)
UPDATE "public"."miniqueue_jobs" SET dependents = ARRAY(SELECT id FROM joined ORDER BY id) WHERE id = %(id)s;

-- _claim_one
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
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, date_trunc('hour', now(), 'UTC'), count(*) FROM completed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
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
    SELECT id, priority, coalesce(rank_at, scheduled_at) AS turn, attempt FROM "public"."miniqueue_jobs"
     WHERE state = 'available' AND queue = %(queue)s AND limits IS NULL AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
       AND (%(tasks)b::text[] IS NULL OR task = ANY(%(tasks)b::text[]))
       AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_queues" WHERE name = %(queue)s AND (paused OR max_running IS NOT NULL))
     ORDER BY priority DESC, coalesce(rank_at, scheduled_at), id
     LIMIT %(limit)s FOR UPDATE SKIP LOCKED),
open_queues AS MATERIALIZED (
    SELECT q.name, p.max_running,
           CASE WHEN p.max_running IS NULL THEN '{}'::text[] ELSE ARRAY['queue ' || q.name] END AS scope
      FROM (VALUES (%(queue)s::text)) AS q(name) LEFT JOIN "public"."miniqueue_queues" p ON p.name = q.name
     WHERE NOT coalesce(p.paused, false)
),
kept AS MATERIALIZED (
    SELECT k.queue, k.limits, q.scope
      FROM (SELECT DISTINCT queue, limits FROM completed WHERE limits IS NOT NULL AND id = ANY(%(keep)b::bigint[])) k
      JOIN open_queues q ON q.name = k.queue
     CROSS JOIN LATERAL (
        SELECT 1 FROM "public"."miniqueue_jobs" WHERE state = 'available' AND limits IS NOT NULL AND queue = k.queue AND limits = k.limits LIMIT 1) n
     LIMIT %(needed)s
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
    SELECT g.queue, g.limits, g.scopes, s.locked, s.rooms, s.room, s.single FROM (
        SELECT q.name AS queue, NULL::text[] AS limits, q.scope AS scopes
          FROM open_queues q WHERE q.max_running IS NOT NULL
        UNION ALL
        SELECT queue, limits, limits || scope FROM kept
        UNION ALL
        SELECT queue, limits, limits || scope FROM groups r
         WHERE NOT EXISTS (SELECT 1 FROM kept k WHERE k.queue = r.queue AND k.limits = r.limits)) g
     CROSS JOIN snapshot t CROSS JOIN LATERAL (
        SELECT array_agg(x.scope) AS locked, array_agg(x.room) AS rooms, min(x.room) AS room,
               bool_and(x.single) AS single
          FROM (SELECT l.scope, CASE WHEN l.max_running = 1 THEN 1 ELSE CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id AND j.state IN ('waiting', 'available', 'running') WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT coalesce((%(ids)b::bigint[])[width_bucket(h.id, %(ids)b::bigint[])] = h.id
                AND (%(attempts)b::int[])[width_bucket(h.id, %(ids)b::bigint[])] = h.attempt, false))::int
     END END AS room, l.max_running = 1 AS single
                  FROM "public"."miniqueue_limits" l WHERE l.scope = ANY(g.scopes) AND (l.paused_until IS NULL OR l.paused_until <= now()) AND NOT (l.xmax <> '0'
               AND ((l.xmax::text::bigint - t.next) & 4294967295 < 1048576 OR l.xmax::text::bigint = ANY(t.running))
               AND l.xmax::text::bigint IS DISTINCT FROM pg_current_xact_id_if_assigned()::text::bigint & 4294967295) AND CASE WHEN l.max_running IS NULL THEN least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) >= 1
     ELSE (SELECT count(*) FROM (SELECT FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                                   LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id AND j.state IN ('waiting', 'available', 'running')
                                  WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT coalesce((%(ids)b::bigint[])[width_bucket(h.id, %(ids)b::bigint[])] = h.id
                AND (%(attempts)b::int[])[width_bucket(h.id, %(ids)b::bigint[])] = h.attempt, false) LIMIT l.max_running) x) < l.max_running
     END
                   FOR UPDATE OF l SKIP LOCKED) x
        OFFSET 0) s
     WHERE cardinality(s.locked) = cardinality(g.scopes)
     LIMIT %(groups)s
),
sharing AS MATERIALIZED (
    SELECT %(shared)s OR EXISTS (SELECT 1 FROM looked WHERE cardinality(scopes) > 1)
           OR EXISTS (SELECT 1 FROM limited WHERE rate_cost > 1) AS ranked
),
scopes AS MATERIALIZED (
    SELECT DISTINCT ON (r.scope) r.scope, r.room
      FROM (SELECT unnest(locked) AS scope, unnest(rooms) AS room FROM looked) r
     WHERE (SELECT ranked FROM sharing)
),
limited AS MATERIALIZED (
    SELECT j.*, g.scopes, t.together, t.together AND g.spare AND %(together)s > 1 AS spare
      FROM (SELECT *, row_number() OVER () > %(needed)s AS spare FROM looked) g CROSS JOIN LATERAL (
        SELECT coalesce(cardinality(g.scopes) = 1 AND g.single, false) AS together) t CROSS JOIN LATERAL (
        SELECT *, CASE WHEN t.together THEN min(turn) OVER () ELSE turn END AS lead,
               CASE WHEN t.together THEN min(id) OVER () ELSE id END AS lead_id FROM (
        SELECT id, queue, limits, priority, scheduled_at, coalesce(rank_at, scheduled_at) AS turn, attempt, rate_cost FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits = g.limits
           AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
           AND (%(tasks)b::text[] IS NULL OR task = ANY(%(tasks)b::text[]))
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, CASE WHEN NOT t.together THEN g.room WHEN g.spare THEN 1 ELSE %(together)s END)
           FOR UPDATE SKIP LOCKED) j) j
     WHERE g.limits IS NOT NULL
    UNION ALL
    SELECT j.*, j.turn, j.id, g.scopes, false, false FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, coalesce(rank_at, scheduled_at) AS turn, attempt, rate_cost FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NULL AND queue = g.queue AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
           AND (%(tasks)b::text[] IS NULL OR task = ANY(%(tasks)b::text[]))
         ORDER BY priority DESC, coalesce(rank_at, scheduled_at), id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NULL
),
need AS (
    SELECT id, priority, scheduled_at, scope, CASE WHEN starts_with(scope, 'rate ') THEN rate_cost ELSE 1 END AS cost
      FROM (SELECT id, priority, scheduled_at, rate_cost, unnest(scopes) AS scope FROM limited) c
),
blocked AS MATERIALIZED (
    SELECT DISTINCT r.id
      FROM (SELECT n.id, n.scope, sum(n.cost) OVER (PARTITION BY n.scope
                                                    ORDER BY n.priority DESC, n.scheduled_at, n.id) AS spent
              FROM need n WHERE (SELECT ranked FROM sharing)) r
      JOIN scopes m ON m.scope = r.scope
     WHERE r.spent > m.room
),
admitted AS (
    SELECT c.id, c.lead, c.lead_id, c.spare, c.priority, c.turn, c.attempt, c.scopes, c.rate_cost, c.together
      FROM limited c
     WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.id = c.id)
),
chosen AS MATERIALIZED (
    SELECT priority, spare, lead, lead_id, turn, id, attempt, rate_cost, together, scopes
      FROM (SELECT id, turn AS lead, id AS lead_id, false AS spare, priority, turn, attempt, '{}'::text[] AS scopes, 1 AS rate_cost,
                   false AS together FROM fast
            UNION ALL
            SELECT id, lead, lead_id, spare, priority, turn, attempt, scopes, rate_cost, together FROM admitted) a
     ORDER BY priority DESC, spare, lead, lead_id, turn, id LIMIT %(limit)s
),
taken AS (
    UPDATE "public"."miniqueue_limits" l
       SET (holder_ids, holder_attempts) = (
               SELECT CASE WHEN l.max_running IS NULL THEN l.holder_ids
                           ELSE coalesce(array_agg(h.id ORDER BY h.id), '{}') || t.ids END,
                      CASE WHEN l.max_running IS NULL THEN l.holder_attempts
                           ELSE coalesce(array_agg(h.attempt ORDER BY h.id), '{}') || t.attempts END
                 FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt) LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id AND j.state IN ('waiting', 'available', 'running')
                WHERE l.max_running > 1 AND ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT coalesce((%(ids)b::bigint[])[width_bucket(h.id, %(ids)b::bigint[])] = h.id
                AND (%(attempts)b::int[])[width_bucket(h.id, %(ids)b::bigint[])] = h.attempt, false)),
           tokens = CASE WHEN l.rate IS NULL THEN l.tokens ELSE least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) - t.used END,
           refilled_at = CASE WHEN l.rate IS NULL THEN l.refilled_at ELSE greatest(l.refilled_at, now()) END
      FROM (SELECT scope, sum(rate_cost) AS used, array_agg(id) AS ids, array_agg(attempt + 1) AS attempts
              FROM (SELECT unnest(scopes) AS scope, rate_cost, id, attempt FROM chosen) c GROUP BY scope) t
     WHERE l.scope = t.scope
),
claimed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'running', leased_by = %(worker)s, attempt = attempt + 1, started_at = now(),
       lease_expires_at = now() + make_interval(secs => %(lease_duration)s)
 WHERE id = ANY(ARRAY(SELECT id FROM chosen)) AND state = 'available'
RETURNING id, queue, task, payload, priority, attempt, max_attempts, scheduled_at, created_at, lease_expires_at,
          limits, parents, trace_context, attempt_budget, run_alone, fair_key, coalesce(rank_at, scheduled_at) AS turn
)
SELECT CASE WHEN row_number() OVER () = 1 THEN d.ids END,
       CASE WHEN row_number() OVER () = 1 THEN (SELECT array_agg(id) FROM chosen WHERE together) END, c.*
  FROM (SELECT array_agg(id) AS ids FROM completed) d LEFT JOIN claimed c ON true
 WHERE (SELECT count(*) FROM settled) >= 0;

-- _claim_many
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
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, date_trunc('hour', now(), 'UTC'), count(*) FROM completed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
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
    SELECT c.id, c.priority, c.turn, c.attempt FROM unnest(%(queues)b::text[]) AS q(name)
     CROSS JOIN LATERAL (
        SELECT id, priority, coalesce(rank_at, scheduled_at) AS turn, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND queue = q.name AND limits IS NULL AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
           AND (%(tasks)b::text[] IS NULL OR task = ANY(%(tasks)b::text[]))
         ORDER BY priority DESC, coalesce(rank_at, scheduled_at), id
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c
     WHERE NOT EXISTS (SELECT 1 FROM "public"."miniqueue_queues" p WHERE p.name = q.name AND (p.paused OR p.max_running IS NOT NULL))
     ORDER BY c.priority DESC, c.turn, c.id
     LIMIT %(limit)s),
open_queues AS MATERIALIZED (
    SELECT q.name, p.max_running,
           CASE WHEN p.max_running IS NULL THEN '{}'::text[] ELSE ARRAY['queue ' || q.name] END AS scope
      FROM unnest(%(queues)b::text[]) AS q(name) LEFT JOIN "public"."miniqueue_queues" p ON p.name = q.name
     WHERE NOT coalesce(p.paused, false)
),
kept AS MATERIALIZED (
    SELECT k.queue, k.limits, q.scope
      FROM (SELECT DISTINCT queue, limits FROM completed WHERE limits IS NOT NULL AND id = ANY(%(keep)b::bigint[])) k
      JOIN open_queues q ON q.name = k.queue
     CROSS JOIN LATERAL (
        SELECT 1 FROM "public"."miniqueue_jobs" WHERE state = 'available' AND limits IS NOT NULL AND queue = k.queue AND limits = k.limits LIMIT 1) n
     LIMIT %(needed)s
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
    SELECT g.queue, g.limits, g.scopes, s.locked, s.rooms, s.room, s.single FROM (
        SELECT q.name AS queue, NULL::text[] AS limits, q.scope AS scopes
          FROM open_queues q WHERE q.max_running IS NOT NULL
        UNION ALL
        SELECT queue, limits, limits || scope FROM kept
        UNION ALL
        SELECT queue, limits, limits || scope FROM groups r
         WHERE NOT EXISTS (SELECT 1 FROM kept k WHERE k.queue = r.queue AND k.limits = r.limits)) g
     CROSS JOIN snapshot t CROSS JOIN LATERAL (
        SELECT array_agg(x.scope) AS locked, array_agg(x.room) AS rooms, min(x.room) AS room,
               bool_and(x.single) AS single
          FROM (SELECT l.scope, CASE WHEN l.max_running = 1 THEN 1 ELSE CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id AND j.state IN ('waiting', 'available', 'running') WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT coalesce((%(ids)b::bigint[])[width_bucket(h.id, %(ids)b::bigint[])] = h.id
                AND (%(attempts)b::int[])[width_bucket(h.id, %(ids)b::bigint[])] = h.attempt, false))::int
     END END AS room, l.max_running = 1 AS single
                  FROM "public"."miniqueue_limits" l WHERE l.scope = ANY(g.scopes) AND (l.paused_until IS NULL OR l.paused_until <= now()) AND NOT (l.xmax <> '0'
               AND ((l.xmax::text::bigint - t.next) & 4294967295 < 1048576 OR l.xmax::text::bigint = ANY(t.running))
               AND l.xmax::text::bigint IS DISTINCT FROM pg_current_xact_id_if_assigned()::text::bigint & 4294967295) AND CASE WHEN l.max_running IS NULL THEN least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) >= 1
     ELSE (SELECT count(*) FROM (SELECT FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                                   LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id AND j.state IN ('waiting', 'available', 'running')
                                  WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT coalesce((%(ids)b::bigint[])[width_bucket(h.id, %(ids)b::bigint[])] = h.id
                AND (%(attempts)b::int[])[width_bucket(h.id, %(ids)b::bigint[])] = h.attempt, false) LIMIT l.max_running) x) < l.max_running
     END
                   FOR UPDATE OF l SKIP LOCKED) x
        OFFSET 0) s
     WHERE cardinality(s.locked) = cardinality(g.scopes)
     LIMIT %(groups)s
),
sharing AS MATERIALIZED (
    SELECT %(shared)s OR EXISTS (SELECT 1 FROM looked WHERE cardinality(scopes) > 1)
           OR EXISTS (SELECT 1 FROM limited WHERE rate_cost > 1) AS ranked
),
scopes AS MATERIALIZED (
    SELECT DISTINCT ON (r.scope) r.scope, r.room
      FROM (SELECT unnest(locked) AS scope, unnest(rooms) AS room FROM looked) r
     WHERE (SELECT ranked FROM sharing)
),
limited AS MATERIALIZED (
    SELECT j.*, g.scopes, t.together, t.together AND g.spare AND %(together)s > 1 AS spare
      FROM (SELECT *, row_number() OVER () > %(needed)s AS spare FROM looked) g CROSS JOIN LATERAL (
        SELECT coalesce(cardinality(g.scopes) = 1 AND g.single, false) AS together) t CROSS JOIN LATERAL (
        SELECT *, CASE WHEN t.together THEN min(turn) OVER () ELSE turn END AS lead,
               CASE WHEN t.together THEN min(id) OVER () ELSE id END AS lead_id FROM (
        SELECT id, queue, limits, priority, scheduled_at, coalesce(rank_at, scheduled_at) AS turn, attempt, rate_cost FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits = g.limits
           AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
           AND (%(tasks)b::text[] IS NULL OR task = ANY(%(tasks)b::text[]))
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, CASE WHEN NOT t.together THEN g.room WHEN g.spare THEN 1 ELSE %(together)s END)
           FOR UPDATE SKIP LOCKED) j) j
     WHERE g.limits IS NOT NULL
    UNION ALL
    SELECT j.*, j.turn, j.id, g.scopes, false, false FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, coalesce(rank_at, scheduled_at) AS turn, attempt, rate_cost FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NULL AND queue = g.queue AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
           AND (%(tasks)b::text[] IS NULL OR task = ANY(%(tasks)b::text[]))
         ORDER BY priority DESC, coalesce(rank_at, scheduled_at), id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NULL
),
need AS (
    SELECT id, priority, scheduled_at, scope, CASE WHEN starts_with(scope, 'rate ') THEN rate_cost ELSE 1 END AS cost
      FROM (SELECT id, priority, scheduled_at, rate_cost, unnest(scopes) AS scope FROM limited) c
),
blocked AS MATERIALIZED (
    SELECT DISTINCT r.id
      FROM (SELECT n.id, n.scope, sum(n.cost) OVER (PARTITION BY n.scope
                                                    ORDER BY n.priority DESC, n.scheduled_at, n.id) AS spent
              FROM need n WHERE (SELECT ranked FROM sharing)) r
      JOIN scopes m ON m.scope = r.scope
     WHERE r.spent > m.room
),
admitted AS (
    SELECT c.id, c.lead, c.lead_id, c.spare, c.priority, c.turn, c.attempt, c.scopes, c.rate_cost, c.together
      FROM limited c
     WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.id = c.id)
),
chosen AS MATERIALIZED (
    SELECT priority, spare, lead, lead_id, turn, id, attempt, rate_cost, together, scopes
      FROM (SELECT id, turn AS lead, id AS lead_id, false AS spare, priority, turn, attempt, '{}'::text[] AS scopes, 1 AS rate_cost,
                   false AS together FROM fast
            UNION ALL
            SELECT id, lead, lead_id, spare, priority, turn, attempt, scopes, rate_cost, together FROM admitted) a
     ORDER BY priority DESC, spare, lead, lead_id, turn, id LIMIT %(limit)s
),
taken AS (
    UPDATE "public"."miniqueue_limits" l
       SET (holder_ids, holder_attempts) = (
               SELECT CASE WHEN l.max_running IS NULL THEN l.holder_ids
                           ELSE coalesce(array_agg(h.id ORDER BY h.id), '{}') || t.ids END,
                      CASE WHEN l.max_running IS NULL THEN l.holder_attempts
                           ELSE coalesce(array_agg(h.attempt ORDER BY h.id), '{}') || t.attempts END
                 FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt) LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id AND j.state IN ('waiting', 'available', 'running')
                WHERE l.max_running > 1 AND ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT coalesce((%(ids)b::bigint[])[width_bucket(h.id, %(ids)b::bigint[])] = h.id
                AND (%(attempts)b::int[])[width_bucket(h.id, %(ids)b::bigint[])] = h.attempt, false)),
           tokens = CASE WHEN l.rate IS NULL THEN l.tokens ELSE least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) - t.used END,
           refilled_at = CASE WHEN l.rate IS NULL THEN l.refilled_at ELSE greatest(l.refilled_at, now()) END
      FROM (SELECT scope, sum(rate_cost) AS used, array_agg(id) AS ids, array_agg(attempt + 1) AS attempts
              FROM (SELECT unnest(scopes) AS scope, rate_cost, id, attempt FROM chosen) c GROUP BY scope) t
     WHERE l.scope = t.scope
),
claimed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'running', leased_by = %(worker)s, attempt = attempt + 1, started_at = now(),
       lease_expires_at = now() + make_interval(secs => %(lease_duration)s)
 WHERE id = ANY(ARRAY(SELECT id FROM chosen)) AND state = 'available'
RETURNING id, queue, task, payload, priority, attempt, max_attempts, scheduled_at, created_at, lease_expires_at,
          limits, parents, trace_context, attempt_budget, run_alone, fair_key, coalesce(rank_at, scheduled_at) AS turn
)
SELECT CASE WHEN row_number() OVER () = 1 THEN d.ids END,
       CASE WHEN row_number() OVER () = 1 THEN (SELECT array_agg(id) FROM chosen WHERE together) END, c.*
  FROM (SELECT array_agg(id) AS ids FROM completed) d LEFT JOIN claimed c ON true
 WHERE (SELECT count(*) FROM settled) >= 0;

-- _claim_one_down
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
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, date_trunc('hour', now(), 'UTC'), count(*) FROM completed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
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
    SELECT id, priority, coalesce(rank_at, scheduled_at) AS turn, attempt FROM "public"."miniqueue_jobs"
     WHERE state = 'available' AND queue = %(queue)s AND limits IS NULL AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
       AND (%(tasks)b::text[] IS NULL OR task = ANY(%(tasks)b::text[]))
       AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_queues" WHERE name = %(queue)s AND (paused OR max_running IS NOT NULL))
     ORDER BY priority DESC, coalesce(rank_at, scheduled_at), id
     LIMIT %(limit)s FOR UPDATE SKIP LOCKED),
open_queues AS MATERIALIZED (
    SELECT q.name, p.max_running,
           CASE WHEN p.max_running IS NULL THEN '{}'::text[] ELSE ARRAY['queue ' || q.name] END AS scope
      FROM (VALUES (%(queue)s::text)) AS q(name) LEFT JOIN "public"."miniqueue_queues" p ON p.name = q.name
     WHERE NOT coalesce(p.paused, false)
),
kept AS MATERIALIZED (
    SELECT k.queue, k.limits, q.scope
      FROM (SELECT DISTINCT queue, limits FROM completed WHERE limits IS NOT NULL AND id = ANY(%(keep)b::bigint[])) k
      JOIN open_queues q ON q.name = k.queue
     CROSS JOIN LATERAL (
        SELECT 1 FROM "public"."miniqueue_jobs" WHERE state = 'available' AND limits IS NOT NULL AND queue = k.queue AND limits = k.limits LIMIT 1) n
     LIMIT %(needed)s
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
    SELECT g.queue, g.limits, g.scopes, s.locked, s.rooms, s.room, s.single FROM (
        SELECT q.name AS queue, NULL::text[] AS limits, q.scope AS scopes
          FROM open_queues q WHERE q.max_running IS NOT NULL
        UNION ALL
        SELECT queue, limits, limits || scope FROM kept
        UNION ALL
        SELECT queue, limits, limits || scope FROM groups r
         WHERE NOT EXISTS (SELECT 1 FROM kept k WHERE k.queue = r.queue AND k.limits = r.limits)) g
     CROSS JOIN snapshot t CROSS JOIN LATERAL (
        SELECT array_agg(x.scope) AS locked, array_agg(x.room) AS rooms, min(x.room) AS room,
               bool_and(x.single) AS single
          FROM (SELECT l.scope, CASE WHEN l.max_running = 1 THEN 1 ELSE CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id AND j.state IN ('waiting', 'available', 'running') WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT coalesce((%(ids)b::bigint[])[width_bucket(h.id, %(ids)b::bigint[])] = h.id
                AND (%(attempts)b::int[])[width_bucket(h.id, %(ids)b::bigint[])] = h.attempt, false))::int
     END END AS room, l.max_running = 1 AS single
                  FROM "public"."miniqueue_limits" l WHERE l.scope = ANY(g.scopes) AND (l.paused_until IS NULL OR l.paused_until <= now()) AND NOT (l.xmax <> '0'
               AND ((l.xmax::text::bigint - t.next) & 4294967295 < 1048576 OR l.xmax::text::bigint = ANY(t.running))
               AND l.xmax::text::bigint IS DISTINCT FROM pg_current_xact_id_if_assigned()::text::bigint & 4294967295) AND CASE WHEN l.max_running IS NULL THEN least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) >= 1
     ELSE (SELECT count(*) FROM (SELECT FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                                   LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id AND j.state IN ('waiting', 'available', 'running')
                                  WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT coalesce((%(ids)b::bigint[])[width_bucket(h.id, %(ids)b::bigint[])] = h.id
                AND (%(attempts)b::int[])[width_bucket(h.id, %(ids)b::bigint[])] = h.attempt, false) LIMIT l.max_running) x) < l.max_running
     END
                   FOR UPDATE OF l SKIP LOCKED) x
        OFFSET 0) s
     WHERE cardinality(s.locked) = cardinality(g.scopes)
     LIMIT %(groups)s
),
sharing AS MATERIALIZED (
    SELECT %(shared)s OR EXISTS (SELECT 1 FROM looked WHERE cardinality(scopes) > 1)
           OR EXISTS (SELECT 1 FROM limited WHERE rate_cost > 1) AS ranked
),
scopes AS MATERIALIZED (
    SELECT DISTINCT ON (r.scope) r.scope, r.room
      FROM (SELECT unnest(locked) AS scope, unnest(rooms) AS room FROM looked) r
     WHERE (SELECT ranked FROM sharing)
),
limited AS MATERIALIZED (
    SELECT j.*, g.scopes, t.together, t.together AND g.spare AND %(together)s > 1 AS spare
      FROM (SELECT *, row_number() OVER () > %(needed)s AS spare FROM looked) g CROSS JOIN LATERAL (
        SELECT coalesce(cardinality(g.scopes) = 1 AND g.single, false) AS together) t CROSS JOIN LATERAL (
        SELECT *, CASE WHEN t.together THEN min(turn) OVER () ELSE turn END AS lead,
               CASE WHEN t.together THEN min(id) OVER () ELSE id END AS lead_id FROM (
        SELECT id, queue, limits, priority, scheduled_at, coalesce(rank_at, scheduled_at) AS turn, attempt, rate_cost FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits = g.limits
           AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
           AND (%(tasks)b::text[] IS NULL OR task = ANY(%(tasks)b::text[]))
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, CASE WHEN NOT t.together THEN g.room WHEN g.spare THEN 1 ELSE %(together)s END)
           FOR UPDATE SKIP LOCKED) j) j
     WHERE g.limits IS NOT NULL
    UNION ALL
    SELECT j.*, j.turn, j.id, g.scopes, false, false FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, coalesce(rank_at, scheduled_at) AS turn, attempt, rate_cost FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NULL AND queue = g.queue AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
           AND (%(tasks)b::text[] IS NULL OR task = ANY(%(tasks)b::text[]))
         ORDER BY priority DESC, coalesce(rank_at, scheduled_at), id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NULL
),
need AS (
    SELECT id, priority, scheduled_at, scope, CASE WHEN starts_with(scope, 'rate ') THEN rate_cost ELSE 1 END AS cost
      FROM (SELECT id, priority, scheduled_at, rate_cost, unnest(scopes) AS scope FROM limited) c
),
blocked AS MATERIALIZED (
    SELECT DISTINCT r.id
      FROM (SELECT n.id, n.scope, sum(n.cost) OVER (PARTITION BY n.scope
                                                    ORDER BY n.priority DESC, n.scheduled_at, n.id) AS spent
              FROM need n WHERE (SELECT ranked FROM sharing)) r
      JOIN scopes m ON m.scope = r.scope
     WHERE r.spent > m.room
),
admitted AS (
    SELECT c.id, c.lead, c.lead_id, c.spare, c.priority, c.turn, c.attempt, c.scopes, c.rate_cost, c.together
      FROM limited c
     WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.id = c.id)
),
chosen AS MATERIALIZED (
    SELECT priority, spare, lead, lead_id, turn, id, attempt, rate_cost, together, scopes
      FROM (SELECT id, turn AS lead, id AS lead_id, false AS spare, priority, turn, attempt, '{}'::text[] AS scopes, 1 AS rate_cost,
                   false AS together FROM fast
            UNION ALL
            SELECT id, lead, lead_id, spare, priority, turn, attempt, scopes, rate_cost, together FROM admitted) a
     ORDER BY priority DESC, spare, lead, lead_id, turn, id LIMIT %(limit)s
),
taken AS (
    UPDATE "public"."miniqueue_limits" l
       SET (holder_ids, holder_attempts) = (
               SELECT CASE WHEN l.max_running IS NULL THEN l.holder_ids
                           ELSE coalesce(array_agg(h.id ORDER BY h.id), '{}') || t.ids END,
                      CASE WHEN l.max_running IS NULL THEN l.holder_attempts
                           ELSE coalesce(array_agg(h.attempt ORDER BY h.id), '{}') || t.attempts END
                 FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt) LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id AND j.state IN ('waiting', 'available', 'running')
                WHERE l.max_running > 1 AND ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT coalesce((%(ids)b::bigint[])[width_bucket(h.id, %(ids)b::bigint[])] = h.id
                AND (%(attempts)b::int[])[width_bucket(h.id, %(ids)b::bigint[])] = h.attempt, false)),
           tokens = CASE WHEN l.rate IS NULL THEN l.tokens ELSE least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) - t.used END,
           refilled_at = CASE WHEN l.rate IS NULL THEN l.refilled_at ELSE greatest(l.refilled_at, now()) END
      FROM (SELECT scope, sum(rate_cost) AS used, array_agg(id) AS ids, array_agg(attempt + 1) AS attempts
              FROM (SELECT unnest(scopes) AS scope, rate_cost, id, attempt FROM chosen) c GROUP BY scope) t
     WHERE l.scope = t.scope
),
claimed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'running', leased_by = %(worker)s, attempt = attempt + 1, started_at = now(),
       lease_expires_at = now() + make_interval(secs => %(lease_duration)s)
 WHERE id = ANY(ARRAY(SELECT id FROM chosen)) AND state = 'available'
RETURNING id, queue, task, payload, priority, attempt, max_attempts, scheduled_at, created_at, lease_expires_at,
          limits, parents, trace_context, attempt_budget, run_alone, fair_key, coalesce(rank_at, scheduled_at) AS turn
)
SELECT CASE WHEN row_number() OVER () = 1 THEN d.ids END,
       CASE WHEN row_number() OVER () = 1 THEN (SELECT array_agg(id) FROM chosen WHERE together) END, c.*
  FROM (SELECT array_agg(id) AS ids FROM completed) d LEFT JOIN claimed c ON true
 WHERE (SELECT count(*) FROM settled) >= 0;

-- _claim_many_down
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
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, date_trunc('hour', now(), 'UTC'), count(*) FROM completed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
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
    SELECT c.id, c.priority, c.turn, c.attempt FROM unnest(%(queues)b::text[]) AS q(name)
     CROSS JOIN LATERAL (
        SELECT id, priority, coalesce(rank_at, scheduled_at) AS turn, attempt FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND queue = q.name AND limits IS NULL AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
           AND (%(tasks)b::text[] IS NULL OR task = ANY(%(tasks)b::text[]))
         ORDER BY priority DESC, coalesce(rank_at, scheduled_at), id
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c
     WHERE NOT EXISTS (SELECT 1 FROM "public"."miniqueue_queues" p WHERE p.name = q.name AND (p.paused OR p.max_running IS NOT NULL))
     ORDER BY c.priority DESC, c.turn, c.id
     LIMIT %(limit)s),
open_queues AS MATERIALIZED (
    SELECT q.name, p.max_running,
           CASE WHEN p.max_running IS NULL THEN '{}'::text[] ELSE ARRAY['queue ' || q.name] END AS scope
      FROM unnest(%(queues)b::text[]) AS q(name) LEFT JOIN "public"."miniqueue_queues" p ON p.name = q.name
     WHERE NOT coalesce(p.paused, false)
),
kept AS MATERIALIZED (
    SELECT k.queue, k.limits, q.scope
      FROM (SELECT DISTINCT queue, limits FROM completed WHERE limits IS NOT NULL AND id = ANY(%(keep)b::bigint[])) k
      JOIN open_queues q ON q.name = k.queue
     CROSS JOIN LATERAL (
        SELECT 1 FROM "public"."miniqueue_jobs" WHERE state = 'available' AND limits IS NOT NULL AND queue = k.queue AND limits = k.limits LIMIT 1) n
     LIMIT %(needed)s
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
    SELECT g.queue, g.limits, g.scopes, s.locked, s.rooms, s.room, s.single FROM (
        SELECT q.name AS queue, NULL::text[] AS limits, q.scope AS scopes
          FROM open_queues q WHERE q.max_running IS NOT NULL
        UNION ALL
        SELECT queue, limits, limits || scope FROM kept
        UNION ALL
        SELECT queue, limits, limits || scope FROM groups r
         WHERE NOT EXISTS (SELECT 1 FROM kept k WHERE k.queue = r.queue AND k.limits = r.limits)) g
     CROSS JOIN snapshot t CROSS JOIN LATERAL (
        SELECT array_agg(x.scope) AS locked, array_agg(x.room) AS rooms, min(x.room) AS room,
               bool_and(x.single) AS single
          FROM (SELECT l.scope, CASE WHEN l.max_running = 1 THEN 1 ELSE CASE WHEN l.max_running IS NULL THEN floor(least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))))::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id AND j.state IN ('waiting', 'available', 'running') WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT coalesce((%(ids)b::bigint[])[width_bucket(h.id, %(ids)b::bigint[])] = h.id
                AND (%(attempts)b::int[])[width_bucket(h.id, %(ids)b::bigint[])] = h.attempt, false))::int
     END END AS room, l.max_running = 1 AS single
                  FROM "public"."miniqueue_limits" l WHERE l.scope = ANY(g.scopes) AND (l.paused_until IS NULL OR l.paused_until <= now()) AND NOT (l.xmax <> '0'
               AND ((l.xmax::text::bigint - t.next) & 4294967295 < 1048576 OR l.xmax::text::bigint = ANY(t.running))
               AND l.xmax::text::bigint IS DISTINCT FROM pg_current_xact_id_if_assigned()::text::bigint & 4294967295) AND CASE WHEN l.max_running IS NULL THEN least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) >= 1
     ELSE (SELECT count(*) FROM (SELECT FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                                   LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id AND j.state IN ('waiting', 'available', 'running')
                                  WHERE ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT coalesce((%(ids)b::bigint[])[width_bucket(h.id, %(ids)b::bigint[])] = h.id
                AND (%(attempts)b::int[])[width_bucket(h.id, %(ids)b::bigint[])] = h.attempt, false) LIMIT l.max_running) x) < l.max_running
     END
                   FOR UPDATE OF l SKIP LOCKED) x
        OFFSET 0) s
     WHERE cardinality(s.locked) = cardinality(g.scopes)
     LIMIT %(groups)s
),
sharing AS MATERIALIZED (
    SELECT %(shared)s OR EXISTS (SELECT 1 FROM looked WHERE cardinality(scopes) > 1)
           OR EXISTS (SELECT 1 FROM limited WHERE rate_cost > 1) AS ranked
),
scopes AS MATERIALIZED (
    SELECT DISTINCT ON (r.scope) r.scope, r.room
      FROM (SELECT unnest(locked) AS scope, unnest(rooms) AS room FROM looked) r
     WHERE (SELECT ranked FROM sharing)
),
limited AS MATERIALIZED (
    SELECT j.*, g.scopes, t.together, t.together AND g.spare AND %(together)s > 1 AS spare
      FROM (SELECT *, row_number() OVER () > %(needed)s AS spare FROM looked) g CROSS JOIN LATERAL (
        SELECT coalesce(cardinality(g.scopes) = 1 AND g.single, false) AS together) t CROSS JOIN LATERAL (
        SELECT *, CASE WHEN t.together THEN min(turn) OVER () ELSE turn END AS lead,
               CASE WHEN t.together THEN min(id) OVER () ELSE id END AS lead_id FROM (
        SELECT id, queue, limits, priority, scheduled_at, coalesce(rank_at, scheduled_at) AS turn, attempt, rate_cost FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits = g.limits
           AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
           AND (%(tasks)b::text[] IS NULL OR task = ANY(%(tasks)b::text[]))
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, CASE WHEN NOT t.together THEN g.room WHEN g.spare THEN 1 ELSE %(together)s END)
           FOR UPDATE SKIP LOCKED) j) j
     WHERE g.limits IS NOT NULL
    UNION ALL
    SELECT j.*, j.turn, j.id, g.scopes, false, false FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, coalesce(rank_at, scheduled_at) AS turn, attempt, rate_cost FROM "public"."miniqueue_jobs"
         WHERE state = 'available' AND limits IS NULL AND queue = g.queue AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
           AND (%(tasks)b::text[] IS NULL OR task = ANY(%(tasks)b::text[]))
         ORDER BY priority DESC, coalesce(rank_at, scheduled_at), id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NULL
),
need AS (
    SELECT id, priority, scheduled_at, scope, CASE WHEN starts_with(scope, 'rate ') THEN rate_cost ELSE 1 END AS cost
      FROM (SELECT id, priority, scheduled_at, rate_cost, unnest(scopes) AS scope FROM limited) c
),
blocked AS MATERIALIZED (
    SELECT DISTINCT r.id
      FROM (SELECT n.id, n.scope, sum(n.cost) OVER (PARTITION BY n.scope
                                                    ORDER BY n.priority DESC, n.scheduled_at, n.id) AS spent
              FROM need n WHERE (SELECT ranked FROM sharing)) r
      JOIN scopes m ON m.scope = r.scope
     WHERE r.spent > m.room
),
admitted AS (
    SELECT c.id, c.lead, c.lead_id, c.spare, c.priority, c.turn, c.attempt, c.scopes, c.rate_cost, c.together
      FROM limited c
     WHERE NOT EXISTS (SELECT 1 FROM blocked b WHERE b.id = c.id)
),
chosen AS MATERIALIZED (
    SELECT priority, spare, lead, lead_id, turn, id, attempt, rate_cost, together, scopes
      FROM (SELECT id, turn AS lead, id AS lead_id, false AS spare, priority, turn, attempt, '{}'::text[] AS scopes, 1 AS rate_cost,
                   false AS together FROM fast
            UNION ALL
            SELECT id, lead, lead_id, spare, priority, turn, attempt, scopes, rate_cost, together FROM admitted) a
     ORDER BY priority DESC, spare, lead, lead_id, turn, id LIMIT %(limit)s
),
taken AS (
    UPDATE "public"."miniqueue_limits" l
       SET (holder_ids, holder_attempts) = (
               SELECT CASE WHEN l.max_running IS NULL THEN l.holder_ids
                           ELSE coalesce(array_agg(h.id ORDER BY h.id), '{}') || t.ids END,
                      CASE WHEN l.max_running IS NULL THEN l.holder_attempts
                           ELSE coalesce(array_agg(h.attempt ORDER BY h.id), '{}') || t.attempts END
                 FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt) LEFT JOIN "public"."miniqueue_jobs" j ON j.id = h.id AND j.state IN ('waiting', 'available', 'running')
                WHERE l.max_running > 1 AND ((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM "public"."miniqueue_limits" v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT coalesce((%(ids)b::bigint[])[width_bucket(h.id, %(ids)b::bigint[])] = h.id
                AND (%(attempts)b::int[])[width_bucket(h.id, %(ids)b::bigint[])] = h.attempt, false)),
           tokens = CASE WHEN l.rate IS NULL THEN l.tokens ELSE least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) - t.used END,
           refilled_at = CASE WHEN l.rate IS NULL THEN l.refilled_at ELSE greatest(l.refilled_at, now()) END
      FROM (SELECT scope, sum(rate_cost) AS used, array_agg(id) AS ids, array_agg(attempt + 1) AS attempts
              FROM (SELECT unnest(scopes) AS scope, rate_cost, id, attempt FROM chosen) c GROUP BY scope) t
     WHERE l.scope = t.scope
),
claimed AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'running', leased_by = %(worker)s, attempt = attempt + 1, started_at = now(),
       lease_expires_at = now() + make_interval(secs => %(lease_duration)s)
 WHERE id = ANY(ARRAY(SELECT id FROM chosen)) AND state = 'available'
RETURNING id, queue, task, payload, priority, attempt, max_attempts, scheduled_at, created_at, lease_expires_at,
          limits, parents, trace_context, attempt_budget, run_alone, fair_key, coalesce(rank_at, scheduled_at) AS turn
)
SELECT CASE WHEN row_number() OVER () = 1 THEN d.ids END,
       CASE WHEN row_number() OVER () = 1 THEN (SELECT array_agg(id) FROM chosen WHERE together) END, c.*
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
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, date_trunc('hour', now(), 'UTC'), count(*) FROM completed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
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
WITH renewed AS (
UPDATE "public"."miniqueue_jobs"
   SET lease_expires_at = now() + make_interval(secs => %(lease_duration)s),
       progress = coalesce(((%(progress)b::text[])[width_bucket(id, %(ids)b::bigint[])])::jsonb
                           || jsonb_build_object('at', now()), progress)
 WHERE id = ANY(%(ids)b::bigint[])
   AND attempt = (%(attempts)b::int[])[width_bucket(id, %(ids)b::bigint[])]
   AND state = 'running' AND leased_by = %(worker)s
RETURNING id, lease_expires_at, awaited AND (%(progress)b::text[])[width_bucket(id, %(ids)b::bigint[])] IS NOT NULL AS told
)
SELECT id, lease_expires_at, CASE WHEN told THEN pg_notify(%(channel)s, id::text) END FROM renewed;

-- _record_failures
WITH failed AS (
UPDATE "public"."miniqueue_jobs" j
   SET state = CASE WHEN j.attempt >= j.max_attempts THEN 'dead' ELSE 'available' END,
       scheduled_at = CASE WHEN j.attempt >= j.max_attempts THEN j.scheduled_at
                           ELSE now() + make_interval(secs => coalesce(
                               f.backoff, "public"."miniqueue_retry_delay"(task => j.task, attempt => j.attempt_budget - (j.max_attempts - j.attempt),
                                   default_base => %(base)s, default_cap => %(cap)s))) END,
       finished_at = CASE WHEN j.attempt >= j.max_attempts THEN now() END,
       last_error = f.error, errors = j.errors || jsonb_build_array(jsonb_build_object(
       'attempt', j.attempt, 'started', j.started_at, 'at', now(), 'worker', j.leased_by, 'error', f.error)),
       lease_expires_at = NULL, leased_by = NULL
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(errors)s::text[], %(backoffs)s::float8[])
       AS f(id, attempt, error, backoff)
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = f.id AND j.attempt = f.attempt AND state = 'running' AND leased_by = %(worker)s
RETURNING j.id, j.queue, j.state, j.dependents, j.awaited, j.sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, date_trunc('hour', now(), 'UTC'), count(*) FROM failed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
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
       'attempt', attempt, 'started', started_at, 'at', now(), 'worker', leased_by, 'error', %(error)s::text)),
       lease_expires_at = NULL, leased_by = NULL
 WHERE id = %(id)s AND attempt = %(attempt)s AND state = 'running' AND leased_by = %(worker)s
RETURNING id, queue, state, dependents, awaited, sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, date_trunc('hour', now(), 'UTC'), count(*) FROM failed
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
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

-- _rate_limit
WITH backed AS (
    UPDATE "public"."miniqueue_jobs" j
       SET state = 'available', max_attempts = j.max_attempts + 1, lease_expires_at = NULL, leased_by = NULL,
           scheduled_at = greatest(now() + make_interval(secs => %(delay)s),
                                   (SELECT max(l.paused_until) FROM "public"."miniqueue_limits" l
                                     WHERE substring(l.scope FROM '^(?:concurrency|rate) [^ ]+ (.*)$') = %(key)s)),
           errors = j.errors || jsonb_build_array(jsonb_build_object(
               'attempt', j.attempt, 'started', j.started_at, 'at', now(), 'worker', j.leased_by,
               'error', %(note)s::text, 'charged', false))
     WHERE id = %(id)s AND attempt = %(attempt)s AND state = 'running' AND leased_by = %(worker)s
    RETURNING j.id
), paused AS (
    UPDATE "public"."miniqueue_limits" l
       SET paused_until = greatest(l.paused_until, now() + make_interval(secs => %(delay)s)),
           paused_by = CASE WHEN l.paused_until > now() + make_interval(secs => %(delay)s) THEN l.paused_by
                            ELSE %(id)s END
     WHERE substring(l.scope FROM '^(?:concurrency|rate) [^ ]+ (.*)$') = %(key)s AND EXISTS (SELECT 1 FROM backed)
    RETURNING l.scope
), remembered AS (
    INSERT INTO "public"."miniqueue_pauses" AS p (key, paused_until, paused_by)
    SELECT %(key)s, now() + make_interval(secs => %(delay)s), %(id)s WHERE EXISTS (SELECT 1 FROM backed)
    ON CONFLICT (key) DO UPDATE SET paused_until = excluded.paused_until, paused_by = excluded.paused_by
     WHERE p.paused_until <= excluded.paused_until
)
SELECT id, (SELECT count(*) FROM paused) FROM backed;

-- _release
UPDATE "public"."miniqueue_jobs" j
   SET state = 'available', max_attempts = j.max_attempts + 1, errors = j.errors || jsonb_build_array(jsonb_build_object(
       'attempt', j.attempt, 'started', j.started_at, 'at', now(), 'worker', j.leased_by, 'error', r.note,
       'charged', false)),
       lease_expires_at = NULL, leased_by = NULL, run_alone = CASE WHEN r.alone THEN true ELSE j.run_alone END
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(notes)s::text[], %(alone)s::bool[]) AS r(id, attempt, note, alone)
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = r.id AND j.attempt = r.attempt AND state = 'running' AND leased_by = %(worker)s
RETURNING j.id, pg_notify('miniqueue_public', j.queue);

-- _leases_of
SELECT id, attempt FROM "public"."miniqueue_jobs"
 WHERE state = 'running' AND leased_by = %(worker)s AND lease_expires_at IS NOT NULL;

-- _record_progress
UPDATE "public"."miniqueue_jobs"
   SET progress = ((%(progress)b::text[])[width_bucket(id, %(ids)b::bigint[])])::jsonb || jsonb_build_object('at', now())
 WHERE id = ANY(%(ids)b::bigint[])
   AND attempt = (%(attempts)b::int[])[width_bucket(id, %(ids)b::bigint[])]
   AND state = 'running' AND leased_by = %(worker)s
RETURNING id, CASE WHEN awaited THEN pg_notify(%(channel)s, id::text) END;

-- _progress
SELECT state, progress, result, last_error FROM "public"."miniqueue_jobs" WHERE id = %(id)s;

-- _steps
SELECT steps FROM "public"."miniqueue_jobs"
 WHERE id = %(id)s AND attempt = %(attempt)s AND state = 'running' AND leased_by = %(worker)s;

-- _record_step
UPDATE "public"."miniqueue_jobs"
   SET steps = (CASE WHEN (steps -> -1) ? 'waiting' THEN steps - (-1) ELSE coalesce(steps, '[]') END)
               || jsonb_build_array(jsonb_build_object('name', %(name)s::text, 'kind', 'step', 'value', %(value)s::jsonb,
                                                       'attempt', attempt, 'at', now()))
 WHERE id = %(id)s AND attempt = %(attempt)s AND state = 'running' AND leased_by = %(worker)s
RETURNING id;

-- _sleep
UPDATE "public"."miniqueue_jobs"
   SET steps = (CASE WHEN (steps -> -1) ? 'waiting' THEN steps - (-1) ELSE coalesce(steps, '[]') END)
               || jsonb_build_array(jsonb_build_object('name', %(name)s::text, 'kind', 'sleep',
                                                       'until', now() + make_interval(secs => %(seconds)s),
                                                       'attempt', attempt, 'at', now())),
       state = 'available', scheduled_at = now() + make_interval(secs => %(seconds)s),
       max_attempts = max_attempts + 1, lease_expires_at = NULL, leased_by = NULL
 WHERE id = %(id)s AND attempt = %(attempt)s AND state = 'running' AND leased_by = %(worker)s
RETURNING id;

-- _lock_keys
SELECT count(pg_advisory_xact_lock(hashtext('miniqueue-signals:' || %(schema)s), bucket))
  FROM (SELECT DISTINCT hashtext(key) & 255 AS bucket FROM unnest(%(keys)s::text[]) AS k(key) ORDER BY 1) buckets;

-- _wait
WITH held AS (
    SELECT id FROM "public"."miniqueue_jobs"
     WHERE id = %(id)s AND attempt = %(attempt)s AND state = 'running' AND leased_by = %(worker)s
       FOR UPDATE
), mail AS (
    DELETE FROM "public"."miniqueue_signals"
     WHERE id = (SELECT id FROM "public"."miniqueue_signals" WHERE key = %(key)s ORDER BY id LIMIT 1) AND EXISTS (SELECT 1 FROM held)
    RETURNING data
), waited AS (
UPDATE "public"."miniqueue_jobs" j
   SET steps = (CASE WHEN (j.steps -> -1) ? 'waiting' THEN j.steps - (-1) ELSE coalesce(j.steps, '[]') END)
               || jsonb_build_array(jsonb_build_object('name', %(name)s::text, 'kind', 'signal', 'key', %(key)s::text,
                                                       'attempt', j.attempt, 'at', now())
                                    || CASE WHEN m.data IS NULL THEN jsonb_build_object('waiting', true)
                                            ELSE jsonb_build_object('value', m.data) END),
       state = CASE WHEN m.data IS NULL THEN 'waiting' ELSE j.state END,
       signal_key = CASE WHEN m.data IS NULL THEN %(key)s::text END,
       signal_timeout_at = CASE WHEN m.data IS NULL THEN now() + make_interval(secs => %(timeout)s::float8) END,
       max_attempts = CASE WHEN m.data IS NULL THEN j.max_attempts + 1 ELSE j.max_attempts END,
       lease_expires_at = CASE WHEN m.data IS NULL THEN NULL ELSE j.lease_expires_at END,
       leased_by = CASE WHEN m.data IS NULL THEN NULL ELSE j.leased_by END
  FROM held LEFT JOIN mail m ON true
 WHERE j.id = held.id
RETURNING j.state, m.data
)
SELECT state, data FROM waited;

-- _signal
WITH sent AS (
    SELECT s.key, s.data::jsonb AS data, s.n, row_number() OVER (PARTITION BY s.key ORDER BY s.n) AS turn
      FROM unnest(%(keys)s::text[], %(data)s::text[]) WITH ORDINALITY AS s(key, data, n)
), parked AS (
    SELECT id, signal_key FROM "public"."miniqueue_jobs"
     WHERE state = 'waiting' AND signal_key = ANY(%(keys)s::text[])
       FOR UPDATE
), ranked AS (
    SELECT id, signal_key AS key, row_number() OVER (PARTITION BY signal_key ORDER BY id) AS turn FROM parked
), delivered AS (
UPDATE "public"."miniqueue_jobs" j
   SET state = 'available', signal_key = NULL, signal_timeout_at = NULL, scheduled_at = now(),
       steps = (j.steps - (-1)) || jsonb_build_array(((j.steps -> -1) - 'waiting')
                                                     || jsonb_build_object('value', s.data, 'delivered_at', now()))
  FROM ranked r JOIN sent s ON s.key = r.key AND s.turn = r.turn
 WHERE j.id = r.id AND j.state = 'waiting'
RETURNING j.id, s.n, pg_notify('miniqueue_public', j.queue)
), kept AS (
INSERT INTO "public"."miniqueue_signals" (key, data)
SELECT key, data FROM sent s WHERE NOT EXISTS (SELECT 1 FROM ranked r WHERE r.key = s.key AND r.turn = s.turn)
 ORDER BY n
RETURNING 1)
SELECT d.id FROM sent s LEFT JOIN delivered d ON d.n = s.n
 WHERE (SELECT count(*) FROM kept) >= 0
 ORDER BY s.n;

-- _time_out_waits
UPDATE "public"."miniqueue_jobs" j
   SET state = 'available', signal_key = NULL, signal_timeout_at = NULL, scheduled_at = now(),
       steps = (j.steps - (-1)) || jsonb_build_array(((j.steps -> -1) - 'waiting')
                                                     || jsonb_build_object('timed_out', true, 'delivered_at', now()))
 WHERE j.id = ANY(ARRAY(
        SELECT id FROM "public"."miniqueue_jobs"
         WHERE state = 'waiting' AND signal_timeout_at IS NOT NULL AND signal_timeout_at <= now()
         ORDER BY signal_timeout_at
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
   AND j.state = 'waiting' AND j.signal_timeout_at <= now()
RETURNING j.id, pg_notify('miniqueue_public', j.queue);

-- _kept
SELECT key, count(*), min(sent_at) FROM "public"."miniqueue_signals"
 WHERE %(key)s::text IS NULL OR key = %(key)s
 GROUP BY key ORDER BY min(sent_at);

-- _recover
WITH recovered AS (
UPDATE "public"."miniqueue_jobs"
   SET state = CASE WHEN attempt >= max_attempts THEN 'dead' ELSE 'available' END,
       scheduled_at = CASE WHEN attempt >= max_attempts THEN scheduled_at
                           ELSE now() + make_interval(secs => "public"."miniqueue_retry_delay"(task => task, attempt => attempt_budget - (max_attempts - attempt),
                               default_base => %(base)s, default_cap => %(cap)s)) END,
       finished_at = CASE WHEN attempt >= max_attempts THEN now() END,
       last_error = format('worker lost: %%s stopped renewing its lease on attempt %%s of %%s',
                           leased_by, attempt_budget - (max_attempts - attempt), attempt_budget),
       errors = errors || jsonb_build_array(jsonb_build_object(
       'attempt', attempt, 'started', started_at, 'at', now(), 'worker', leased_by, 'error', 'worker lost: lease expired without renewal')), lease_expires_at = NULL, leased_by = NULL
 WHERE id = ANY(ARRAY(
        SELECT id FROM "public"."miniqueue_jobs"
         WHERE state = 'running' AND lease_expires_at < now()
         ORDER BY lease_expires_at
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
   AND state = 'running' AND lease_expires_at < now()
RETURNING id, queue, state, dependents, awaited, sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, date_trunc('hour', now(), 'UTC'), count(*) FROM recovered
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
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
       'attempt', attempt, 'started', started_at, 'at', now(), 'worker', leased_by, 'error', format('expired: not started by its deadline, %%s', expires_at)))
 WHERE id = ANY(ARRAY(
        SELECT id FROM "public"."miniqueue_jobs"
         WHERE expires_at <= now() AND expires_at IS NOT NULL AND state IN ('available', 'waiting')
           AND signal_key IS NULL
         ORDER BY expires_at
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
   AND state IN ('available', 'waiting') AND expires_at <= now() AND signal_key IS NULL
RETURNING id, queue, state, dependents, awaited, sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, date_trunc('hour', now(), 'UTC'), count(*) FROM expired
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
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

-- _drop_ended_pauses
DELETE FROM "public"."miniqueue_pauses"
 WHERE key = ANY(ARRAY(SELECT key FROM "public"."miniqueue_pauses" WHERE paused_until < now() LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
   AND paused_until < now();

-- _recount[0]
LOCK TABLE "public"."miniqueue_counts" IN EXCLUSIVE MODE;

-- _recount[1]
DELETE FROM "public"."miniqueue_counts";

-- _recount[2]
INSERT INTO "public"."miniqueue_counts" (queue, state, shard, bucket, count)
SELECT queue, state, 0, date_trunc('hour', finished_at, 'UTC'), count(*) FROM "public"."miniqueue_jobs"
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state, date_trunc('hour', finished_at, 'UTC');

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
    RETURNING id, queue, state, finished_at, idempotency_key
), unkeyed AS (
    DELETE FROM "public"."miniqueue_idempotency_keys" k USING pruned gone WHERE k.key = gone.idempotency_key AND k.job_id = gone.id
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, date_trunc('hour', finished_at, 'UTC'), -count(*) FROM pruned
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state, date_trunc('hour', finished_at, 'UTC')
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
RETURNING 1)
SELECT count(*) FROM pruned;

-- _prune_defaults
WITH pruned AS (
    DELETE FROM "public"."miniqueue_jobs"
     WHERE id = ANY(ARRAY(SELECT id FROM "public"."miniqueue_jobs_done_default"
                           WHERE state = ANY(%(states)s::text[])
                             AND finished_at < now() - make_interval(secs => %(age)s)
                           LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
                    || ARRAY(SELECT id FROM "public"."miniqueue_jobs_failed_default"
                           WHERE state = ANY(%(states)s::text[])
                             AND finished_at < now() - make_interval(secs => %(age)s)
                           LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
       AND state IN ('completed', 'failed', 'dead', 'cancelled', 'expired') AND state = ANY(%(states)s::text[])
    RETURNING id, queue, state, finished_at, idempotency_key
), unkeyed AS (
    DELETE FROM "public"."miniqueue_idempotency_keys" k USING pruned gone WHERE k.key = gone.idempotency_key AND k.job_id = gone.id
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, date_trunc('hour', finished_at, 'UTC'), -count(*) FROM pruned
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state, date_trunc('hour', finished_at, 'UTC')
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
RETURNING 1)
SELECT count(*) FROM pruned;

-- _jobs_churn
SELECT pg_stat_get_live_tuples(c.oid) AS live, pg_stat_get_tuples_inserted(c.oid) AS inserted,
       pg_stat_get_tuples_updated(c.oid) + pg_stat_get_tuples_deleted(c.oid) AS updated,
       pg_stat_get_mod_since_analyze(c.oid) AS changed,
       greatest(pg_stat_get_last_vacuum_time(c.oid), pg_stat_get_last_autovacuum_time(c.oid)) AS last_vacuum,
       greatest(pg_stat_get_last_analyze_time(c.oid), pg_stat_get_last_autoanalyze_time(c.oid)) AS last_analyze,
       pg_has_role(c.relowner, 'USAGE') AS may_maintain
  FROM pg_class c
 WHERE c.oid = %(table)s::regclass;

-- _vacuum_jobs
VACUUM (SKIP_LOCKED, ANALYZE) "public"."miniqueue_jobs_live";

-- _analyze_jobs
ANALYZE (SKIP_LOCKED) "public"."miniqueue_jobs_live";

-- _requeue
WITH picked AS (
    SELECT id, queue, state, finished_at FROM "public"."miniqueue_jobs"
     WHERE state = ANY(%(states)s::text[])
       AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
       AND (%(queue)s::text IS NULL OR queue = %(queue)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       FOR UPDATE
), requeued AS (
    UPDATE "public"."miniqueue_jobs" j
       SET state = CASE WHEN j.sequence_key IS NULL THEN 'available' ELSE 'waiting' END, scheduled_at = now(),
           max_attempts = j.attempt + j.attempt_budget,
           finished_at = NULL, completed_at = NULL, lease_expires_at = NULL, leased_by = NULL,
           errors = j.errors || jsonb_build_array(jsonb_build_object(
               'attempt', j.attempt, 'at', now(), 'worker', NULL, 'error', format('requeued: it was %%s', p.state),
               'charged', false, 'requeued', p.state, 'finished', p.finished_at))
      FROM picked p WHERE j.id = p.id
    RETURNING j.id, p.queue, p.state, p.finished_at, j.sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, date_trunc('hour', finished_at, 'UTC'), -count(*) FROM requeued
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state, date_trunc('hour', finished_at, 'UTC')
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
RETURNING 1), advanced AS (
SELECT "public"."miniqueue_sequence_advance"(ARRAY(SELECT DISTINCT sequence_key FROM requeued WHERE sequence_key IS NOT NULL), 'miniqueue_public')
 WHERE EXISTS (SELECT 1 FROM requeued WHERE sequence_key IS NOT NULL))
SELECT id FROM requeued WHERE (SELECT count(*) FROM advanced) >= 0;

-- _cancel
WITH cancelled AS (
UPDATE "public"."miniqueue_jobs"
   SET state = 'cancelled', finished_at = now(), lease_expires_at = NULL, leased_by = NULL, pending_parents = 0,
       signal_key = NULL, signal_timeout_at = NULL
 WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('available', 'running', 'waiting')
RETURNING id, queue, state, dependents, awaited, sequence_key
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, date_trunc('hour', now(), 'UTC'), count(*) FROM cancelled
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
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
    RETURNING id, queue, state, finished_at, dependents, awaited, sequence_key, idempotency_key
), unkeyed AS (
    DELETE FROM "public"."miniqueue_idempotency_keys" k USING deleted gone WHERE k.key = gone.idempotency_key AND k.job_id = gone.id
), counted AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, date_trunc('hour', finished_at, 'UTC'), -count(*) FROM deleted
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired')
 GROUP BY queue, state, date_trunc('hour', finished_at, 'UTC')
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
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
       dependents, pending_parents, attempt_budget, unique_key, unique_while_running, sequence_key, expires_at,
       steps, signal_key, signal_timeout_at, started_at, aged_from
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
       dependents, pending_parents, attempt_budget, unique_key, unique_while_running, sequence_key, expires_at,
       steps, signal_key, signal_timeout_at, started_at, aged_from
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
   AND (%(due)s::bool IS NULL OR (scheduled_at <= now()) = %(due)s)
   AND (%(search)s::text IS NULL OR strpos(payload::text, %(search)s) > 0)
   AND (%(after)s::timestamptz IS NULL OR created_at >= %(after)s)
   AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s);

-- _ids_matching
SELECT id FROM "public"."miniqueue_jobs" WHERE (%(state)s::text IS NULL OR state = %(state)s)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task = %(task)s)
   AND (%(due)s::bool IS NULL OR (scheduled_at <= now()) = %(due)s)
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
    SELECT queue, count(*) AS waiting, count(*) FILTER (WHERE signal_key IS NOT NULL) AS signal_waits
      FROM "public"."miniqueue_jobs" WHERE state = 'waiting' GROUP BY queue
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
       coalesce(scheduled, 0) AS scheduled, oldest_available_seconds, coalesce(expired_leases, 0) AS expired_leases,
       coalesce(signal_waits, 0) AS signal_waits
  FROM ready FULL JOIN blocked USING (queue) FULL JOIN leased USING (queue) FULL JOIN finished USING (queue)
 WHERE coalesce(available, 0) + coalesce(running, 0) + coalesce(completed, 0) + coalesce(failed, 0)
       + coalesce(dead, 0) + coalesce(cancelled, 0) + coalesce(waiting, 0) + coalesce(expired, 0) > 0
 ORDER BY queue;

-- _parent_results
SELECT p.id, p.state, p.result, p.last_error
  FROM unnest(%(ids)s::bigint[]) WITH ORDINALITY AS u(id, ord) JOIN "public"."miniqueue_jobs" p ON p.id = u.id
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
    UNION ALL
    SELECT scope, 0 FROM "public"."miniqueue_limits" WHERE paused_until > now()
), scopes AS (
    SELECT scope, sum(waiting)::bigint AS waiting FROM waiting GROUP BY scope
)
SELECT w.scope, w.waiting, l.max_running, l.rate, least(cardinality(h.holders), l.max_running) AS held,
       least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) AS tokens,
       h.holders, CASE WHEN l.paused_until > now() THEN l.paused_until END,
       CASE WHEN l.paused_until > now() THEN l.paused_by END
  FROM scopes w LEFT JOIN "public"."miniqueue_limits" l USING (scope)
 CROSS JOIN LATERAL (
       SELECT ARRAY(SELECT h.id FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                      JOIN "public"."miniqueue_jobs" j ON j.id = h.id AND j.state = 'running' AND j.attempt = h.attempt
                     ORDER BY h.id) AS holders) h
 WHERE w.waiting > 0 OR cardinality(h.holders) > 0 OR l.paused_until > now()
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
                          backoff_cap, keys, rate_cost)
SELECT task, queue, priority, max_attempts, concurrency_key, concurrency_computed, max_concurrent, rate_limit,
       rate_limit_key, rate_computed, backoff_base, backoff_cap, keys::jsonb, rate_cost
  FROM unnest(%(tasks)s::text[], %(queues)s::text[], %(priorities)s::smallint[], %(max_attempts)s::int[],
              %(concurrency_keys)s::text[], %(concurrency_computed)s::boolean[], %(max_concurrent)s::int[],
              %(rate_limits)s::text[], %(rate_limit_keys)s::text[], %(rate_computed)s::boolean[],
              %(backoff_bases)s::float8[], %(backoff_caps)s::float8[], %(keys)s::text[], %(rate_costs)s::int[])
       AS d(task, queue, priority, max_attempts, concurrency_key, concurrency_computed, max_concurrent, rate_limit,
            rate_limit_key, rate_computed, backoff_base, backoff_cap, keys, rate_cost)
 ORDER BY 1
ON CONFLICT (task) DO UPDATE
   SET queue = excluded.queue, priority = excluded.priority, max_attempts = excluded.max_attempts,
       concurrency_key = excluded.concurrency_key, concurrency_key_computed = excluded.concurrency_key_computed,
       max_concurrent = excluded.max_concurrent, rate_limit = excluded.rate_limit,
       rate_limit_key = excluded.rate_limit_key, rate_limit_key_computed = excluded.rate_limit_key_computed,
       backoff_base = excluded.backoff_base, backoff_cap = excluded.backoff_cap, keys = excluded.keys,
       rate_cost = excluded.rate_cost, published_at = now()
 WHERE (t.queue, t.priority, t.max_attempts, t.concurrency_key, t.concurrency_key_computed, t.max_concurrent,
        t.rate_limit, t.rate_limit_key, t.rate_limit_key_computed, t.backoff_base, t.backoff_cap, t.keys,
        t.rate_cost)
       IS DISTINCT FROM
       (excluded.queue, excluded.priority, excluded.max_attempts, excluded.concurrency_key,
        excluded.concurrency_key_computed, excluded.max_concurrent, excluded.rate_limit, excluded.rate_limit_key,
        excluded.rate_limit_key_computed, excluded.backoff_base, excluded.backoff_cap, excluded.keys,
        excluded.rate_cost);

-- _serve_queues
INSERT INTO "public"."miniqueue_served_queues" (queue) SELECT q FROM unnest(%(queues)s::text[]) AS q ORDER BY q
ON CONFLICT (queue) DO UPDATE SET served_at = now();

-- _task_declarations
SELECT task, queue, priority, max_attempts, concurrency_key, concurrency_key_computed, max_concurrent, rate_limit,
       rate_limit_key, rate_limit_key_computed, backoff_base, backoff_cap, keys, rate_cost
  FROM "public"."miniqueue_tasks";

-- _unserved_queues
SELECT q FROM unnest(%(queues)s::text[]) AS q WHERE NOT EXISTS (SELECT 1 FROM "public"."miniqueue_served_queues" s WHERE s.queue = q);

-- _unrun_tasks
SELECT q.name, h.task
  FROM unnest(%(queues)s::text[]) AS q(name)
 CROSS JOIN LATERAL (
       SELECT task FROM "public"."miniqueue_jobs"
        WHERE state = 'available' AND limits IS NULL AND queue = q.name AND scheduled_at <= now()
        ORDER BY priority DESC, coalesce(rank_at, scheduled_at), id LIMIT 1) h
 CROSS JOIN LATERAL (
       SELECT count(*) AS workers, coalesce(bool_or(p.tasks IS NULL OR h.task = ANY(p.tasks)), false) AS runs
         FROM "public"."miniqueue_processes" p
        WHERE p.kind = 'worker' AND q.name = ANY(p.queues) AND p.last_seen > now() - interval '30 seconds') w
 WHERE w.workers > 0 AND NOT w.runs;

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

-- _schedules
SELECT s.name, s.cron, s.task, s.payload, s.timezone, s.catch_up, s.grace,
       coalesce(p.enabled, true) AS enabled, p.last_slot, s.created_at, s.updated_at
  FROM "public".miniqueue_schedules s LEFT JOIN "public"."miniqueue_periodic" p USING (name)
 ORDER BY s.name;

-- _schedule
SELECT s.name, s.cron, s.task, s.payload, s.timezone, s.catch_up, s.grace,
       coalesce(p.enabled, true) AS enabled, p.last_slot, s.created_at, s.updated_at
  FROM "public".miniqueue_schedules s LEFT JOIN "public"."miniqueue_periodic" p USING (name)
 WHERE s.name = %(name)s;

-- _create_schedule
WITH taken AS (
    INSERT INTO "public"."miniqueue_periodic" (name, last_slot, enabled) VALUES (%(name)s, now(), %(enabled)s)
    ON CONFLICT (name) DO NOTHING
    RETURNING name
)
INSERT INTO "public".miniqueue_schedules (name, cron, task, payload, timezone, catch_up, grace)
SELECT name, %(cron)s, %(task)s, %(payload)s, %(timezone)s, %(catch_up)s, %(grace)s FROM taken
RETURNING name;

-- _lock_schedule
SELECT cron, task, payload, timezone, catch_up, grace FROM "public".miniqueue_schedules
 WHERE name = %(name)s
   FOR UPDATE;

-- _change_schedule
UPDATE "public".miniqueue_schedules
   SET cron = %(cron)s, payload = %(payload)s, timezone = %(timezone)s, updated_at = clock_timestamp()
 WHERE name = %(name)s;

-- _delete_schedule
WITH gone AS (
    DELETE FROM "public".miniqueue_schedules WHERE name = %(name)s RETURNING name
), state AS (
    DELETE FROM "public"."miniqueue_periodic" WHERE name IN (SELECT name FROM gone)
)
SELECT name FROM gone;

-- _claim_stored_slot
INSERT INTO "public"."miniqueue_periodic" (name, last_slot)
SELECT name, %(slot)s FROM "public".miniqueue_schedules WHERE name = %(name)s AND updated_at = %(revision)s
ON CONFLICT (name) DO UPDATE SET last_slot = excluded.last_slot, updated_at = now()
 WHERE "public"."miniqueue_periodic".last_slot < excluded.last_slot AND "public"."miniqueue_periodic".enabled
RETURNING name;

-- _upsert_processes
WITH incoming AS (
    SELECT * FROM unnest(%(ids)s::text[], %(kinds)s::text[], %(pids)s::int[], %(titles)s::text[],
                         %(started)s::timestamptz[], %(rss)s::bigint[], %(done)s::bigint[], %(restarts)s::int[],
                         %(current)s::text[], %(queues)s::text[], %(tasks)s::text[], %(rates)s::float8[])
           AS i(id, kind, pid, title, started_at, rss_bytes, jobs_done, restarts, current_jobs, queues, tasks,
                jobs_per_second)
), gone AS (
    DELETE FROM "public"."miniqueue_processes" WHERE supervisor = %(supervisor)s AND id <> ALL(%(ids)s::text[])
)
INSERT INTO "public"."miniqueue_processes" AS p (id, supervisor, kind, host, pid, title, started_at, last_seen, rss_bytes, jobs_done,
                              restarts, current_jobs, queues, tasks, jobs_per_second)
SELECT id, %(supervisor)s, kind, %(host)s, pid, title, started_at, now(), rss_bytes, jobs_done, restarts,
       current_jobs::bigint[], string_to_array(queues, ' '), string_to_array(tasks, ' '), jobs_per_second
  FROM incoming
ON CONFLICT (id) DO UPDATE SET title = excluded.title, last_seen = now(), rss_bytes = excluded.rss_bytes,
    jobs_done = excluded.jobs_done, restarts = excluded.restarts, current_jobs = excluded.current_jobs,
    queues = excluded.queues, tasks = excluded.tasks, jobs_per_second = excluded.jobs_per_second;

-- _delete_processes
DELETE FROM "public"."miniqueue_processes" WHERE supervisor = %(supervisor)s;

-- _processes
SELECT id, supervisor, kind, host, pid, title, started_at, last_seen, rss_bytes, jobs_done, restarts, current_jobs,
       queues, tasks, jobs_per_second
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

-- _missing
SELECT c.class, s AS starts_at, s + make_interval(hours => c.hours) AS ends_at
  FROM (VALUES ('done', 1, 'hour', %(back_done)s::float8), ('failed', 24, 'day', %(back_failed)s::float8))
       AS c(class, hours, unit, back),
       generate_series(date_trunc(c.unit, now() - make_interval(secs => c.back), 'UTC'),
                       date_trunc(c.unit, now(), 'UTC') + make_interval(hours => c.hours * %(ahead)s),
                       make_interval(hours => c.hours)) AS s
 WHERE NOT EXISTS (SELECT 1 FROM "public"."miniqueue_history_partitions" p WHERE p.class = c.class AND p.starts_at = s)
 ORDER BY 1, 2;

-- _forget_expired
DELETE FROM "public"."miniqueue_history_partitions" p
 WHERE class = %(class)s AND ends_at <= now() - make_interval(secs => %(age)s)
RETURNING name, starts_at, ends_at,
          (SELECT i.inhrelid::int8 FROM pg_inherits i
            WHERE i.inhrelid = to_regclass(quote_ident(%(schema)s) || '.' || quote_ident(p.name)));

-- _unkey
DELETE FROM "public"."miniqueue_idempotency_keys" k USING "public"."miniqueue_jobs" p
 WHERE p.state = ANY(%(states)s::text[]) AND p.finished_at >= %(starts)s AND p.finished_at < %(ends)s
   AND p.tableoid::int8 = ANY(%(partitions)s::int8[])
   AND p.idempotency_key IS NOT NULL AND k.key = p.idempotency_key AND k.job_id = p.id;

-- _record
INSERT INTO "public"."miniqueue_history_partitions" (name, class, starts_at, ends_at) VALUES (%(name)s, %(class)s, %(starts)s, %(ends)s)
ON CONFLICT (name) DO NOTHING;

-- _expired
SELECT name, starts_at, ends_at FROM "public"."miniqueue_history_partitions"
 WHERE class = %(class)s AND ends_at <= now() - make_interval(secs => %(age)s)
 ORDER BY starts_at;

-- _uncount
DELETE FROM "public"."miniqueue_counts" c USING unnest(%(starts)s::timestamptz[], %(ends)s::timestamptz[]) AS r(starts, ends)
 WHERE c.state = ANY(%(states)s::text[]) AND c.bucket >= r.starts AND c.bucket < r.ends;

-- _partitions
SELECT p.name, p.class, p.starts_at, p.ends_at, greatest(c.reltuples, 0)::bigint, pg_total_relation_size(c.oid)
  FROM "public"."miniqueue_history_partitions" p
  JOIN pg_class c ON c.oid = to_regclass(quote_ident(%(schema)s) || '.' || quote_ident(p.name))
 ORDER BY p.class, p.starts_at;

-- _move_legacy
WITH moved AS (
    DELETE FROM "public"."miniqueue_jobs_legacy"
     WHERE id = ANY(ARRAY(SELECT id FROM "public"."miniqueue_jobs_legacy" ORDER BY id LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
    RETURNING *
), placed AS (
    INSERT INTO "public"."miniqueue_jobs" SELECT * FROM moved RETURNING queue, state, finished_at
), rebucketed AS (
INSERT INTO "public"."miniqueue_counts" AS c (queue, state, shard, bucket, count)
SELECT queue, state, pg_backend_pid() %% 64, bucket, sum(n) FROM (
    SELECT queue, state, date_trunc('hour', finished_at, 'UTC') AS bucket, count(*) AS n FROM placed
     WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired') GROUP BY 1, 2, 3
    UNION ALL
    SELECT queue, state, '-infinity', -count(*) FROM placed
     WHERE state IN ('completed', 'failed', 'dead', 'cancelled', 'expired') GROUP BY 1, 2
) m GROUP BY queue, state, bucket
ON CONFLICT (queue, state, shard, bucket) DO UPDATE SET count = c.count + excluded.count
RETURNING 1)
SELECT count(*) FROM placed WHERE (SELECT count(*) FROM rebucketed) >= 0;

-- _legacy_age
SELECT extract(epoch FROM now() - min(finished_at))::float8 FROM "public"."miniqueue_jobs_legacy";

-- _drop_legacy
DROP TABLE IF EXISTS "public"."miniqueue_jobs_legacy";

-- _shard
SELECT name, idx FROM "public"."miniqueue_shard";

-- _old_ids
SELECT EXISTS (SELECT 1 FROM "public"."miniqueue_jobs" WHERE id < %(base)s);

-- _next_id
SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM "public"."miniqueue_jobs_id_seq";

-- _join
INSERT INTO "public"."miniqueue_shard" (name, idx) VALUES (%(name)s, %(index)s);

-- _why_job
SELECT j.id, j.queue, j.task, j.state, j.priority, j.attempt, j.max_attempts, j.attempt_budget, j.scheduled_at,
       j.created_at, j.completed_at, j.finished_at, j.lease_expires_at, j.leased_by, j.last_error, j.limits,
       j.parents, j.pending_parents, j.run_when, j.sequence_key, j.signal_key, j.signal_timeout_at, j.expires_at,
       j.steps -> -1 AS last_step, j.errors -> -1 AS last_failure,
       coalesce(q.paused, false) AS paused, q.updated_at AS settings_changed_at, q.max_running AS queue_cap,
       s.served_at, now() AS now, j.fair_key, coalesce(j.rank_at, j.scheduled_at) AS turn
  FROM "public"."miniqueue_jobs" j
  LEFT JOIN "public"."miniqueue_queues" q ON q.name = j.queue
  LEFT JOIN "public"."miniqueue_served_queues" s ON s.queue = j.queue
 WHERE j.id = %(id)s;

-- _why_workers
SELECT count(*) FILTER (WHERE kind = 'worker' AND last_seen > now() - make_interval(secs => %(live)s)) AS live_workers,
       count(*) FILTER (WHERE kind = 'worker' AND last_seen > now() - make_interval(secs => %(live)s)
                          AND queues IS NOT NULL) AS reporting_workers,
       count(*) FILTER (WHERE kind = 'worker' AND last_seen > now() - make_interval(secs => %(live)s)
                          AND %(queue)s = ANY(queues)) AS queue_workers,
       (SELECT array_agg(DISTINCT t ORDER BY t) FROM "public"."miniqueue_processes" p, unnest(p.tasks) AS t
         WHERE p.kind = 'worker' AND p.last_seen > now() - make_interval(secs => %(live)s)
           AND %(queue)s = ANY(p.queues)) AS queue_tasks,
       max(last_seen) FILTER (WHERE kind = 'worker') AS worker_seen_at,
       count(*) FILTER (WHERE kind = 'reaper' AND last_seen > now() - make_interval(secs => %(live)s)) AS live_reapers,
       max(last_seen) FILTER (WHERE kind = 'reaper') AS reaper_seen_at,
       max(last_seen) FILTER (WHERE id = %(holder)s::text) AS holder_seen_at,
       (SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name IN ('miniqueue:worker', 'miniqueue:listen'))
           AS worker_connections,
       (SELECT max(lease_expires_at) FROM "public"."miniqueue_jobs"
         WHERE state = 'running' AND lease_expires_at > now() AND queue = %(queue)s) AS queue_lease_until
  FROM "public"."miniqueue_processes";

-- _why_limits
SELECT l.scope, l.max_running, l.rate, t.tokens,
       CASE WHEN t.tokens < 1 THEN now() + make_interval(secs => (1 - t.tokens) / l.rate) END AS next_token_at,
       h.holders
  FROM "public"."miniqueue_limits" l
 CROSS JOIN LATERAL (
       SELECT least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) AS tokens) t
 CROSS JOIN LATERAL (
       SELECT ARRAY(SELECT h.id FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                      JOIN "public"."miniqueue_jobs" j ON j.id = h.id AND j.state = 'running' AND j.attempt = h.attempt
                     ORDER BY h.id) AS holders) h
 WHERE l.scope = ANY(%(scopes)s::text[])
 ORDER BY l.scope;

-- _why_parents
SELECT p.id, p.state, p.task
  FROM unnest(%(ids)s::bigint[]) WITH ORDINALITY AS u(id, ord)
  JOIN "public"."miniqueue_jobs" p ON p.id = u.id AND p.state IN ('waiting', 'available', 'running')
 ORDER BY u.ord
 LIMIT %(limit)s;

-- _why_sequence
SELECT s.head, h.state AS head_state, h.task AS head_task, h.last_error AS head_error,
       h.scheduled_at AS head_scheduled_at, s.on_failure,
       (SELECT count(*) FROM (SELECT 1 FROM "public"."miniqueue_jobs" w
                               WHERE w.sequence_key = s.key AND w.state = 'waiting' AND w.signal_key IS NULL
                                 AND w.id < %(id)s
                               LIMIT %(cap)s) a) AS ahead
  FROM "public"."miniqueue_sequences" s LEFT JOIN "public"."miniqueue_jobs" h ON h.id = s.head
 WHERE s.key = %(key)s;

-- _why_ahead
SELECT count(*) FROM (
    (SELECT 1 FROM "public"."miniqueue_jobs" j
      WHERE j.state = 'available' AND j.limits IS NULL AND j.queue = %(queue)s AND j.priority > %(priority)s
        AND j.scheduled_at <= now()
      LIMIT %(cap)s)
    UNION ALL
    (SELECT 1 FROM "public"."miniqueue_jobs" j
      WHERE j.state = 'available' AND j.limits IS NULL AND j.queue = %(queue)s AND j.priority = %(priority)s
        AND j.scheduled_at <= now()
        AND (coalesce(j.rank_at, j.scheduled_at), j.id) < (%(turn)s::timestamptz, %(id)s::bigint)
      LIMIT %(cap)s)
    UNION ALL
    (SELECT 1 FROM "public"."miniqueue_jobs" j
      WHERE j.state = 'available' AND j.limits IS NOT NULL AND j.queue = %(queue)s AND j.priority > %(priority)s
        AND j.scheduled_at <= now()
      LIMIT %(cap)s)
    UNION ALL
    (SELECT 1 FROM "public"."miniqueue_jobs" j
      WHERE j.state = 'available' AND j.limits IS NOT NULL AND j.queue = %(queue)s AND j.priority = %(priority)s
        AND j.scheduled_at <= %(scheduled_at)s
        AND (j.scheduled_at, j.id) < (%(scheduled_at)s::timestamptz, %(id)s::bigint)
      LIMIT %(cap)s)
) a;

-- _why_keys_ahead
SELECT count(DISTINCT a.fair_key) FROM (
    SELECT j.fair_key FROM "public"."miniqueue_jobs" j
     WHERE j.state = 'available' AND j.limits IS NULL AND j.queue = %(queue)s AND j.scheduled_at <= now()
       AND j.fair_key IS DISTINCT FROM %(key)s
       AND (j.priority > %(priority)s
            OR j.priority = %(priority)s
               AND (coalesce(j.rank_at, j.scheduled_at), j.id) < (%(turn)s::timestamptz, %(id)s::bigint))
     ORDER BY j.priority DESC, coalesce(j.rank_at, j.scheduled_at), j.id
     LIMIT %(cap)s) a;

-- _backlog
SELECT due, walked, oldest_seconds, running FROM "public"."miniqueue_backlog"(%(queues)s::text[]);

-- _desired_workers
SELECT "public"."miniqueue_desired_workers"(%(queues)s::text[], %(target)s::float8, %(max_workers)s::int);

-- _aging_queues
WITH RECURSIVE aging AS (
    SELECT name FROM "public"."miniqueue_queues" WHERE age_after IS NOT NULL
), groups(queue, limits, priority) AS (
    SELECT a.name, f.limits, f.priority
      FROM aging a
     CROSS JOIN LATERAL (SELECT limits, priority FROM "public"."miniqueue_jobs"
                          WHERE state = 'available' AND limits IS NOT NULL AND queue = a.name
                          ORDER BY limits, priority DESC LIMIT 1) f
     WHERE %(limited)s
    UNION ALL
    SELECT g.queue, n.limits, n.priority
      FROM groups g
     CROSS JOIN LATERAL (SELECT limits, priority FROM "public"."miniqueue_jobs"
                          WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits > g.limits
                          ORDER BY limits, priority DESC LIMIT 1) n
)
SELECT a.name,
       (SELECT priority FROM "public"."miniqueue_jobs" WHERE state = 'available' AND limits IS NULL AND queue = a.name
         ORDER BY priority DESC LIMIT 1),
       (SELECT max(g.priority) FROM groups g WHERE g.queue = a.name)
  FROM aging a
 ORDER BY a.name;

-- _age_jobs
WITH setting AS (
    SELECT age_after, now() - make_interval(secs => age_after) AS due_before
      FROM "public"."miniqueue_queues" WHERE name = %(queue)s AND age_after IS NOT NULL
), seen AS (
    SELECT s.*, least(%(top)s::int, s.enqueued_priority
                      + floor(extract(epoch FROM now() - s.scheduled_at) / (SELECT age_after FROM setting)))::smallint
                AS raised
      FROM (
        (SELECT 1 AS part, id, limits, priority, coalesce(rank_at, scheduled_at) AS at, scheduled_at,
                coalesce(aged_from, priority) AS enqueued_priority
           FROM "public"."miniqueue_jobs"
          WHERE state = 'available' AND queue = %(queue)s AND priority < %(top)s::int
            AND scheduled_at <= (SELECT due_before FROM setting) AND limits IS NULL AND %(limits)s::text[] IS NULL
            AND priority = %(priority)s::int
            AND (coalesce(rank_at, scheduled_at), id) > (%(at)s::timestamptz, %(id)s::bigint)
          ORDER BY coalesce(rank_at, scheduled_at), id LIMIT %(limit)s)
        UNION ALL
        (SELECT 2, id, limits, priority, coalesce(rank_at, scheduled_at), scheduled_at, coalesce(aged_from, priority)
           FROM "public"."miniqueue_jobs"
          WHERE state = 'available' AND queue = %(queue)s AND priority < %(top)s::int
            AND scheduled_at <= (SELECT due_before FROM setting) AND limits IS NULL AND %(limits)s::text[] IS NULL
            AND priority < %(priority)s::int
          ORDER BY priority DESC, coalesce(rank_at, scheduled_at), id LIMIT %(limit)s)
        UNION ALL
        (SELECT 3, id, limits, priority, scheduled_at, scheduled_at, coalesce(aged_from, priority)
           FROM "public"."miniqueue_jobs"
          WHERE state = 'available' AND queue = %(queue)s AND priority < %(top)s::int
            AND scheduled_at <= (SELECT due_before FROM setting) AND limits = %(limits)s::text[]
            AND priority = %(priority)s::int AND (scheduled_at, id) > (%(at)s::timestamptz, %(id)s::bigint)
          ORDER BY scheduled_at, id LIMIT %(limit)s)
        UNION ALL
        (SELECT 4, id, limits, priority, scheduled_at, scheduled_at, coalesce(aged_from, priority)
           FROM "public"."miniqueue_jobs"
          WHERE state = 'available' AND queue = %(queue)s AND priority < %(top)s::int
            AND scheduled_at <= (SELECT due_before FROM setting) AND limits = %(limits)s::text[]
            AND priority < %(priority)s::int
          ORDER BY priority DESC, scheduled_at, id LIMIT %(limit)s)
        UNION ALL
        (SELECT 5, id, limits, priority, scheduled_at, scheduled_at, coalesce(aged_from, priority)
           FROM "public"."miniqueue_jobs"
          WHERE state = 'available' AND queue = %(queue)s AND priority < %(top)s::int
            AND scheduled_at <= (SELECT due_before FROM setting) AND limits > coalesce(%(limits)s::text[], '{}')
          ORDER BY limits, priority DESC, scheduled_at, id LIMIT %(limit)s)
      ) s
     LIMIT %(limit)s
), risen AS (
    SELECT j.id, s.raised
      FROM "public"."miniqueue_jobs" j JOIN seen s ON s.id = j.id
     WHERE s.raised > s.priority
       AND j.state = 'available' AND j.priority = s.priority AND j.scheduled_at = s.scheduled_at
       FOR UPDATE OF j SKIP LOCKED
), raised AS (
    UPDATE "public"."miniqueue_jobs" j
       SET aged_from = coalesce(j.aged_from, j.priority), priority = r.raised
      FROM risen r
     WHERE j.id = r.id AND j.state = 'available' AND j.priority < r.raised
    RETURNING j.id
)
SELECT (SELECT count(*) FROM raised), (SELECT count(*) FROM seen), last.limits, last.priority, last.at, last.id
  FROM (SELECT 1) one
  LEFT JOIN (SELECT limits, priority, at, id FROM seen
              ORDER BY part DESC, limits DESC, priority, at DESC, id DESC LIMIT 1) last ON true;

-- _set_queue_aging
INSERT INTO "public"."miniqueue_queues" (name, age_after) VALUES (%(name)s, %(age_after)s::float8)
ON CONFLICT (name) DO UPDATE SET age_after = excluded.age_after, updated_at = now();

-- _queue_aging
SELECT name, age_after FROM "public"."miniqueue_queues" WHERE age_after IS NOT NULL ORDER BY name;

-- _rank
SELECT "public"."miniqueue_rank_fair"(%(ids)s::bigint[], %(keys)s::text[]);

-- _fair_queues
SELECT name FROM "public"."miniqueue_queues" WHERE fair ORDER BY name;

-- _set_fair
INSERT INTO "public"."miniqueue_queues" (name, fair) VALUES (%(name)s, %(fair)s)
ON CONFLICT (name) DO UPDATE SET fair = excluded.fair, updated_at = now();

-- _unranked
SELECT id, coalesce(substring(limits[1] FROM '^concurrency [^ ]+ (.*)$'), '')
  FROM "public"."miniqueue_jobs_live"
 WHERE state IN ('waiting', 'available') AND queue = %(name)s AND rank_at IS NULL
 ORDER BY id;

-- _set_rule
INSERT INTO "public"."miniqueue_key_rules" (pattern, "like", max_running, weight) VALUES (%(pattern)s, %(like)s, %(max)s, %(weight)s)
ON CONFLICT (pattern) DO UPDATE SET max_running = excluded.max_running, weight = excluded.weight, set_at = now();

-- _remove_rule
DELETE FROM "public"."miniqueue_key_rules" WHERE pattern = %(pattern)s RETURNING "like";

-- _apply_rules
SELECT "public"."miniqueue_apply_key_rules"(%(like)s);

-- _rules
SELECT pattern, max_running, weight FROM "public"."miniqueue_key_rules"
 ORDER BY strpos(pattern, '*') = 0 DESC, length(pattern) DESC, pattern;

-- _shares
SELECT j.queue, j.fair_key, coalesce(k.weight, 1), j.available, j.running,
       (SELECT max_running FROM "public"."miniqueue_key_rule"(j.fair_key))
  FROM (SELECT queue, fair_key, count(*) FILTER (WHERE state = 'available') AS available,
               count(*) FILTER (WHERE state = 'running') AS running
          FROM "public"."miniqueue_jobs_live"
         WHERE state IN ('available', 'running') AND fair_key IS NOT NULL
           AND (%(queue)s::text IS NULL OR queue = %(queue)s)
         GROUP BY queue, fair_key) j
  LEFT JOIN "public"."miniqueue_fair_keys" k ON k.queue = j.queue AND k.key = j.fair_key
 ORDER BY j.queue, j.fair_key
 LIMIT %(limit)s;
