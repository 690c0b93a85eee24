"""The store: every SQL statement miniqueue runs, one method per statement.

Only this module writes SQL. Every value is bound as a parameter; the schema is the one
identifier, quoted once at construction. All times come from the database clock (``now()``).

What a client runs (enqueue, inspection, repair) and the fenced completion are written as
*steps* (``x_steps``: the statements, their parameters, the row mapping and the logic between
them, with no I/O; see :mod:`miniqueue.steps`), so that a sync and an async connection run the
very same code; ``x(conn, ...)`` runs them on a sync connection. What only the worker, reaper
and supervisor run (claims, heartbeats, failures, the registry, migrations) executes on a sync
connection directly.

Worker-side transitions are *fenced*: each is one conditional ``UPDATE`` matching
``id AND state = 'running' AND leased_by = <worker> AND attempt = <attempt claimed>``. A
transition that matches no row raises :class:`~miniqueue.errors.LeaseLost` (or, in the batch
forms, leaves that id out of the result): the worker no longer holds the job.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from psycopg import sql
from psycopg.rows import dict_row

from ..core.backoff import DEFAULT_BASE_SECONDS, DEFAULT_CAP_SECONDS
from ..core.db import FINISHED_CHANNEL, QUEUE_CHANNEL, Connection, check_schema, cursor_for, translate_errors
from ..core.errors import InvalidInput, InvalidTransition, JobNotFound, LeaseLost
from ..core.limits import Scope, queue_scope
from ..core.records import (
    CANCELLABLE_STATES,
    REQUEUEABLE_STATES,
    TERMINAL_STATES,
    AttemptError,
    EnqueueResult,
    JobRecord,
    Lease,
    ProcessInfo,
    QueueCount,
    QueueStats,
    State,
    TaskDeclaration,
)
from ..core.steps import Atomic, CopyIn, Query, Steps, atomic, fetch, run
from ..core.validation import NewJob, check_queue_name, check_seconds

#: The most groups of limited jobs (jobs naming the same limits) one claim takes into admission:
#: as many as the largest prefetch buffer ``auto`` holds. Since a claim keeps the groups of the
#: jobs it completes (see `kept` below), on 2 cores a drain of 50,000 jobs over 5,000 keys ran
#: 7-12% faster taking 1,000 groups per claim than taking 500 (medians of 3 and of 5 runs).
MAX_GROUPS_PER_CLAIM = 1000

# --- SQL --------------------------------------------------------------------------------------
# Each statement is a template composed by psycopg's sql.SQL.format, and only so: {jobs} and the
# other table names become schema-qualified identifiers, and a {part} becomes another template
# (composed the same way). Every value is a bound parameter. tests/sql/store.sql shows the final
# text of every statement.


# The error-history entry every failure appends: which attempt, when, who held it, why.
_APPEND_ERROR = """{table}errors || jsonb_build_array(jsonb_build_object(
       'attempt', {table}attempt, 'at', now(), 'worker', {table}leased_by, 'error', {error}))"""


# Count the finished jobs among the rows a statement changed: one upsert per queue and terminal
# state into this backend's shard of miniqueue_counts (see migration 011), as a CTE of the
# statement that finishes, requeues, prunes or deletes them. {rows} names the CTE whose rows
# (queue, state) are counted; {delta} is count(*) for rows that became finished, -count(*) for
# finished rows that went away.
_COUNT_FINISHED = """
INSERT INTO {counts} AS c (queue, state, shard, count)
SELECT queue, state, pg_backend_pid() %% 64, {delta} FROM {rows}
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled')
 GROUP BY queue, state
ON CONFLICT (queue, state, shard) DO UPDATE SET count = c.count + excluded.count
RETURNING 1"""
# A statement that finishes jobs also counts them in this minute's row of its shard (migration
# 015), for the throughput chart; one that removes finished jobs (prune, requeue, delete) does not.
_COUNT_MINUTE = """
INSERT INTO {finished_minutes} AS m (minute, state, shard, count)
SELECT date_trunc('minute', now()), state, pg_backend_pid() %% 64, count(*) FROM {rows}
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled')
 GROUP BY state
ON CONFLICT (minute, state, shard) DO UPDATE SET count = m.count + excluded.count
RETURNING 1"""
_COUNTED = "counted AS ({count})"
_COUNTED_PER_MINUTE = "counted AS ({count}), per_minute AS ({count_minute})"

# Settle what the jobs a statement finished mean for others (see miniqueue_settle in migration
# 013): wake whoever waits for them, release the dependents of completed ones, cancel those of
# failed, dead, cancelled or deleted ones. {settling} names the CTE of the finished jobs, with
# columns (id, state, dependents, awaited), state being the one each job ended in. The function
# is called only when one of them has a dependent or a waiter, so a drain of independent jobs
# pays for one scan of its own RETURNING rows. The statement's own count of finished jobs runs
# first (the function counts the dependents it cancels, maybe in the same row of the counts,
# and a row a statement changes after a function it called did is an error). Each list is
# ordered by (parent, dependent) so the three arrays of cancellations line up.
_SETTLE = """
SELECT {settle_function}(
    ARRAY(SELECT id FROM {settling} WHERE awaited AND state IN ({ended})),
    ARRAY(SELECT d FROM {settling}, unnest(dependents) AS d WHERE state = 'completed'),
    ARRAY(SELECT d FROM {settling}, unnest(dependents) AS d WHERE state IN ({unsuccessful}) ORDER BY id, d),
    ARRAY(SELECT id FROM {settling}, unnest(dependents) AS d WHERE state IN ({unsuccessful}) ORDER BY id, d),
    ARRAY(SELECT state FROM {settling}, unnest(dependents) AS d WHERE state IN ({unsuccessful}) ORDER BY id, d),
    {finished_channel}, {queue_channel})
 WHERE EXISTS (SELECT 1 FROM {settling} WHERE (dependents IS NOT NULL OR awaited) AND state IN ({ended}))
   AND (SELECT count(*) FROM counted) >= 0"""
# How a job can end: 'deleted' stands for a job deleted before it finished.
_ENDED = "'completed', {unsuccessful}"
_UNSUCCESSFUL = "'failed', 'dead', 'cancelled', 'deleted'"

# A statement's CTE `settled` runs only if the statement reads it: this condition does, and is
# always true.
_SETTLED = "(SELECT count(*) FROM settled) >= 0"

# The fence every worker-side transition matches.
_FENCE = "state = 'running' AND leased_by = %(worker)s"

# Insert one job (idempotently) and return its id, or the id of the job that already holds the key.
# NOTIFY is sent from the same statement, so it is delivered exactly when the insert commits.
# A job with limits also creates (or updates) the rows of its scopes, in the same statement, so
# that the claim finds them: {scoped} is then _SCOPED, and empty for a job without limits.
_ENQUEUE = """
WITH {scoped}ins AS (
    INSERT INTO {jobs} (queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
                        idempotency_key, limits, trace_context{waiting})
    VALUES (%(queue)s, %(task)s, %(payload)s::jsonb, %(priority)s, %(max_attempts)s, %(max_attempts)s,
            COALESCE(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s)), %(key)s,
            %(limits)s::text[], %(trace)s::jsonb{waiting_values})
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue, scheduled_at
)
SELECT id, false,
       CASE WHEN %(notify)s AND scheduled_at <= now() THEN pg_notify(%(channel)s, queue) END
  FROM ins
UNION ALL
SELECT id, true, NULL FROM {jobs}
 WHERE idempotency_key = %(key)s AND NOT EXISTS (SELECT 1 FROM ins)
"""

# The scope rows of the limits jobs name: a new rate scope starts with one token, so that its
# first job starts at once; a changed limit is updated (the latest enqueue's
# limit is the one in force).
_SCOPED = """scoped AS (
    INSERT INTO {limits} AS l (scope, max_running, rate, burst, tokens)
    SELECT scope, max_running, rate, burst, CASE WHEN rate IS NULL THEN 0 ELSE 1 END
      FROM unnest(%(scopes)s::text[], %(maxes)s::int[], %(rates)s::float8[], %(bursts)s::float8[])
           AS s(scope, max_running, rate, burst)
    ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running, rate = excluded.rate, burst = excluded.burst
     WHERE (l.max_running, l.rate, l.burst) IS DISTINCT FROM (excluded.max_running, excluded.rate, excluded.burst)
),
"""

# The columns a job with parents is inserted with: waiting for those not completed yet.
_WAITING_COLUMNS = ", state, parents, pending_parents"
_WAITING_VALUES = """,
            CASE WHEN %(pending)s > 0 THEN 'waiting' ELSE 'available' END, %(parents)s::bigint[], %(pending)s"""

# Lock a new job's parents (in id order, so concurrent enqueues never deadlock) and read their
# states. A completion of one of them that is under way finishes first; one that starts later
# waits for our commit and then reads the parent's dependents as we left them.
_LOCK_PARENTS = "SELECT id, state FROM {jobs} WHERE id = ANY(%(ids)s::bigint[]) ORDER BY id FOR NO KEY UPDATE"

# Record a new job on its parents' rows (which the parents' completions read).
_LINK_DEPENDENT = """
UPDATE {jobs} SET dependents = array_append(dependents, %(child)s::bigint) WHERE id = ANY(%(parents)s::bigint[])
"""

# Look up the job holding an idempotency key (when a concurrent insert won the race).
_BY_IDEMPOTENCY_KEY = "SELECT id FROM {jobs} WHERE idempotency_key = %(key)s"

# Insert many jobs in one statement. Ids are drawn up front so each input row can be matched
# to its outcome (inserted, duplicate of an existing job, or duplicate within the batch).
# A job's limits travel as one text, its scope names joined by U+001F (which no scope name holds).
_ENQUEUE_MANY = """
WITH {scoped}src AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence(%(table)s, 'id'))::regclass) AS id, u.*
      FROM unnest(%(queues)b::text[], %(tasks)b::text[], %(payloads)b::text[], %(priorities)b::int[],
                  %(max_attempts)b::int[], %(run_ats)b::timestamptz[], %(delays)b::float8[], %(keys)b::text[],
                  %(limits)b::text[])
           WITH ORDINALITY AS u(queue, task, payload, priority, max_attempts, run_at, delay, key, limits, ord)
), ins AS (
    INSERT INTO {jobs} (id, queue, task, payload, priority, max_attempts, attempt_budget, scheduled_at,
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
  LEFT JOIN {jobs} e ON i.id IS NULL AND ik.id IS NULL AND e.idempotency_key = s.key
 WHERE (SELECT count(*) FROM notified) >= 0
 ORDER BY s.ord
"""

# A large batch without idempotency keys goes by COPY: 25% faster than the statement above at
# 10,000 jobs, though its four extra round trips make it slower below a few hundred. Its ids are
# drawn first (to return them), with the transaction's now(): the database clock that every
# job's scheduled_at counts from, exactly as the column default would. A traced batch (see
# miniqueue.tracing) sends its one trace context with every row.
_DRAW_IDS = """
SELECT now(), ARRAY(SELECT nextval((SELECT pg_get_serial_sequence(%(table)s, 'id'))::regclass)
                      FROM generate_series(1, %(count)s))
"""
_COPY_JOBS = """
COPY {jobs} (id, queue, task, payload, priority, max_attempts, attempt_budget{traced}{scheduled}) FROM STDIN"""
_NOTIFY_QUEUES = "SELECT pg_notify(%(channel)s, queue) FROM unnest(%(queues)b::text[]) AS q(queue)"

# Claim up to %(limit)s jobs, best first. Jobs without limits come through {pick}, an ordered
# scan of the claim index (their part of it: `limits IS NULL`). Jobs with limits, and every job
# of a queue with a cap on running jobs, go through admission, in the same statement (see
# migration 012 for the tables):
#   kept      the groups of the limited jobs the statement completes (see {kept}), looked at
#             first: each has a slot this very statement frees, so no holder of it needs a look,
#             and no probe has to find it. A worker stays with a key while it has jobs, and at
#             least min(%(limit)s, 16) groups of every claim are left to the sweep below, so the
#             keys no worker has yet still start;
#   groups    step through the limited jobs' index one group of scopes at a time (one probe per
#             group, from the worker's cursor on, upwards or downwards: see _SWEEPS), so a group
#             held back never costs its backlog;
#   looked    the groups taken into admission (a capped queue's jobs without limits first, as
#             one more group, then the kept groups), each with its scope rows (its own and its
#             queue's cap), locked, as of their latest version, and each row's room: free slots
#             (max_running minus the holders still running at their attempt; see {held}) or
#             whole tokens (the bucket refilled up to now). A group's room is its tightest
#             scope's. Groups are looked at one by one, and only until %(groups)s are in (or
#             %(scan)s were seen): a group with a scope row that has no room is passed over
#             without a lock, and one whose scope row another claim has locked (or rewritten
#             since this statement's snapshot) is passed over without waiting, so that two
#             workers never queue on the same limit, nor deadlock, and a claim behind another's
#             still fills up from the groups after it;
#   limited   the best jobs of each group, as many as its room, locked. Looked for only once
#             the scopes are locked (whose holders are current), they are seldom jobs another
#             worker claimed after this statement's snapshot: locking one of those would hold
#             up that worker's completion of it until this claim commits;
#   chosen    the best of the unlimited candidates and those admitted in every scope they need
#             (groups that share a scope take its room in job order: see {sharing});
#   taken     the chosen jobs' slots and tokens, recorded with the lease they belong to, and
#             the holders that ended pruned. (A scope's new holders are listed in no particular
#             order, ids and attempts aligned: ordering them took a sort per scope, a thousand
#             small sorts in a claim of 1,000 keys.)
# A job held back stays available and spends no attempt.
_CLAIMING = """
fast AS MATERIALIZED ({pick}),
open_queues AS MATERIALIZED (
    SELECT q.name, p.max_running,
           CASE WHEN p.max_running IS NULL THEN '{{}}'::text[] ELSE ARRAY['queue ' || q.name] END AS scope
      FROM {claim_queues} AS q(name) LEFT JOIN {queues} p ON p.name = q.name
     WHERE NOT coalesce(p.paused, false)
),
kept AS MATERIALIZED (
    SELECT DISTINCT k.queue, k.limits, q.scope FROM ({kept}) k JOIN open_queues q ON q.name = k.queue LIMIT %(kept)s
),
groups(queue, scope, limits, depth) AS (
    SELECT q.name, q.scope, f.limits, 1 FROM open_queues q CROSS JOIN LATERAL (
        SELECT limits FROM {jobs}
         WHERE state = 'available' AND limits IS NOT NULL AND queue = q.name AND limits {past} %(after)s::text[]
         ORDER BY limits{order} LIMIT 1) f
    UNION ALL
    SELECT g.queue, g.scope, n.limits, g.depth + 1 FROM groups g CROSS JOIN LATERAL (
        SELECT limits FROM {jobs}
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits {past} g.limits
         ORDER BY limits{order} LIMIT 1) n
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
          FROM (SELECT l.scope, CASE WHEN l.max_running = 1 THEN 1 ELSE {room} END AS room
                  FROM {limits} l WHERE l.scope = ANY(g.scopes) AND NOT {touched} AND {room} > 0
                   FOR UPDATE OF l SKIP LOCKED) x
        OFFSET 0) s
     WHERE cardinality(s.locked) = cardinality(g.scopes)
     LIMIT %(groups)s
),
scopes AS MATERIALIZED (
    SELECT DISTINCT ON (r.scope) r.scope, r.room
      FROM looked g CROSS JOIN LATERAL unnest(g.locked, g.rooms) AS r(scope, room)
     WHERE {sharing}
),
limited AS MATERIALIZED (
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM {jobs}
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits = g.limits
           AND scheduled_at <= now()
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, g.room)
           FOR UPDATE SKIP LOCKED) j
     WHERE g.limits IS NOT NULL
    UNION ALL
    SELECT j.*, g.scopes FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, attempt FROM {jobs}
         WHERE state = 'available' AND limits IS NULL AND queue = g.queue AND scheduled_at <= now()
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
              FROM need n WHERE {sharing}) r
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
    UPDATE {limits} l
       SET (holder_ids, holder_attempts) = (
               SELECT CASE WHEN l.max_running IS NULL THEN l.holder_ids
                           ELSE coalesce(array_agg(h.id ORDER BY h.id), '{{}}') || t.ids END,
                      CASE WHEN l.max_running IS NULL THEN l.holder_attempts
                           ELSE coalesce(array_agg(h.attempt ORDER BY h.id), '{{}}') || t.attempts END
                 FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt) LEFT JOIN {jobs} j ON j.id = h.id
                WHERE l.max_running > 1 AND {held} AND NOT {freed}),
           tokens = CASE WHEN l.rate IS NULL THEN l.tokens ELSE {tokens} - t.used END,
           refilled_at = CASE WHEN l.rate IS NULL THEN l.refilled_at ELSE greatest(l.refilled_at, now()) END
      FROM (SELECT s.scope, count(*) AS used, array_agg(c.id) AS ids, array_agg(c.attempt + 1) AS attempts
              FROM chosen c CROSS JOIN LATERAL unnest(c.scopes) AS s(scope) GROUP BY s.scope) t
     WHERE l.scope = t.scope
),
claimed AS (
UPDATE {jobs}
   SET state = 'running', leased_by = %(worker)s, attempt = attempt + 1,
       lease_expires_at = now() + make_interval(secs => %(lease)s)
 WHERE id = ANY(ARRAY(SELECT id FROM chosen))
RETURNING id, queue, task, payload, priority, attempt, max_attempts, scheduled_at, created_at, lease_expires_at,
          limits, parents, trace_context, attempt_budget
)"""

# The room of a limit row `l` as of its latest version (the claim has it locked, or is about to):
# whole tokens, or slots not held. A limit of 1 with room has no holder left to keep, so the
# claim neither counts its room again nor looks up its ended holders when it takes its slot.
_ROOM = """CASE WHEN l.max_running IS NULL THEN floor({tokens})::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN {jobs} j ON j.id = h.id WHERE {held} AND NOT {freed})::int
     END"""

# Whether another transaction locked or rewrote limit row `l` after this statement's snapshot
# `t` was taken, or was still at it then: the row's xmax is a transaction the snapshot does not
# see (one running when it was taken, or one of the next 2^20 to start; xids compared modulo
# 2^32, as the server does), and not this one. Another claim is taking or has just taken that
# limit's room, so the claim passes over it as it passes over a row locked now. Locking such a
# row instead would have the server check the new version against the statement's conditions
# (EvalPlanQual), and setting that up costs ~0.1 ms a row in a statement this size: a claim
# that followed another through the same keys spent 300 ms doing it. A lock left by a
# transaction that ended before the snapshot is not a reason to pass over: such a row locks at
# once, version unchanged.
_TOUCHED = """(l.xmax <> '0'
               AND ((l.xmax::text::bigint - t.next) & 4294967295 < 1048576 OR l.xmax::text::bigint = ANY(t.running))
               AND l.xmax::text::bigint IS DISTINCT FROM pg_current_xact_id_if_assigned()::text::bigint & 4294967295)"""
_TOKENS = "least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at)))"

# Whether holder `h` (its job row `j` as this statement's snapshot shows it, or NULL) of limit
# row `l` still holds its slot. Read from the snapshot without a lock: a job's attempt only
# grows, so one seen at the holder's attempt and not running, or at a later attempt, has ended
# for good, and one seen at an earlier attempt was claimed after the snapshot, and holds. A
# holder the snapshot does not show at all was deleted (pruned, `jobs delete`), unless `l` was
# rewritten since the snapshot: then it may be a job enqueued and claimed meanwhile (by a
# worker that preferred it for its priority), held too. Erring toward "held" can only
# under-admit for a moment.
_HELD = """((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM {limits} v WHERE v.scope = l.scope AND v.xmin = l.xmin)))"""

# The groups a claim keeps (see `kept`): none for a claim alone; for a claim that rides with
# completions, those of the limited jobs being completed.
_KEPT_NONE = "SELECT NULL::text AS queue, NULL::text[] AS limits WHERE false"
_KEPT_COMPLETED = "SELECT queue, limits FROM completed WHERE limits IS NOT NULL"

# Leases whose slots the statement frees itself: none for a claim alone; for a claim that rides
# with completions, the leases being completed (their slots are free whether the completion
# lands or finds the lease lost, since either way the job is no longer running at that attempt).
# Without this, a claim could not see the slots freed by the completions of its own statement.
_FREED_NONE = "false"
_FREED_COMPLETING = """EXISTS (SELECT 1 FROM unnest(%(ids)b::bigint[], %(attempts)b::int[]) AS c(id, attempt)
                WHERE c.id = h.id AND c.attempt = h.attempt)"""


_CLAIM = """
WITH RECURSIVE {claiming}
SELECT * FROM claimed
"""

# The two directions a claim steps through the groups in, from the caller's cursor: a worker
# goes round them one way, its neighbour the other way. Two workers going the same way end up
# one behind the other, each claim passing over the groups the other's last claim just took (a
# probe and a look at the limit each: 2 groups seen per group taken, with 2 workers); going
# opposite ways they meet twice a round.
_SWEEPS = {False: (">", ""), True: ("<", " DESC")}  # (past, order) of groups going up, going down

# Claim from one queue: `queue = $1` keeps the ordered scan of the claim index. A paused queue
# gives nothing; a capped one gives its jobs to admission instead.
_PICK_ONE_QUEUE = """
    SELECT id, priority, scheduled_at, attempt FROM {jobs}
     WHERE state = 'available' AND queue = %(queue)s AND limits IS NULL AND scheduled_at <= now()
       AND NOT EXISTS (SELECT 1 FROM {queues} WHERE name = %(queue)s AND (paused OR max_running IS NOT NULL))
     ORDER BY priority DESC, scheduled_at, id
     LIMIT %(limit)s FOR UPDATE SKIP LOCKED"""
_ONE_QUEUE = "(VALUES (%(queue)s::text))"

# Whether two groups of a claim may share a scope, so that their jobs must take its room in
# turn (`blocked`). In one queue, groups are distinct sets of scopes, so only a group of more
# than one (a key under a cap, a key and a rate limit) can share; most claims have none, and
# skip the ranking. Across queues, one key's jobs in two queues share it.
_SHARING_IN_ONE_QUEUE = "(SELECT coalesce(bool_or(cardinality(scopes) > 1), false) FROM looked)"
_SHARING_ACROSS_QUEUES = "true"

# Claim from several queues: an ordered index scan per queue, merged. (`queue = ANY(...)`
# would scan and sort every available row of every queue on each claim.)
_PICK_MANY_QUEUES = """
    SELECT c.id, c.priority, c.scheduled_at, c.attempt FROM unnest(%(queues)b::text[]) AS q(name)
     CROSS JOIN LATERAL (
        SELECT id, priority, scheduled_at, attempt FROM {jobs}
         WHERE state = 'available' AND queue = q.name AND limits IS NULL AND scheduled_at <= now()
         ORDER BY priority DESC, scheduled_at, id
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c
     WHERE NOT EXISTS (SELECT 1 FROM {queues} p WHERE p.name = q.name AND (p.paused OR p.max_running IS NOT NULL))
     ORDER BY c.priority DESC, c.scheduled_at, c.id
     LIMIT %(limit)s"""
_MANY_QUEUES = "unnest(%(queues)b::text[])"

# Complete a batch of leases, storing each job's result; returns the ids that were still held.
# Each row looks up its own attempt (and result) by binary search: `ids` is sorted (see
# _columns), so width_bucket() gives an id's position in O(log n). A join to unnest() planned
# as a nested loop comparing every pair, and array_position() scans the array: both are
# quadratic in the batch (7 ms per 1,000 jobs, against 0.7 ms). `results` is JSON text aligned
# with `ids`, or empty when no job of the batch returned anything.
_COMPLETED = """
UPDATE {jobs}
   SET state = 'completed', completed_at = now(), finished_at = now(), lease_expires_at = NULL, leased_by = NULL,
       result = CASE WHEN cardinality(%(results)b::text[]) > 0
                     THEN ((%(results)b::text[])[width_bucket(id, %(ids)b::bigint[])])::jsonb END
 WHERE id = ANY(%(ids)b::bigint[])
   AND attempt = (%(attempts)b::int[])[width_bucket(id, %(ids)b::bigint[])]
   AND {fence}
RETURNING id, queue, state, dependents, awaited, limits
"""
_COMPLETE = """
WITH completed AS ({completed}), {counted}, settled AS ({settle})
SELECT id FROM completed WHERE {settled}
"""

# Complete a batch and claim the next one in one statement: one round trip and one commit
# instead of two. The two updates touch disjoint rows (running and leased to us, versus
# available). A LEFT JOIN keeps the completed ids even when nothing is claimed; they ride on
# the first row only (repeating the array on every claimed row cost more than the claim).
_COMPLETE_AND_CLAIM = """
WITH RECURSIVE completed AS ({completed}), {counted}, settled AS ({settle}), {claiming}
SELECT CASE WHEN row_number() OVER () = 1 THEN d.ids END, c.*
  FROM (SELECT array_agg(id) AS ids FROM completed) d LEFT JOIN claimed c ON true
 WHERE {settled}
"""

# Extend a batch of leases by `lease` seconds from now; returns the ids still held.
_RENEW = """
UPDATE {jobs}
   SET lease_expires_at = now() + make_interval(secs => %(lease)s)
 WHERE id = ANY(%(ids)b::bigint[])
   AND attempt = (%(attempts)b::int[])[width_bucket(id, %(ids)b::bigint[])]
   AND {fence}
RETURNING id, lease_expires_at
"""

# Record failed attempts: retry after the given backoff (NULL: the task's published backoff, for
# a caller without the app), or dead once attempts are exhausted.
_RECORD_FAILURES = """
WITH failed AS (
UPDATE {jobs} j
   SET state = CASE WHEN j.attempt >= j.max_attempts THEN 'dead' ELSE 'available' END,
       scheduled_at = CASE WHEN j.attempt >= j.max_attempts THEN j.scheduled_at
                           ELSE now() + make_interval(secs => coalesce(
                               f.backoff, {retry_delay}(j.task, j.attempt, %(base)s, %(cap)s))) END,
       finished_at = CASE WHEN j.attempt >= j.max_attempts THEN now() END,
       last_error = f.error, errors = {append}, lease_expires_at = NULL, leased_by = NULL
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(errors)s::text[], %(backoffs)s::float8[])
       AS f(id, attempt, error, backoff)
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = f.id AND j.attempt = f.attempt AND {fence}
RETURNING j.id, j.queue, j.state, j.dependents, j.awaited
), {counted}, settled AS ({settle})
SELECT id, state FROM failed WHERE {settled}
"""

# Fail a job permanently: the handler said never retry.
_FAIL = """
WITH failed AS (
UPDATE {jobs}
   SET state = 'failed', finished_at = now(), last_error = %(error)s, errors = {append},
       lease_expires_at = NULL, leased_by = NULL
 WHERE id = %(id)s AND attempt = %(attempt)s AND {fence}
RETURNING id, queue, state, dependents, awaited
), {counted}, settled AS ({settle})
SELECT id FROM failed WHERE {settled}
"""

# Put a job back to sleep without spending an attempt (the attempt number still moves on when
# it is next claimed; max_attempts moves with it so the budget is unchanged).
_SNOOZE = """
UPDATE {jobs}
   SET state = 'available', scheduled_at = now() + make_interval(secs => %(delay)s),
       max_attempts = max_attempts + 1, lease_expires_at = NULL, leased_by = NULL
 WHERE id = %(id)s AND attempt = %(attempt)s AND {fence}
RETURNING id
"""

# Hand back leases without spending an attempt: prefetched jobs never started, or jobs whose
# run was interrupted by a stop someone asked for (or by a neighbour's crash). Like a snooze,
# the attempt number stays spent (it is the fencing token and never repeats) and max_attempts
# moves up with it, so the job's budget of attempts is unchanged; the history says why.
_RELEASE = """
UPDATE {jobs} j
   SET state = 'available', max_attempts = j.max_attempts + 1, errors = {append},
       lease_expires_at = NULL, leased_by = NULL
  FROM unnest(%(ids)s::bigint[], %(attempts)s::int[], %(notes)s::text[]) AS r(id, attempt, note)
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = r.id AND j.attempt = r.attempt AND {fence}
RETURNING j.id
"""

# Return expired leases to the queue (or dead, when attempts are exhausted). The outer WHERE
# re-checks the expiry in the same statement, so a job completed or renewed between the scan
# and the update is left alone.
_RECOVER_EXPIRED = """
WITH recovered AS (
UPDATE {jobs}
   SET state = CASE WHEN attempt >= max_attempts THEN 'dead' ELSE 'available' END,
       scheduled_at = CASE WHEN attempt >= max_attempts THEN scheduled_at
                           ELSE now() + make_interval(secs => {retry_delay}(task, attempt, %(base)s, %(cap)s)) END,
       finished_at = CASE WHEN attempt >= max_attempts THEN now() END,
       last_error = format('worker lost: %%s stopped renewing its lease on attempt %%s of %%s',
                           leased_by, attempt_budget - (max_attempts - attempt), attempt_budget),
       errors = {append}, lease_expires_at = NULL, leased_by = NULL
 WHERE id = ANY(ARRAY(
        SELECT id FROM {jobs}
         WHERE state = 'running' AND lease_expires_at < now()
         ORDER BY lease_expires_at
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
   AND state = 'running' AND lease_expires_at < now()
RETURNING id, queue, state, dependents, awaited
), {counted}, settled AS ({settle})
SELECT id, state FROM recovered WHERE {settled}
"""

# The leases a worker holds (used by the supervisor after reaping a dead worker). The
# lease_expires_at condition is always true for running jobs; it lets the planner use the
# reaper's partial index.
_LEASES_OF = """
SELECT id, attempt FROM {jobs}
 WHERE state = 'running' AND leased_by = %(worker)s AND lease_expires_at IS NOT NULL
"""

# Requeue finished jobs by id or by filter, with a fresh attempt budget (attempt keeps counting).
_REQUEUE = """
WITH picked AS (
    SELECT id, queue, state FROM {jobs}
     WHERE state = ANY(%(states)s::text[])
       AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
       AND (%(queue)s::text IS NULL OR queue = %(queue)s)
       AND (%(task)s::text IS NULL OR task = %(task)s)
       FOR UPDATE
), requeued AS (
    UPDATE {jobs} j
       SET state = 'available', scheduled_at = now(), max_attempts = j.attempt + j.attempt_budget,
           finished_at = NULL, completed_at = NULL, lease_expires_at = NULL, leased_by = NULL
      FROM picked p WHERE j.id = p.id
    RETURNING j.id, p.queue, p.state
), {counted}
SELECT id FROM requeued
"""

# Cancel jobs that have not finished. A running job's worker finds out at its next heartbeat;
# a waiting job's dependents are cancelled with it.
_CANCEL = """
WITH cancelled AS (
UPDATE {jobs}
   SET state = 'cancelled', finished_at = now(), lease_expires_at = NULL, leased_by = NULL, pending_parents = 0
 WHERE id = ANY(%(ids)s::bigint[]) AND state IN ('available', 'running', 'waiting')
RETURNING id, queue, state, dependents, awaited
), {counted}, settled AS ({settle})
SELECT id FROM cancelled WHERE {settled}
"""

# The state of each given job (to explain why a transition did not apply).
_STATES = "SELECT id, state, attempt FROM {jobs} WHERE id = ANY(%(ids)s::bigint[])"

# One job, every column.
_JOB_COLUMNS = """id, queue, task, payload, state, priority, attempt, max_attempts, idempotency_key, scheduled_at,
       created_at, lease_expires_at, leased_by, last_error, completed_at, finished_at, errors, result, parents,
       dependents, pending_parents, attempt_budget"""

# What a job's result is, or why there is none.
_RESULT = "SELECT state, result, last_error FROM {jobs} WHERE id = %(id)s"

# Ask for a notification when a job finishes (see Store.await_job): set only while it has not.
_AWAIT = """
UPDATE {jobs} SET awaited = true
 WHERE id = %(id)s AND NOT awaited AND state IN ('available', 'running', 'waiting')
"""
_GET = "SELECT {columns} FROM {jobs} WHERE id = %(id)s"

# Per queue: counts by state, jobs scheduled for later, the age of the oldest job waiting to
# run, and leases that expired without the reaper having recovered them yet. Its cost does not
# grow with finished rows: available and running jobs are read from their partial indexes (the
# claim index, the reaper's lease index), finished ones from the counters.
_QUEUE_STATS = """
WITH ready AS (
    SELECT queue, count(*) AS available, count(*) FILTER (WHERE scheduled_at > now()) AS scheduled,
           extract(epoch FROM now() - min(scheduled_at) FILTER (WHERE scheduled_at <= now()))
               AS oldest_available_seconds
      FROM (SELECT queue, scheduled_at FROM {jobs} WHERE state = 'available' AND limits IS NULL
            UNION ALL
            SELECT queue, scheduled_at FROM {jobs} WHERE state = 'available' AND limits IS NOT NULL) a
     GROUP BY queue
), blocked AS (
    SELECT queue, count(*) AS waiting FROM {jobs} WHERE state = 'waiting' GROUP BY queue
), leased AS (
    SELECT queue, count(*) AS running, count(*) FILTER (WHERE lease_expires_at < now()) AS expired_leases
      FROM {jobs} WHERE state = 'running' AND lease_expires_at IS NOT NULL GROUP BY queue
), finished AS (
    SELECT queue,
           greatest(0, coalesce(sum(count) FILTER (WHERE state = 'completed'), 0)) AS completed,
           greatest(0, coalesce(sum(count) FILTER (WHERE state = 'failed'), 0)) AS failed,
           greatest(0, coalesce(sum(count) FILTER (WHERE state = 'dead'), 0)) AS dead,
           greatest(0, coalesce(sum(count) FILTER (WHERE state = 'cancelled'), 0)) AS cancelled
      FROM {counts} GROUP BY queue
)
SELECT queue, coalesce(available, 0) AS available, coalesce(running, 0) AS running,
       coalesce(completed, 0) AS completed, coalesce(failed, 0) AS failed, coalesce(dead, 0) AS dead,
       coalesce(cancelled, 0) AS cancelled, coalesce(waiting, 0) AS waiting, coalesce(scheduled, 0) AS scheduled,
       oldest_available_seconds, coalesce(expired_leases, 0) AS expired_leases
  FROM ready FULL JOIN blocked USING (queue) FULL JOIN leased USING (queue) FULL JOIN finished USING (queue)
 WHERE coalesce(available, 0) + coalesce(running, 0) + coalesce(completed, 0) + coalesce(failed, 0)
       + coalesce(dead, 0) + coalesce(cancelled, 0) + coalesce(waiting, 0) > 0
 ORDER BY queue
"""

# Recount the finished jobs from the table itself: the repair for counts that drifted (jobs
# finished by workers of an older version during the migration that added the counts, or rows
# changed by hand). It reads every finished row once; the lock makes statements that finish
# jobs wait until it commits, so none is counted twice or missed.
_RECOUNT = ["LOCK TABLE {counts} IN EXCLUSIVE MODE", "DELETE FROM {counts}", """
INSERT INTO {counts} (queue, state, shard, count)
SELECT queue, state, 0, count(*) FROM {jobs}
 WHERE state IN ('completed', 'failed', 'dead', 'cancelled')
 GROUP BY queue, state
"""]

# Plan each statement of the session for its parameters, or let PostgreSQL choose again.
_CUSTOM_PLANS = "SET plan_cache_mode = force_custom_plan"
_DEFAULT_PLANS = "RESET plan_cache_mode"

# A monitoring query must answer quickly or not at all: it never holds up what called it.
_MONITORING_TIMEOUT = "SET LOCAL statement_timeout = '5s'"

# A page of jobs, newest first, filtered; `before` pages by id (keyset pagination stays fast).
_JOB_FILTER = """(%(state)s::text IS NULL OR state = %(state)s)
   AND (%(queue)s::text IS NULL OR queue = %(queue)s)
   AND (%(task)s::text IS NULL OR task = %(task)s)
   AND (%(search)s::text IS NULL OR strpos(payload::text, %(search)s) > 0)
   AND (%(after)s::timestamptz IS NULL OR created_at >= %(after)s)
   AND (%(until)s::timestamptz IS NULL OR created_at < %(until)s)"""
_LIST = """
SELECT {columns} FROM {jobs}
 WHERE {filter}
   AND (%(before)s::bigint IS NULL OR id < %(before)s)
 ORDER BY id DESC
 LIMIT %(limit)s
"""
# How many jobs match a filter (for "apply to all N matching jobs" confirmations).
_COUNT_MATCHING = "SELECT count(*) FROM {jobs} WHERE {filter}"
_IDS_MATCHING = "SELECT id FROM {jobs} WHERE {filter} ORDER BY id LIMIT %(limit)s"

# The database's clock, for schedulers that must not trust their host's.
_NOW = "SELECT now()"

# Periodic schedules: where each one stands.
_PERIODIC_STATE = "SELECT name, last_slot, enabled FROM {periodic}"

# Claim a periodic slot: advance last_slot if this slot is newer and the schedule is enabled.
# Returns a row only for the one scheduler that advanced it.
_CLAIM_SLOT = """
INSERT INTO {periodic} (name, last_slot) VALUES (%(name)s, %(slot)s)
ON CONFLICT (name) DO UPDATE SET last_slot = excluded.last_slot, updated_at = now()
 WHERE {periodic}.last_slot < excluded.last_slot AND {periodic}.enabled
RETURNING name
"""

# Enable or disable a periodic schedule (creating its row if no scheduler has run it yet);
# says whether the row is new.
_SET_PERIODIC_ENABLED = """
INSERT INTO {periodic} (name, last_slot, enabled) VALUES (%(name)s, now(), %(enabled)s)
ON CONFLICT (name) DO UPDATE SET enabled = excluded.enabled, updated_at = now()
RETURNING xmax = 0
"""

# Publish an app's task declarations (migration 019): what a producer without the app fills a
# job's unset options from. Rows are upserted in task order (workers starting together never
# deadlock), and a row is rewritten only when the declaration changed.
_PUBLISH_TASKS = """
INSERT INTO {tasks} AS t (task, queue, priority, max_attempts, concurrency_key, concurrency_key_computed,
                          max_concurrent, rate_limit, rate_limit_key, rate_limit_key_computed, backoff_base,
                          backoff_cap)
SELECT * FROM unnest(%(tasks)s::text[], %(queues)s::text[], %(priorities)s::smallint[], %(max_attempts)s::int[],
                     %(concurrency_keys)s::text[], %(concurrency_computed)s::boolean[], %(max_concurrent)s::int[],
                     %(rate_limits)s::text[], %(rate_limit_keys)s::text[], %(rate_computed)s::boolean[],
                     %(backoff_bases)s::float8[], %(backoff_caps)s::float8[])
 ORDER BY 1
ON CONFLICT (task) DO UPDATE
   SET queue = excluded.queue, priority = excluded.priority, max_attempts = excluded.max_attempts,
       concurrency_key = excluded.concurrency_key, concurrency_key_computed = excluded.concurrency_key_computed,
       max_concurrent = excluded.max_concurrent, rate_limit = excluded.rate_limit,
       rate_limit_key = excluded.rate_limit_key, rate_limit_key_computed = excluded.rate_limit_key_computed,
       backoff_base = excluded.backoff_base, backoff_cap = excluded.backoff_cap, published_at = now()
 WHERE (t.queue, t.priority, t.max_attempts, t.concurrency_key, t.concurrency_key_computed, t.max_concurrent,
        t.rate_limit, t.rate_limit_key, t.rate_limit_key_computed, t.backoff_base, t.backoff_cap)
       IS DISTINCT FROM
       (excluded.queue, excluded.priority, excluded.max_attempts, excluded.concurrency_key,
        excluded.concurrency_key_computed, excluded.max_concurrent, excluded.rate_limit, excluded.rate_limit_key,
        excluded.rate_limit_key_computed, excluded.backoff_base, excluded.backoff_cap)
"""
# Record that a worker serves these queues (as it starts).
_SERVE_QUEUES = """
INSERT INTO {served_queues} (queue) SELECT q FROM unnest(%(queues)s::text[]) AS q ORDER BY q
ON CONFLICT (queue) DO UPDATE SET served_at = now()
"""
# Every task declaration (a handful of rows: one per task of the apps on this database).
_TASK_DECLARATIONS = """
SELECT task, queue, priority, max_attempts, concurrency_key, concurrency_key_computed, max_concurrent, rate_limit,
       rate_limit_key, rate_limit_key_computed, backoff_base, backoff_cap
  FROM {tasks}
"""
# A job's parents' results, one row per parent in the order of its parents (a parent pruned
# since is left out). Read when a handler asks for them, never by the claim: aggregated there,
# the results of a large group (each within the result limit) overflowed jsonb's 256 MB array
# limit and failed the whole claim, again at every retry.
_PARENT_RESULTS = """
SELECT p.id, p.result FROM unnest(%(ids)s::bigint[]) WITH ORDINALITY AS u(id, ord) JOIN {jobs} p ON p.id = u.id
 ORDER BY u.ord
"""
# Which of these queues no worker has ever served.
_UNSERVED_QUEUES = """
SELECT q FROM unnest(%(queues)s::text[]) AS q WHERE NOT EXISTS (SELECT 1 FROM {served_queues} s WHERE s.queue = q)
"""

# Pause or resume a queue.
_SET_PAUSED = """
INSERT INTO {queues} (name, paused) VALUES (%(name)s, %(paused)s)
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = now()
"""
_PAUSED = "SELECT name FROM {queues} WHERE paused ORDER BY name"

# Cap a queue's running jobs (or lift the cap: NULL). Its slots are the scope 'queue <name>'; the
# scope row keeps its holders when the cap is lifted, so a cap set again counts the jobs still
# running under the old one.
_SET_QUEUE_LIMIT = """
WITH capped AS (
    INSERT INTO {queues} (name, max_running) VALUES (%(name)s, %(max)s::int)
    ON CONFLICT (name) DO UPDATE SET max_running = excluded.max_running, updated_at = now()
)
INSERT INTO {limits} (scope, max_running) SELECT %(scope)s, %(max)s::int WHERE %(max)s::int IS NOT NULL
ON CONFLICT (scope) DO UPDATE SET max_running = excluded.max_running
"""
_QUEUE_LIMITS = "SELECT name, max_running FROM {queues} WHERE max_running IS NOT NULL ORDER BY name"

# Each limit with jobs waiting on it or a slot held: due, available jobs that name it (or, for a
# queue's cap, every due job of the queue), its limit, the jobs holding its slots (running at the
# attempt that took the slot) and the tokens left. Read from the limited jobs' index, the claim
# index of capped queues and the expired-lease index (running jobs, one per busy handler): its
# cost grows with the jobs waiting on limits and the jobs running, never with finished rows.
_LIMIT_WAITS = """
WITH waiting AS (
    SELECT s.scope, count(*) AS waiting
      FROM {jobs} j CROSS JOIN LATERAL unnest(j.limits) AS s(scope)
     WHERE j.state = 'available' AND j.limits IS NOT NULL AND j.scheduled_at <= now()
     GROUP BY s.scope
    UNION ALL
    SELECT 'queue ' || q.name,
           (SELECT count(*) FROM {jobs} j
             WHERE j.state = 'available' AND j.limits IS NULL AND j.queue = q.name AND j.scheduled_at <= now())
           + (SELECT count(*) FROM {jobs} j
               WHERE j.state = 'available' AND j.limits IS NOT NULL AND j.queue = q.name AND j.scheduled_at <= now())
      FROM {queues} q WHERE q.max_running IS NOT NULL
    UNION ALL
    SELECT DISTINCT s.scope, 0
      FROM {jobs} j CROSS JOIN LATERAL unnest(j.limits) AS s(scope)
     WHERE j.state = 'running' AND j.lease_expires_at IS NOT NULL AND j.limits IS NOT NULL
), scopes AS (
    SELECT scope, sum(waiting)::bigint AS waiting FROM waiting GROUP BY scope
)
SELECT w.scope, w.waiting, l.max_running, l.rate, cardinality(h.holders) AS held,
       least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at))) AS tokens,
       h.holders
  FROM scopes w LEFT JOIN {limits} l USING (scope)
 CROSS JOIN LATERAL (
       SELECT ARRAY(SELECT h.id FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                      JOIN {jobs} j ON j.id = h.id AND j.state = 'running' AND j.attempt = h.attempt
                     ORDER BY h.id) AS holders) h
 WHERE w.waiting > 0 OR cardinality(h.holders) > 0
 ORDER BY w.waiting DESC, cardinality(h.holders) DESC, w.scope
 LIMIT %(limit)s
"""

# Which of the given queue names are known: paused or resumed before, served by a worker,
# holding a job that is waiting or running, or counted with finished ones (as `stats` and
# `queues list` show them). Each probe is an index lookup: the claim index for waiting jobs, the
# expired-lease index (running jobs, one per busy handler thread) for running ones, the counts'
# primary key for finished ones (the jobs table has no index of finished jobs by queue).
_KNOWN_QUEUES = """
SELECT q.name FROM unnest(%(names)s::text[]) AS q(name)
 WHERE EXISTS (SELECT 1 FROM {queues} WHERE name = q.name)
    OR EXISTS (SELECT 1 FROM {served_queues} WHERE queue = q.name)
    OR EXISTS (SELECT 1 FROM {counts} WHERE queue = q.name AND count > 0)
    OR EXISTS (SELECT 1 FROM {jobs} WHERE state = 'available' AND limits IS NULL AND queue = q.name)
    OR EXISTS (SELECT 1 FROM {jobs} WHERE state = 'available' AND limits IS NOT NULL AND queue = q.name)
    OR EXISTS (SELECT 1 FROM {jobs} WHERE state = 'running' AND lease_expires_at IS NOT NULL AND queue = q.name)
"""
# Every known queue name (as above), for an error naming the known ones. The waiting queues are
# found by skipping through the claim index and the limited jobs' index one queue at a time,
# never reading each job.
_KNOWN_QUEUE_NAMES = """
WITH RECURSIVE waiting(queue) AS (
    (SELECT queue FROM {jobs} WHERE state = 'available' AND limits IS NULL ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {jobs} j WHERE j.state = 'available' AND j.limits IS NULL AND j.queue > w.queue
             ORDER BY j.queue LIMIT 1)
      FROM waiting w WHERE w.queue IS NOT NULL
), limited(queue) AS (
    (SELECT queue FROM {jobs} WHERE state = 'available' AND limits IS NOT NULL ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {jobs} j WHERE j.state = 'available' AND j.limits IS NOT NULL AND j.queue > w.queue
             ORDER BY j.queue LIMIT 1)
      FROM limited w WHERE w.queue IS NOT NULL
)
SELECT queue FROM waiting WHERE queue IS NOT NULL
 UNION SELECT queue FROM limited WHERE queue IS NOT NULL
 UNION SELECT queue FROM {jobs} WHERE state = 'running' AND lease_expires_at IS NOT NULL
 UNION SELECT name FROM {queues}
 UNION SELECT queue FROM {served_queues}
 UNION SELECT queue FROM {counts} WHERE count > 0
 ORDER BY 1 LIMIT %(limit)s
"""

# Jobs finished per minute over the last hour, by outcome: the per-minute counts the finishing
# statements keep (_COUNT_MINUTE), summed over their shards.
_THROUGHPUT = """
SELECT minute, state, sum(count)::bigint FROM {finished_minutes}
 WHERE minute > now() - interval '1 hour'
 GROUP BY 1, 2 ORDER BY 1, 2
"""
# The throughput's minutes the chart no longer shows (the reaper, every pass).
_TRIM_MINUTES = "DELETE FROM {finished_minutes} WHERE minute < now() - interval '2 hours'"

# Delete jobs that are not running (an operator's explicit action). The dependents of a job
# deleted before it finished are cancelled: it will never complete.
_DELETE = """
WITH deleted AS (
    DELETE FROM {jobs} WHERE id = ANY(%(ids)b::bigint[]) AND state <> 'running'
    RETURNING id, queue, state, dependents, awaited
), {counted}, unfinished AS (
    SELECT id, 'deleted' AS state, dependents, awaited FROM deleted WHERE state IN ('available', 'waiting')
), settled AS ({settle})
SELECT id FROM deleted WHERE {settled}
"""

# Refresh one supervisor's rows of the process registry, and drop its children that are gone.
_UPSERT_PROCESSES = """
WITH incoming AS (
    SELECT * FROM unnest(%(ids)s::text[], %(kinds)s::text[], %(pids)s::int[], %(titles)s::text[],
                         %(started)s::timestamptz[], %(rss)s::bigint[], %(done)s::bigint[], %(restarts)s::int[],
                         %(current)s::text[])
           AS i(id, kind, pid, title, started_at, rss_bytes, jobs_done, restarts, current_jobs)
), gone AS (
    DELETE FROM {processes} WHERE supervisor = %(supervisor)s AND id <> ALL(%(ids)s::text[])
)
INSERT INTO {processes} AS p (id, supervisor, kind, host, pid, title, started_at, last_seen, rss_bytes, jobs_done,
                              restarts, current_jobs)
SELECT id, %(supervisor)s, kind, %(host)s, pid, title, started_at, now(), rss_bytes, jobs_done, restarts,
       current_jobs::bigint[]
  FROM incoming
ON CONFLICT (id) DO UPDATE SET title = excluded.title, last_seen = now(), rss_bytes = excluded.rss_bytes,
    jobs_done = excluded.jobs_done, restarts = excluded.restarts, current_jobs = excluded.current_jobs
"""
_DELETE_PROCESSES = "DELETE FROM {processes} WHERE supervisor = %(supervisor)s"

# Every registered process seen recently, supervisors first; older rows belong to dead hosts.
_PROCESSES = """
SELECT id, supervisor, kind, host, pid, title, started_at, last_seen, rss_bytes, jobs_done, restarts, current_jobs
  FROM {processes}
 WHERE last_seen > now() - make_interval(secs => %(max_age)s)
 ORDER BY host, supervisor, kind <> 'supervisor', kind, pid
"""

# How many jobs each queue holds in each state.

# Delete a batch of jobs that finished longer ago than `age` seconds. The literal state list
# lets the planner use the partial finished_at index.
_PRUNE = """
WITH pruned AS (
    DELETE FROM {jobs}
     WHERE id = ANY(ARRAY(
            SELECT id FROM {jobs}
             WHERE state IN ('completed', 'failed', 'dead', 'cancelled') AND state = ANY(%(states)s::text[])
               AND finished_at < now() - make_interval(secs => %(age)s)
             LIMIT %(limit)s FOR UPDATE SKIP LOCKED))
    RETURNING queue, state
), {counted}
SELECT count(*) FROM pruned
"""

# Whether the migrations table exists, then the newest applied migration.
_HAS_VERSIONS = "SELECT to_regclass(%(versions)s) IS NOT NULL"
_SCHEMA_VERSION = "SELECT coalesce(max(version), 0) FROM {migrations}"

# The jobs table's churn, for the reaper's upkeep (see miniqueue.vacuum): live rows, rows
# inserted and updated since the server's statistics began (a claim and a completion update one
# each), rows changed since the planner's statistics were taken, when a vacuum and an analyze
# last finished, and whether this role may vacuum and analyze the table (it owns it).
_JOBS_CHURN = """
SELECT pg_stat_get_live_tuples(c.oid) AS live, pg_stat_get_tuples_inserted(c.oid) AS inserted,
       pg_stat_get_tuples_updated(c.oid) AS updated, pg_stat_get_mod_since_analyze(c.oid) AS changed,
       greatest(pg_stat_get_last_vacuum_time(c.oid), pg_stat_get_last_autovacuum_time(c.oid)) AS last_vacuum,
       greatest(pg_stat_get_last_analyze_time(c.oid), pg_stat_get_last_autoanalyze_time(c.oid)) AS last_analyze,
       pg_has_role(c.relowner, 'USAGE') AS may_maintain
  FROM pg_class c
 WHERE c.oid = %(table)s::regclass
"""
# SKIP_LOCKED: when autovacuum (or an operator) is already at it, there is nothing to add.
_VACUUM_JOBS = "VACUUM (SKIP_LOCKED, ANALYZE) {jobs}"
_ANALYZE_JOBS = "ANALYZE (SKIP_LOCKED) {jobs}"

# How many connections the server allows, keeps for superusers, and has in use by clients.
_CONNECTION_CAPACITY = """
SELECT current_setting('max_connections')::int, current_setting('superuser_reserved_connections')::int,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int
"""

# Migrations: one migrator at a time per schema; the others wait on the lock, then find nothing to do.
_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(hashtext('miniqueue-migrate:' || %(schema)s))"
_CREATE_SCHEMA = "CREATE SCHEMA IF NOT EXISTS {schema}"
_CREATE_VERSIONS = """
CREATE TABLE IF NOT EXISTS {migrations} (
    version INT PRIMARY KEY, name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())
"""
_APPLIED_VERSIONS = "SELECT version FROM {migrations}"
_PIN_SEARCH_PATH = "SET LOCAL search_path TO {schema}, pg_catalog"
_RECORD_VERSION = "INSERT INTO {migrations} (version, name) VALUES (%(version)s, %(name)s)"


@dataclass(frozen=True)
class Failure:
    """A failed attempt to record: the lease it happened under, the error, the retry delay (None:
    the task's published backoff, for a caller without the app, as the README's "Who pays an
    attempt" says)."""

    id: int
    attempt: int
    error: str
    backoff_seconds: float | None = None


class LimitWait(NamedTuple):
    """One limit that jobs wait on or hold slots of: its scope name, how many due jobs wait, and
    its state (a concurrency limit's ``max_running``, slots ``held`` and the ids of the jobs
    holding them, ``holders``; or a rate limit's ``rate`` per second and ``tokens`` left)."""

    scope: str
    waiting: int
    max_running: int | None
    rate: float | None
    held: int | None
    tokens: float | None
    holders: list[int]


class JobsChurn(NamedTuple):
    """The jobs table's statistics as the server keeps them: ``live`` rows, rows ``inserted``
    and ``updated`` since the statistics began, rows ``changed`` (inserted, updated or deleted)
    since the planner's statistics were taken, when a vacuum and an analyze last finished
    (``None``: never), and whether this role may vacuum and analyze the table."""

    live: int
    inserted: int
    updated: int
    changed: int
    last_vacuum: dt.datetime | None
    last_analyze: dt.datetime | None
    may_maintain: bool


@dataclass(frozen=True)
class Release:
    """A lease to hand back without spending an attempt, and the history note saying why."""

    id: int
    attempt: int
    note: str


class Store:
    """All of miniqueue's SQL, for the queue tables in one schema.

    Methods take the connection to run on as their first argument, so the caller decides the
    transaction: our own autocommit connections run each statement as its own transaction;
    a caller's connection (transactional enqueue, transactional completion) runs it inside
    the caller's transaction.
    """

    #: The smallest batch without idempotency keys worth sending by :meth:`copy_many`.
    copy_threshold = 500

    def __init__(self, schema: str = "public") -> None:
        self.schema = check_schema(schema)
        self.channel = QUEUE_CHANNEL.format(schema=schema)
        #: Where the statements that finish a job someone waits for notify (payload: the job id).
        self.finished_channel = FINISHED_CHANNEL.format(schema=schema)
        jobs = sql.Identifier(schema, "miniqueue_jobs")
        self.table_name = jobs.as_string()
        names: dict[str, sql.Composable] = {
            "jobs": jobs,
            "migrations": sql.Identifier(schema, "miniqueue_migrations"),
            "schema": sql.Identifier(schema),
            "periodic": sql.Identifier(schema, "miniqueue_periodic"),
            "queues": sql.Identifier(schema, "miniqueue_queues"),
            "processes": sql.Identifier(schema, "miniqueue_processes"),
            "counts": sql.Identifier(schema, "miniqueue_counts"),
            "finished_minutes": sql.Identifier(schema, "miniqueue_finished_minutes"),
            "limits": sql.Identifier(schema, "miniqueue_limits"),
            "tasks": sql.Identifier(schema, "miniqueue_tasks"),
            "served_queues": sql.Identifier(schema, "miniqueue_served_queues"),
            "settle_function": sql.Identifier(schema, "miniqueue_settle"),
            "retry_delay": sql.Identifier(schema, "miniqueue_retry_delay"),
            "finished_channel": sql.Literal(self.finished_channel),
            "queue_channel": sql.Literal(self.channel),
        }

        def compose(text: str, parts: dict[str, str]) -> sql.Composed:
            nested = {name: compose(part, parts) for name, part in parts.items() if "{" + name + "}" in text}
            return sql.SQL(text).format(**names, **nested)

        def render(text: str, **parts: str) -> str:
            common = {"columns": _JOB_COLUMNS, "fence": _FENCE}
            return compose(text, {**common, **parts}).as_string()

        def counting(text: str, rows: str, *, removed: bool = False, **parts: str) -> str:
            """``text`` with its {counted} CTEs counting the finished jobs in CTE ``rows`` (and, unless
            they are ``removed``, counting them in this minute's throughput)."""
            delta = "-count(*)" if removed else "count(*)"
            counted = _COUNTED if removed else _COUNTED_PER_MINUTE
            return render(text, counted=counted, count=_COUNT_FINISHED, count_minute=_COUNT_MINUTE, rows=rows,
                          delta=delta, **parts)  # fmt: skip

        def settling(text: str, rows: str, *, removed: bool = False, settled: str | None = None, **parts: str) -> str:
            """:func:`counting`, and the {settle} CTE settling the finished jobs of CTE
            ``settled`` (``rows`` unless given)."""
            return counting(text, rows, removed=removed, settle=_SETTLE, settling=settled or rows, settled=_SETTLED,
                            ended=_ENDED, unsuccessful=_UNSUCCESSFUL, **parts)  # fmt: skip

        self._enqueue, self._enqueue_limited = (
            render(_ENQUEUE, scoped=part, waiting="", waiting_values="") for part in ("", _SCOPED)
        )
        self._enqueue_waiting, self._enqueue_waiting_limited = (
            render(_ENQUEUE, scoped=part, waiting=_WAITING_COLUMNS, waiting_values=_WAITING_VALUES)
            for part in ("", _SCOPED)
        )
        self._lock_parents = render(_LOCK_PARENTS)
        self._link_dependent = render(_LINK_DEPENDENT)
        self._by_key = render(_BY_IDEMPOTENCY_KEY)
        self._enqueue_many, self._enqueue_many_limited = (render(_ENQUEUE_MANY, scoped=p) for p in ("", _SCOPED))
        self._draw_ids = render(_DRAW_IDS)
        self._copy_due, self._copy_scheduled, self._copy_due_traced, self._copy_scheduled_traced = (
            render(_COPY_JOBS, traced=t, scheduled=c) for t in ("", ", trace_context") for c in ("", ", scheduled_at")
        )
        self._notify_queues = render(_NOTIFY_QUEUES)
        picks = ((_PICK_ONE_QUEUE, _ONE_QUEUE, _SHARING_IN_ONE_QUEUE),
                 (_PICK_MANY_QUEUES, _MANY_QUEUES, _SHARING_ACROSS_QUEUES))  # fmt: skip
        self._claim_one, self._claim_many, self._claim_one_down, self._claim_many_down = (
            render(_CLAIM, claiming=_CLAIMING, pick=pick, claim_queues=queues, sharing=sharing,
                   freed=_FREED_NONE, past=_SWEEPS[down][0], order=_SWEEPS[down][1], room=_ROOM, held=_HELD,
                   touched=_TOUCHED, tokens=_TOKENS, kept=_KEPT_NONE)
            for down in (False, True) for pick, queues, sharing in picks
        )  # fmt: skip
        (self._complete_and_claim_one, self._complete_and_claim_many, self._complete_and_claim_one_down,
         self._complete_and_claim_many_down) = (
            settling(_COMPLETE_AND_CLAIM, "completed", completed=_COMPLETED, claiming=_CLAIMING, pick=pick,
                     claim_queues=queues, sharing=sharing, freed=_FREED_COMPLETING, past=_SWEEPS[down][0],
                     order=_SWEEPS[down][1], room=_ROOM, held=_HELD, touched=_TOUCHED, tokens=_TOKENS,
                     kept=_KEPT_COMPLETED)
            for down in (False, True) for pick, queues, sharing in picks
        )  # fmt: skip
        self._complete = settling(_COMPLETE, "completed", completed=_COMPLETED)
        self._renew = render(_RENEW)
        self._record_failures = settling(_RECORD_FAILURES, "failed", append=_APPEND_ERROR, table="j.", error="f.error")
        self._fail = settling(_FAIL, "failed", append=_APPEND_ERROR, table="", error="%(error)s::text")
        self._snooze = render(_SNOOZE)
        self._release = render(_RELEASE, append=_APPEND_ERROR, table="j.", error="r.note")
        self._recover = settling(_RECOVER_EXPIRED, "recovered", append=_APPEND_ERROR, table="",
                               error="'worker lost: lease expired without renewal'")  # fmt: skip
        self._leases_of = render(_LEASES_OF)
        self._requeue = counting(_REQUEUE, "requeued", removed=True)
        self._cancel = settling(_CANCEL, "cancelled")
        self._states = render(_STATES)
        self._get = render(_GET)
        self._result = render(_RESULT)
        self._await = render(_AWAIT)
        self._list = render(_LIST, filter=_JOB_FILTER)
        self._count_matching = render(_COUNT_MATCHING, filter=_JOB_FILTER)
        self._ids_matching = render(_IDS_MATCHING, filter=_JOB_FILTER)
        self._queue_stats = render(_QUEUE_STATS)
        self._recount = [render(statement) for statement in _RECOUNT]
        self._periodic_state = render(_PERIODIC_STATE)
        self._claim_slot = render(_CLAIM_SLOT)
        self._set_periodic_enabled = render(_SET_PERIODIC_ENABLED)
        self._publish_tasks = render(_PUBLISH_TASKS)
        self._serve_queues = render(_SERVE_QUEUES)
        self._task_declarations = render(_TASK_DECLARATIONS)
        self._unserved_queues = render(_UNSERVED_QUEUES)
        self._parent_results = render(_PARENT_RESULTS)
        self._set_paused = render(_SET_PAUSED)
        self._paused = render(_PAUSED)
        self._set_queue_limit = render(_SET_QUEUE_LIMIT)
        self._queue_limits = render(_QUEUE_LIMITS)
        self._limit_waits = render(_LIMIT_WAITS)
        self._known_queues = render(_KNOWN_QUEUES)
        self._known_queue_names = render(_KNOWN_QUEUE_NAMES)
        self._throughput = render(_THROUGHPUT)
        self._trim_minutes = render(_TRIM_MINUTES)
        self._delete = settling(_DELETE, "deleted", removed=True, settled="unfinished")
        self._upsert_processes = render(_UPSERT_PROCESSES)
        self._delete_processes = render(_DELETE_PROCESSES)
        self._processes = render(_PROCESSES)
        self._prune = counting(_PRUNE, "pruned", removed=True)
        self._schema_version = render(_SCHEMA_VERSION)
        self._jobs_churn = render(_JOBS_CHURN)
        self._vacuum_jobs = render(_VACUUM_JOBS)
        self._analyze_jobs = render(_ANALYZE_JOBS)
        self._versions_table = names["migrations"].as_string()
        self._migration_ddl = [render(q) for q in (_CREATE_SCHEMA, _CREATE_VERSIONS)]
        self._applied_versions = render(_APPLIED_VERSIONS)
        self._pin_search_path = render(_PIN_SEARCH_PATH)
        self._record_version = render(_RECORD_VERSION)

    # -- execution ------------------------------------------------------------------------------

    # A method only sync callers need (the worker's, the reaper's, the supervisor's) runs its
    # statement here, directly. A method an async caller needs too is written as steps
    # (``x_steps``, see miniqueue.steps), and its sync form runs them: ``run(conn, x_steps())``.

    @staticmethod
    def _rows(conn: Connection, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        with translate_errors():
            return fetch(conn, query, params)

    @staticmethod
    def _named_rows(conn: Connection, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Rows as dicts by column name (for every row shape but the claim's, where building a
        dict per job would cost the drain)."""
        with translate_errors(), conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, params)
            return cur.fetchall()

    @staticmethod
    def _rowcount(conn: Connection, query: str, params: dict[str, Any]) -> int:
        with translate_errors():
            cur = cursor_for(conn)
            cur.execute(query, params)
            return cur.rowcount

    # -- producing ------------------------------------------------------------------------------

    def enqueue(
        self, conn: Connection, job: NewJob, *, notify: bool = True, trace_context: str | None = None
    ) -> EnqueueResult:
        """Insert one validated job; a repeated idempotency key returns the first job's id.
        ``trace_context`` is the JSON text of the enqueuing span's context (miniqueue.tracing)."""
        return run(conn, self.enqueue_steps(job, notify=notify, trace_context=trace_context))

    def enqueue_steps(
        self, job: NewJob, *, notify: bool = True, trace_context: str | None = None
    ) -> Steps[EnqueueResult]:
        """:meth:`enqueue` as steps."""
        query = self._enqueue_limited if job.scopes else self._enqueue
        rows: list[tuple[Any, ...]] = yield Query(query, self._job_params(job, notify, trace_context))
        if rows:
            return EnqueueResult(id=rows[0][0], duplicate=rows[0][1])
        # Another transaction inserted the same key while we waited on it; our statement's
        # snapshot could not see that row, a new statement can.
        rows = yield Query(self._by_key, {"key": job.idempotency_key})
        return EnqueueResult(id=rows[0][0], duplicate=True)

    def _job_params(self, job: NewJob, notify: bool, trace_context: str | None) -> dict[str, Any]:
        """The parameters of _ENQUEUE for one job (with _SCOPED's when it has limits)."""
        params = {
            "queue": job.queue, "task": job.task, "payload": job.payload_json, "priority": job.priority,
            "max_attempts": job.max_attempts, "run_at": job.run_at, "delay": job.delay_seconds,
            "key": job.idempotency_key, "notify": notify, "channel": self.channel,
            "limits": [scope.name for scope in job.scopes] or None, "trace": trace_context,
        }  # fmt: skip
        return {**params, **_scope_columns(job.scopes)} if job.scopes else params

    def enqueue_waiting(
        self,
        conn: Connection,
        job: NewJob,
        parents: Sequence[int],
        *,
        notify: bool = True,
        trace_context: str | None = None,
    ) -> EnqueueResult:
        """Insert one validated job that runs only once every job of ``parents`` completed.

        In one transaction (a savepoint inside the caller's): the parents are locked and read;
        an id that does not exist, or names a job that already ended failed, dead or cancelled,
        raises InvalidInput and nothing is stored. The job is ``waiting`` on the parents not
        completed yet (``available`` at once if all are), and each parent's row lists it as a
        dependent. Parents must exist before the job that names them, so every dependency
        points to an older job and no cycle can form. A repeated idempotency key returns the
        first job's id and links nothing (the first job keeps its own parents).
        """
        return run(conn, self.enqueue_waiting_steps(job, parents, notify=notify, trace_context=trace_context))

    def enqueue_waiting_steps(
        self, job: NewJob, parents: Sequence[int], *, notify: bool = True, trace_context: str | None = None
    ) -> Steps[EnqueueResult]:
        """:meth:`enqueue_waiting` as steps."""
        return atomic(self._enqueue_waiting_in_one(job, list(dict.fromkeys(parents)), notify, trace_context))

    def _enqueue_waiting_in_one(
        self, job: NewJob, ids: list[int], notify: bool, trace_context: str | None
    ) -> Steps[EnqueueResult]:
        locked: list[tuple[Any, ...]] = yield Query(self._lock_parents, {"ids": ids})
        states = {row[0]: State(row[1]) for row in locked}
        _check_parents(ids, states)
        pending = sum(1 for job_id in ids if states[job_id] is not State.COMPLETED)
        params = {**self._job_params(job, notify and not pending, trace_context), "parents": ids, "pending": pending}
        rows: list[tuple[Any, ...]] = yield Query(
            self._enqueue_waiting_limited if job.scopes else self._enqueue_waiting, params
        )
        if not rows:  # the holder of its idempotency key committed while we waited on it
            found: list[tuple[Any, ...]] = yield Query(self._by_key, {"key": job.idempotency_key})
            return EnqueueResult(id=found[0][0], duplicate=True)
        result = EnqueueResult(id=rows[0][0], duplicate=rows[0][1])
        if not result.duplicate:
            yield Query(self._link_dependent, {"child": result.id, "parents": ids})
        return result

    def enqueue_many(
        self, conn: Connection, jobs: Sequence[NewJob], *, notify: bool = True, trace_context: str | None = None
    ) -> list[EnqueueResult]:
        """Insert many validated jobs in one statement; results are in input order. Every job
        stores ``trace_context`` (see :meth:`enqueue`).

        Idempotency keys are honoured against stored jobs and within the batch (the first
        occurrence wins). A large batch without keys goes faster by :meth:`copy_many`.
        """
        return run(conn, self.enqueue_many_steps(jobs, notify=notify, trace_context=trace_context))

    def enqueue_many_steps(
        self, jobs: Sequence[NewJob], *, notify: bool = True, trace_context: str | None = None
    ) -> Steps[list[EnqueueResult]]:
        """:meth:`enqueue_many` as steps."""
        if not jobs:
            return []
        keys = [j.idempotency_key for j in jobs]
        limited = any(j.scopes for j in jobs)
        run_ats = [j.run_at for j in jobs]
        delays = [j.delay_seconds for j in jobs]
        params = {
            "table": self.table_name,
            "queues": [j.queue for j in jobs], "tasks": [j.task for j in jobs],
            "payloads": [j.payload_json for j in jobs], "priorities": [j.priority for j in jobs],
            "max_attempts": [j.max_attempts for j in jobs],
            # A column every job leaves at its default goes as an empty array, which unnest()
            # pads with NULLs: most batches schedule nothing and carry no keys.
            "run_ats": run_ats if any(run_ats) else [], "delays": delays if any(delays) else [],
            "keys": keys if any(keys) else [],
            "limits": ["\x1f".join(scope.name for scope in j.scopes) or None for j in jobs] if limited else [],
            "notify": notify, "channel": self.channel, "trace": trace_context,
        }  # fmt: skip
        if limited:
            params.update(_scope_columns({scope.name: scope for j in jobs for scope in j.scopes}.values()))
        query = self._enqueue_many_limited if limited else self._enqueue_many
        rows: list[tuple[Any, ...]] = yield Query(query, params)
        results = [EnqueueResult(id=row[1], duplicate=row[2]) for row in rows]
        for i, result in enumerate(results):
            if result.id is None:  # the holder of the key committed while we waited on it
                held: list[tuple[Any, ...]] = yield Query(self._by_key, {"key": jobs[i].idempotency_key})
                results[i] = EnqueueResult(id=held[0][0], duplicate=True)
        return results

    def copy_many(
        self,
        conn: Connection,
        count: int,
        jobs: Iterable[NewJob],
        *,
        scheduled: bool,
        notify: bool = True,
        trace_context: str | None = None,
    ) -> list[EnqueueResult]:
        """Insert ``count`` jobs without idempotency keys by COPY, in one transaction; results are
        in input order. Each queue given a job that is due at once is notified.

        ``jobs`` is consumed as the rows stream to the server, so a caller can check each job
        as it goes (its checks then overlap the server's inserts): an exception from it aborts
        the COPY and stores nothing. Unless ``scheduled`` (some job has a ``run_at`` or a
        delay), scheduled_at is left to its default, now(): parsing 10,000 timestamps cost the
        server a tenth of the COPY. Every job stores ``trace_context`` (see :meth:`enqueue`).
        """
        return run(conn, self.copy_many_steps(count, jobs, scheduled=scheduled, notify=notify,
                                              trace_context=trace_context))  # fmt: skip

    def copy_many_steps(
        self, count: int, jobs: Iterable[NewJob], *, scheduled: bool, notify: bool = True,
        trace_context: str | None = None,
    ) -> Steps[list[EnqueueResult]]:  # fmt: skip
        """:meth:`copy_many` as steps."""
        return atomic(self._copy_many(count, jobs, scheduled, notify, trace_context))

    def _copy_many(
        self, count: int, jobs: Iterable[NewJob], scheduled: bool, notify: bool, trace_context: str | None
    ) -> Steps[list[EnqueueResult]]:
        drawn: list[tuple[Any, ...]] = yield Query(self._draw_ids, {"table": self.table_name, "count": count})
        [(now, ids)] = drawn
        ids.sort()  # one session's nextval() only grows: already in order, so this costs nothing
        due: set[str] = set()
        if trace_context is None:
            statement = self._copy_scheduled if scheduled else self._copy_due
        else:
            statement = self._copy_scheduled_traced if scheduled else self._copy_due_traced
        yield CopyIn(statement, _copy_rows(ids, jobs, now, scheduled, due, trace_context))
        if notify and due:
            yield Query(self._notify_queues, {"channel": self.channel, "queues": sorted(due)})
        return [EnqueueResult(id=job_id) for job_id in ids]

    def set_custom_plans(self, conn: Connection, on: bool) -> None:
        """Make ``conn`` plan every statement for its parameters (``on``), or let PostgreSQL
        choose a generic plan for a prepared statement again (see the worker's use)."""
        with translate_errors():
            conn.execute(_CUSTOM_PLANS if on else _DEFAULT_PLANS)

    def listen(self, conn: Connection) -> None:
        """Subscribe ``conn`` to this schema's enqueue notifications (payload: the queue name)."""
        with translate_errors():
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))

    def listen_finished_steps(self) -> Steps[None]:
        """Subscribe the connection to the notifications of awaited jobs that finish (payload:
        the id)."""
        yield Query(sql.SQL("LISTEN {}").format(sql.Identifier(self.finished_channel)).as_string())

    def await_job_steps(self, job_id: int) -> Steps[None]:
        """Ask that the statement finishing ``job_id`` notify :attr:`finished_channel`.

        Listen first, then call this, then read the job's state: a completion either saw the
        flag (it read the row after this committed, or waited on the row lock this took and
        then read its newest version) and notifies, or committed before, and the read that
        follows sees the job finished. Jobs nobody awaits send nothing.
        """
        yield Query(self._await, {"id": job_id})

    def result(self, conn: Connection, job_id: int) -> tuple[State, Any, str | None]:
        """A job's state, result (None unless completed with one) and last error; raise JobNotFound."""
        return run(conn, self.result_steps(job_id))

    def result_steps(self, job_id: int) -> Steps[tuple[State, Any, str | None]]:
        """:meth:`result` as steps."""
        rows: list[tuple[Any, ...]] = yield Query(self._result, {"id": job_id})
        if not rows:
            raise JobNotFound(job_id)
        return State(rows[0][0]), rows[0][1], rows[0][2]

    # -- worker side ----------------------------------------------------------------------------

    def claim(
        self,
        conn: Connection,
        queues: Sequence[str],
        worker_id: str,
        lease_seconds: float,
        limit: int,
        *,
        after: Sequence[str] = (),
        descending: bool = False,
    ) -> list[Lease]:
        """Lease up to ``limit`` available jobs from ``queues``, best first.

        Order: priority (higher first), then scheduled time, then id. Jobs scheduled in the
        future are invisible. Each claimed job is ``running``, leased to ``worker_id`` until
        ``now() + lease_seconds``, its ``attempt`` one higher.

        Jobs with limits are claimed only where every limit they name has room, and a queue
        with a cap gives no more jobs than its free slots. Limited jobs are taken group by
        group (jobs naming the same limits form a group), priority first within a group; a
        claim looks at the groups after ``after`` (the limits of the last limited job the
        caller claimed, so that successive claims go round every group): in the order of their
        limits, or ``descending`` (from the last group when ``after`` is empty).
        """
        if not queues or limit < 1:
            return []
        query, params = self._claim_query(
            queues, worker_id, lease_seconds, limit, combined=False, after=after, descending=descending
        )
        return _in_claim_order(Lease(*row) for row in self._rows(conn, query, params))

    def complete_and_claim(
        self,
        conn: Connection,
        worker_id: str,
        completions: Iterable[tuple[int, int]],
        queues: Sequence[str],
        lease_seconds: float,
        limit: int,
        *,
        after: Sequence[str] = (),
        descending: bool = False,
        results: Mapping[int, str] | None = None,
    ) -> tuple[set[int], list[Lease]]:
        """:meth:`complete_many` and :meth:`claim` in one statement (one round trip, one commit).

        The groups of the limited jobs it completes are looked at before the others (their next
        jobs, as far as their limits allow, go to the same worker), and do not move along the
        groups after ``after``: see the README's "Limits" section.
        Returns the ids completed (those whose lease was still held) and the new leases.
        """
        ids, attempts = _columns(completions)
        query, params = self._claim_query(
            queues, worker_id, lease_seconds, max(limit, 0), combined=True, after=after, descending=descending
        )
        rows = self._rows(conn, query, {**params, "ids": ids, "attempts": attempts, "results": _aligned(ids, results)})
        completed = set(rows[0][0] or ()) if rows else set()
        return completed, _in_claim_order(Lease(*row[1:]) for row in rows if row[1] is not None)

    def _claim_query(
        self,
        queues: Sequence[str],
        worker_id: str,
        lease_seconds: float,
        limit: int,
        *,
        combined: bool,
        after: Sequence[str],
        descending: bool,
    ) -> tuple[str, dict[str, Any]]:
        queues = list(dict.fromkeys(queues))  # a queue named twice would claim its rows twice over
        if not queues:
            raise InvalidInput("claim needs at least one queue")
        # Going down, the first group is the last: an array with a NULL sorts after every other.
        start: list[str | None] = [*after] or ([None] if descending else [])
        params: dict[str, Any] = {
            "worker": worker_id, "lease": float(lease_seconds), "limit": limit, "after": start,
            # Groups taken into admission: enough to fill the claim with one job per group, and a
            # few more for groups whose room was taken meanwhile (their scope rows stay locked
            # while the claim runs, so a small claim takes few more than it needs); and groups
            # seen at most per queue, those passed over (full, or locked by another claim) included.
            "groups": min(limit, MAX_GROUPS_PER_CLAIM) + min(limit, 16),
            "scan": 4 * (min(limit, MAX_GROUPS_PER_CLAIM) + 16),
            # Of which the groups of the jobs being completed take at most one per job claimed:
            # the sweep keeps the rest.
            "kept": min(limit, MAX_GROUPS_PER_CLAIM),
        }  # fmt: skip
        if len(queues) == 1:
            params["queue"] = queues[0]
            if combined:
                return (self._complete_and_claim_one_down if descending else self._complete_and_claim_one), params
            return (self._claim_one_down if descending else self._claim_one), params
        params["queues"] = queues
        if combined:
            return (self._complete_and_claim_many_down if descending else self._complete_and_claim_many), params
        return (self._claim_many_down if descending else self._claim_many), params

    def complete_many(
        self,
        conn: Connection,
        worker_id: str,
        leases: Iterable[tuple[int, int]],
        *,
        results: Mapping[int, str] | None = None,
    ) -> set[int]:
        """Complete every ``(job id, attempt)`` still leased to ``worker_id``; return those ids.

        ``results`` maps a job id to its result as JSON text (validated: see
        :func:`~miniqueue.validation.encode_result`); a job it leaves out has none. Dependents
        whose last parent this completes become available in the same statement. An id missing
        from the result lost its lease: its completion (and its result) did not happen.
        """
        return run(conn, self.complete_many_steps(worker_id, leases, results=results))

    def complete_many_steps(
        self, worker_id: str, leases: Iterable[tuple[int, int]], *, results: Mapping[int, str] | None = None
    ) -> Steps[set[int]]:
        """:meth:`complete_many` as steps."""
        ids, attempts = _columns(leases)
        if not ids:
            return set()
        params = {"ids": ids, "attempts": attempts, "worker": worker_id, "results": _aligned(ids, results)}
        rows: list[tuple[Any, ...]] = yield Query(self._complete, params)
        return {row[0] for row in rows}

    def complete(
        self, conn: Connection, job_id: int, worker_id: str, attempt: int, *, result: str | None = None
    ) -> None:
        """Complete one job (with ``result``, JSON text); raise LeaseLost if ``worker_id`` no
        longer holds that attempt."""
        run(conn, self.complete_steps(job_id, worker_id, attempt, result=result))

    def complete_steps(self, job_id: int, worker_id: str, attempt: int, *, result: str | None = None) -> Steps[None]:
        """:meth:`complete` as steps (``job.atransaction()`` runs them on its async connection)."""
        results = None if result is None else {job_id: result}
        if not (yield from self.complete_many_steps(worker_id, [(job_id, attempt)], results=results)):
            raise LeaseLost(job_id, worker_id, attempt)

    def renew_leases(
        self, conn: Connection, worker_id: str, leases: Iterable[tuple[int, int]], lease_seconds: float
    ) -> dict[int, dt.datetime]:
        """Extend every lease still held to ``now() + lease_seconds``; return id → new expiry."""
        ids, attempts = _columns(leases)
        if not ids:
            return {}
        params = {"ids": ids, "attempts": attempts, "worker": worker_id, "lease": float(lease_seconds)}
        return {row[0]: row[1] for row in self._rows(conn, self._renew, params)}

    def renew_lease(
        self, conn: Connection, job_id: int, worker_id: str, attempt: int, lease_seconds: float
    ) -> dt.datetime:
        """Extend one lease; return its new expiry, or raise LeaseLost."""
        renewed = self.renew_leases(conn, worker_id, [(job_id, attempt)], lease_seconds)
        if job_id not in renewed:
            raise LeaseLost(job_id, worker_id, attempt)
        return renewed[job_id]

    def record_failures(self, conn: Connection, worker_id: str, failures: Sequence[Failure]) -> dict[int, State]:
        """Record failed attempts; return id → new state (``available`` or ``dead``) for those still held."""
        if not failures:
            return {}
        params = {
            "ids": [f.id for f in failures], "attempts": [f.attempt for f in failures],
            "errors": [f.error for f in failures],
            "backoffs": [None if f.backoff_seconds is None else float(f.backoff_seconds) for f in failures],
            "worker": worker_id, "base": DEFAULT_BASE_SECONDS, "cap": DEFAULT_CAP_SECONDS,
        }  # fmt: skip
        return {row[0]: State(row[1]) for row in self._rows(conn, self._record_failures, params)}

    def record_failure(
        self, conn: Connection, job_id: int, worker_id: str, attempt: int, error: str, backoff_seconds: float
    ) -> State:
        """Record one failed attempt: ``available`` again after the backoff, or ``dead`` at max attempts.

        Raises LeaseLost if ``worker_id`` no longer holds that attempt.
        """
        states = self.record_failures(conn, worker_id, [Failure(job_id, attempt, error, backoff_seconds)])
        if job_id not in states:
            raise LeaseLost(job_id, worker_id, attempt)
        return states[job_id]

    def fail(self, conn: Connection, job_id: int, worker_id: str, attempt: int, error: str) -> None:
        """Fail a job permanently (state ``failed``, no retry); raise LeaseLost if not held."""
        params = {"id": job_id, "attempt": attempt, "worker": worker_id, "error": error}
        if not self._rows(conn, self._fail, params):
            raise LeaseLost(job_id, worker_id, attempt)

    def snooze(self, conn: Connection, job_id: int, worker_id: str, attempt: int, delay_seconds: float) -> None:
        """Make a job available again after ``delay_seconds`` without spending an attempt."""
        params = {"id": job_id, "attempt": attempt, "worker": worker_id, "delay": float(delay_seconds)}
        if not self._rows(conn, self._snooze, params):
            raise LeaseLost(job_id, worker_id, attempt)

    def release(self, conn: Connection, worker_id: str, releases: Sequence[Release]) -> set[int]:
        """Hand leases back without spending an attempt: each job is available again at once,
        its budget of attempts unchanged, and its history notes why. Returns the ids still held
        (and so released)."""
        if not releases:
            return set()
        params = {
            "ids": [r.id for r in releases], "attempts": [r.attempt for r in releases],
            "notes": [r.note for r in releases], "worker": worker_id,
        }  # fmt: skip
        return {row[0] for row in self._rows(conn, self._release, params)}

    def leases_of(self, conn: Connection, worker_id: str) -> list[tuple[int, int]]:
        """The ``(job id, attempt)`` of every job currently leased to ``worker_id``."""
        return [(row[0], row[1]) for row in self._rows(conn, self._leases_of, {"worker": worker_id})]

    # -- maintenance ----------------------------------------------------------------------------

    def recover_expired_leases(self, conn: Connection, limit: int = 1000) -> dict[int, State]:
        """Return up to ``limit`` jobs whose lease expired to ``available`` (or ``dead`` when their
        attempts are exhausted); return id → new state."""
        params = {"limit": limit, "base": DEFAULT_BASE_SECONDS, "cap": DEFAULT_CAP_SECONDS}
        return {row[0]: State(row[1]) for row in self._rows(conn, self._recover, params)}

    def prune(self, conn: Connection, states: Iterable[State], older_than_seconds: float, limit: int = 1000) -> int:
        """Delete up to ``limit`` jobs in ``states`` (terminal states only) that finished more than
        ``older_than_seconds`` ago; return how many were deleted."""
        return run(conn, self.prune_steps(states, older_than_seconds, limit))

    def prune_steps(self, states: Iterable[State], older_than_seconds: float, limit: int = 1000) -> Steps[int]:
        """:meth:`prune` as steps."""
        chosen = sorted(State(s).value for s in states)
        if not chosen or any(State(s) not in TERMINAL_STATES for s in chosen):
            raise InvalidInput(f"prune states {chosen} are invalid: choose among completed, failed, dead, cancelled")
        older_than_seconds = check_seconds("prune age", older_than_seconds)
        params = {"states": chosen, "age": float(older_than_seconds), "limit": limit}
        rows: list[tuple[Any, ...]] = yield Query(self._prune, params)
        return int(rows[0][0])

    # -- operator side --------------------------------------------------------------------------

    def requeue(self, conn: Connection, job_ids: Sequence[int]) -> list[int]:
        """Make the given ``failed``, ``dead`` or ``cancelled`` jobs available now.

        ``attempt`` is kept (it is the fencing token and must never repeat) and ``max_attempts``
        is raised to ``attempt + <the attempts the job was enqueued with>``, so the job gets its
        full budget again. Raises JobNotFound or InvalidTransition (naming the state) if any id
        cannot be requeued; then nothing is requeued.
        """
        return run(conn, self.requeue_steps(job_ids))

    def requeue_steps(self, job_ids: Sequence[int]) -> Steps[list[int]]:
        """:meth:`requeue` as steps."""
        return atomic(self._apply_to_all(job_ids, self._requeue, _requeue_filter(REQUEUEABLE_STATES), "requeue",
                                         REQUEUEABLE_STATES))  # fmt: skip

    def requeue_matching(
        self, conn: Connection, states: Iterable[State], *, queue: str | None = None, task: str | None = None
    ) -> int:
        """Requeue every job in ``states`` (failed/dead/cancelled), optionally of one queue or task."""
        return run(conn, self.requeue_matching_steps(states, queue=queue, task=task))

    def requeue_matching_steps(
        self, states: Iterable[State], *, queue: str | None = None, task: str | None = None
    ) -> Steps[int]:
        """:meth:`requeue_matching` as steps."""
        chosen = {State(s) for s in states}
        if not chosen or not chosen <= REQUEUEABLE_STATES:
            raise InvalidInput(f"requeue states {sorted(s.value for s in chosen)} are invalid: choose among "
                               "failed, dead, cancelled")  # fmt: skip
        params = {**_requeue_filter(chosen), "ids": None, "queue": queue, "task": task}
        rows: list[tuple[Any, ...]] = yield Query(self._requeue, params)
        return len(rows)

    def cancel(self, conn: Connection, job_ids: Sequence[int]) -> list[int]:
        """Cancel the given ``available``, ``running`` or ``waiting`` jobs.

        A running job's lease ends at once: its worker's next heartbeat or completion finds the
        lease gone and tells the handler to stop; its outcome is discarded. Jobs waiting for a
        cancelled job are cancelled too (and theirs), each with an error naming its parent.
        Raises JobNotFound or InvalidTransition if any id cannot be cancelled; then nothing is
        cancelled.
        """
        return run(conn, self.cancel_steps(job_ids))

    def cancel_steps(self, job_ids: Sequence[int]) -> Steps[list[int]]:
        """:meth:`cancel` as steps."""
        return atomic(self._apply_to_all(job_ids, self._cancel, {}, "cancel", CANCELLABLE_STATES))

    def _apply_to_all(
        self, job_ids: Sequence[int], query: str, params: dict[str, Any], verb: str, allowed: frozenset[State]
    ) -> Steps[list[int]]:
        """Run ``query`` on every id (once each), and fail (rolling back) unless it applied to all."""
        ids = list(dict.fromkeys(job_ids))
        rows: list[tuple[Any, ...]] = yield Query(query, {**params, "ids": ids})
        done = {row[0] for row in rows}
        missing = [i for i in ids if i not in done]
        if not missing:
            return ids
        found: list[tuple[Any, ...]] = yield Query(self._states, {"ids": missing})
        states = {row[0]: row[1] for row in found}
        for job_id in missing:
            if job_id not in states:
                raise JobNotFound(job_id)
        job_id = missing[0]
        names = ", ".join(sorted(s.value for s in allowed))
        past = "cancelled" if verb == "cancel" else f"{verb}d"
        raise InvalidTransition(f"cannot {verb} job {job_id}: it is {states[job_id]}; only {names} jobs can be {past}")

    def states(self, conn: Connection, job_ids: Sequence[int]) -> dict[int, State]:
        """The current state of each given job that exists."""
        return {job_id: state for job_id, (state, _) in self.states_and_attempts(conn, job_ids).items()}

    def states_and_attempts(self, conn: Connection, job_ids: Sequence[int]) -> dict[int, tuple[State, int]]:
        """The current state and attempt number of each given job that exists."""
        return {row[0]: (State(row[1]), row[2]) for row in self._rows(conn, self._states, {"ids": list(job_ids)})}

    def get(self, conn: Connection, job_id: int) -> JobRecord:
        """Every column of one job, with its error history; raise JobNotFound if absent."""
        return run(conn, self.get_steps(job_id))

    def get_steps(self, job_id: int) -> Steps[JobRecord]:
        """:meth:`get` as steps."""
        rows: list[dict[str, Any]] = yield Query(self._get, {"id": job_id}, named=True)
        if not rows:
            raise JobNotFound(job_id)
        return _record(rows[0])

    def list_jobs(
        self, conn: Connection, *, before_id: int | None = None, limit: int = 50, **filters: Any
    ) -> list[JobRecord]:
        """Jobs matching ``filters`` (see :func:`job_filter`), newest first; pass the last id seen
        as ``before_id`` for the next page (keyset pagination stays fast however deep)."""
        return run(conn, self.list_jobs_steps(before_id=before_id, limit=limit, **filters))

    def list_jobs_steps(
        self, *, before_id: int | None = None, limit: int = 50, **filters: Any
    ) -> Steps[list[JobRecord]]:
        """:meth:`list_jobs` as steps."""
        params = {**job_filter(**filters), "before": before_id, "limit": limit}
        rows: list[dict[str, Any]] = yield Query(self._list, params, named=True)
        return [_record(row) for row in rows]

    def count_jobs(self, conn: Connection, **filters: Any) -> int:
        """How many jobs match ``filters`` (see :func:`job_filter`)."""
        return int(self._rows(conn, self._count_matching, job_filter(**filters))[0][0])

    def job_ids(self, conn: Connection, *, limit: int = 100_000, **filters: Any) -> list[int]:
        """The ids of up to ``limit`` jobs matching ``filters``, oldest first."""
        return [row[0] for row in self._rows(conn, self._ids_matching, {**job_filter(**filters), "limit": limit})]

    def queue_stats(self, conn: Connection) -> list[QueueStats]:
        """Per queue: counts by state, scheduled jobs, oldest waiting job's age, expired leases."""
        return run(conn, self.queue_stats_steps())

    def queue_stats_steps(self) -> Steps[list[QueueStats]]:
        """:meth:`queue_stats` as steps."""
        stats = []
        rows: list[dict[str, Any]] = yield Atomic(_monitoring(Query(self._queue_stats, {}, named=True)))
        for row in rows:
            oldest = row["oldest_available_seconds"]
            stats.append(QueueStats(
                queue=row["queue"], counts={state: int(row[state.value]) for state in _STATE_ORDER},
                scheduled=int(row["scheduled"]), oldest_available_seconds=None if oldest is None else float(oldest),
                expired_leases=int(row["expired_leases"]),
            ))  # fmt: skip
        return stats

    def now(self, conn: Connection) -> dt.datetime:
        """The database's clock."""
        return run(conn, self.now_steps())

    def now_steps(self) -> Steps[dt.datetime]:
        """:meth:`now` as steps."""
        rows: list[tuple[Any, ...]] = yield Query(_NOW, {})
        value: dt.datetime = rows[0][0]
        return value

    def periodic_state(self, conn: Connection) -> dict[str, tuple[dt.datetime, bool]]:
        """Each periodic schedule's last enqueued slot and whether it is enabled."""
        return run(conn, self.periodic_state_steps())

    def periodic_state_steps(self) -> Steps[dict[str, tuple[dt.datetime, bool]]]:
        """:meth:`periodic_state` as steps."""
        rows: list[tuple[Any, ...]] = yield Query(self._periodic_state, {})
        return {row[0]: (row[1], row[2]) for row in rows}

    def claim_periodic_slot(self, conn: Connection, name: str, slot: dt.datetime) -> bool:
        """Advance schedule ``name`` to ``slot``; True only for the one caller that did (and only
        if the schedule is enabled). Run it in the transaction that enqueues the slot's job."""
        return bool(self._rows(conn, self._claim_slot, {"name": name, "slot": slot}))

    def set_periodic_enabled(self, conn: Connection, name: str, enabled: bool) -> bool:
        """Enable or disable periodic schedule ``name``. Returns True if no scheduler had run it
        yet (so callers can point out a possible typo); it then starts in that state."""
        return run(conn, self.set_periodic_enabled_steps(name, enabled))

    def set_periodic_enabled_steps(self, name: str, enabled: bool) -> Steps[bool]:
        """:meth:`set_periodic_enabled` as steps."""
        rows: list[tuple[Any, ...]] = yield Query(self._set_periodic_enabled, {"name": name, "enabled": enabled})
        return bool(rows[0][0])

    def set_queue_paused(self, conn: Connection, queue: str, paused: bool) -> None:
        """Pause (no worker anywhere claims from it) or resume a queue."""
        run(conn, self.set_queue_paused_steps(queue, paused))

    def publish_tasks(self, conn: Connection, declarations: Sequence[TaskDeclaration], queues: Sequence[str]) -> None:
        """Publish an app's task declarations, and record that a worker serves ``queues``."""
        run(conn, atomic(self.publish_tasks_steps(declarations, queues)))

    def publish_tasks_steps(self, declarations: Sequence[TaskDeclaration], queues: Sequence[str] = ()) -> Steps[None]:
        """:meth:`publish_tasks` as steps (to run in one transaction)."""
        ordered = sorted(declarations)
        yield Query(self._publish_tasks, {
            "tasks": [d.task for d in ordered], "queues": [d.queue for d in ordered],
            "priorities": [d.priority for d in ordered], "max_attempts": [d.max_attempts for d in ordered],
            "concurrency_keys": [d.concurrency_key for d in ordered],
            "concurrency_computed": [d.concurrency_key_computed for d in ordered],
            "max_concurrent": [d.max_concurrent for d in ordered], "rate_limits": [d.rate_limit for d in ordered],
            "rate_limit_keys": [d.rate_limit_key for d in ordered],
            "rate_computed": [d.rate_limit_key_computed for d in ordered],
            "backoff_bases": [d.backoff_base for d in ordered], "backoff_caps": [d.backoff_cap for d in ordered],
        })  # fmt: skip
        if queues:
            yield Query(self._serve_queues, {"queues": sorted(set(queues))})

    def task_declarations_steps(self) -> Steps[dict[str, TaskDeclaration]]:
        """Every published task declaration, by task name."""
        rows: list[tuple[Any, ...]] = yield Query(self._task_declarations)
        return {row[0]: TaskDeclaration(*row) for row in rows}

    def parent_results(self, conn: Connection, parents: Sequence[int]) -> list[tuple[int, Any]]:
        """Each of ``parents``' results, in their order (pruned parents left out)."""
        return [(row[0], row[1]) for row in self._rows(conn, self._parent_results, {"ids": list(parents)})]

    def unserved_queues_steps(self, queues: Sequence[str]) -> Steps[list[str]]:
        """Which of ``queues`` no worker has ever served."""
        rows: list[tuple[str]] = yield Query(self._unserved_queues, {"queues": list(queues)})
        return [row[0] for row in rows]

    def set_queue_paused_steps(self, queue: str, paused: bool) -> Steps[None]:
        """:meth:`set_queue_paused` as steps."""
        yield Query(self._set_paused, {"name": check_queue_name(queue), "paused": paused})

    def paused_queues(self, conn: Connection) -> list[str]:
        """The queues currently paused."""
        return run(conn, self.paused_queues_steps())

    def set_queue_limit(self, conn: Connection, queue: str, max_running: int | None) -> None:
        """Cap the running jobs of ``queue`` across every worker (None lifts the cap)."""
        run(conn, self.set_queue_limit_steps(queue, max_running))

    def set_queue_limit_steps(self, queue: str, max_running: int | None) -> Steps[None]:
        """:meth:`set_queue_limit` as steps."""
        name = check_queue_name(queue)
        yield Query(self._set_queue_limit, {"name": name, "max": max_running, "scope": queue_scope(name)})

    def queue_limits(self, conn: Connection) -> dict[str, int]:
        """The queues with a cap on running jobs, and their caps."""
        return run(conn, self.queue_limits_steps())

    def queue_limits_steps(self) -> Steps[dict[str, int]]:
        """:meth:`queue_limits` as steps."""
        rows: list[tuple[Any, ...]] = yield Query(self._queue_limits, {})
        return {row[0]: row[1] for row in rows}

    def limit_waits(self, conn: Connection, limit: int = 100) -> list[LimitWait]:
        """The limits that jobs wait on or hold slots of, most waiting first, then most held (at
        most ``limit``)."""
        return run(conn, self.limit_waits_steps(limit))

    def limit_waits_steps(self, limit: int = 100) -> Steps[list[LimitWait]]:
        """:meth:`limit_waits` as steps."""
        rows: list[tuple[Any, ...]] = yield from atomic(_monitoring(Query(self._limit_waits, {"limit": limit})))
        return [LimitWait(*row) for row in rows]

    def paused_queues_steps(self) -> Steps[list[str]]:
        """:meth:`paused_queues` as steps."""
        rows: list[tuple[Any, ...]] = yield Query(self._paused, {})
        return [row[0] for row in rows]

    def known_queues_steps(self, names: Sequence[str]) -> Steps[set[str]]:
        """Those of ``names`` that are known: paused or resumed before, or with a job waiting or running."""
        rows: list[tuple[Any, ...]] = yield Query(self._known_queues, {"names": list(names)})
        return {row[0] for row in rows}

    def known_queue_names_steps(self, limit: int = 100) -> Steps[list[str]]:
        """Up to ``limit`` known queue names (see :meth:`known_queues_steps`), in order."""
        rows: list[tuple[Any, ...]] = yield Query(self._known_queue_names, {"limit": limit})
        return [row[0] for row in rows]

    def throughput(self, conn: Connection) -> list[tuple[dt.datetime, State, int]]:
        """Jobs finished per minute over the last hour: ``(minute, state, count)`` (read from the
        per-minute counts the finishing statements keep, at the same cost under any load)."""
        return [(row[0], State(row[1]), int(row[2])) for row in self._rows(conn, self._throughput, {})]

    def trim_throughput(self, conn: Connection) -> None:
        """Drop the per-minute counts older than the chart shows (two hours)."""
        with translate_errors():
            conn.execute(self._trim_minutes)

    def delete(self, conn: Connection, job_ids: Sequence[int]) -> list[int]:
        """Delete jobs that are not running; return the ids deleted (a running job is left alone:
        cancel it first)."""
        return sorted(row[0] for row in self._rows(conn, self._delete, {"ids": list(job_ids)}))

    def register_processes(
        self, conn: Connection, supervisor: str, host: str, processes: Sequence[ProcessInfo]
    ) -> None:
        """Replace supervisor ``supervisor``'s rows of the process registry with ``processes``."""
        params = {
            "supervisor": supervisor, "host": host, "ids": [p.id for p in processes],
            "kinds": [p.kind for p in processes], "pids": [p.pid for p in processes],
            "titles": [p.title for p in processes], "started": [p.started_at for p in processes],
            "rss": [p.rss_bytes for p in processes], "done": [p.jobs_done for p in processes],
            "restarts": [p.restarts for p in processes],
            "current": ["{" + ",".join(str(j) for j in p.current_jobs) + "}" for p in processes],
        }  # fmt: skip
        self._rowcount(conn, self._upsert_processes, params)

    def unregister_processes(self, conn: Connection, supervisor: str) -> None:
        """Remove a supervisor's rows (it is stopping)."""
        self._rowcount(conn, self._delete_processes, {"supervisor": supervisor})

    def processes(self, conn: Connection, max_age_seconds: float = 60.0) -> list[ProcessInfo]:
        """Every process registered by a supervisor within the last ``max_age_seconds``."""
        rows = self._named_rows(conn, self._processes, {"max_age": float(max_age_seconds)})
        return [ProcessInfo(**{**row, "current_jobs": tuple(row["current_jobs"])}) for row in rows]

    def recount(self, conn: Connection) -> None:
        """Recount finished jobs from the jobs table (see ``_RECOUNT``): O(table), for repair only."""
        run(conn, self.recount_steps())

    def recount_steps(self) -> Steps[None]:
        """:meth:`recount` as steps."""
        yield Atomic(_each(self._recount))

    def counts(self, conn: Connection) -> list[QueueCount]:
        """How many jobs each queue holds in each state (states with no jobs are omitted)."""
        return run(conn, self.counts_steps())

    def counts_steps(self) -> Steps[list[QueueCount]]:
        """:meth:`counts` as steps."""
        stats = yield from self.queue_stats_steps()
        return [
            QueueCount(queue=q.queue, state=state, count=n)
            for q in stats for state, n in sorted(q.counts.items()) if n
        ]  # fmt: skip

    # -- schema -----------------------------------------------------------------------------------

    def schema_version(self, conn: Connection) -> int:
        """The newest migration applied to this schema, or 0 if none is."""
        if not self._rows(conn, _HAS_VERSIONS, {"versions": self._versions_table})[0][0]:
            return 0
        return int(self._rows(conn, self._schema_version, {})[0][0])

    def jobs_churn(self, conn: Connection) -> JobsChurn:
        """The jobs table's statistics, as the reaper's upkeep reads them (see :class:`JobsChurn`)."""
        return JobsChurn(**self._named_rows(conn, self._jobs_churn, {"table": self.table_name})[0])

    def vacuum_jobs(self, conn: Connection, *, analyze_only: bool = False) -> None:
        """VACUUM and ANALYZE the jobs table (or only ANALYZE it), unless another vacuum or
        analyze holds it. ``conn`` must be in autocommit."""
        with translate_errors():
            conn.execute(self._analyze_jobs if analyze_only else self._vacuum_jobs)

    def connection_capacity(self, conn: Connection) -> tuple[int, int, int]:
        """``(max_connections, superuser_reserved_connections, client connections in use)``."""
        row = self._rows(conn, _CONNECTION_CAPACITY, {})[0]
        return int(row[0]), int(row[1]), int(row[2])

    def apply_migrations(self, conn: Connection, migrations: Sequence[tuple[int, str, str]]) -> set[int]:
        """Apply the ``(version, name, sql)`` migrations not yet recorded, in one transaction
        under an advisory lock; return the versions this call applied."""
        with translate_errors(), conn.transaction():
            conn.execute(_MIGRATION_LOCK, {"schema": self.schema})
            for ddl in self._migration_ddl:
                conn.execute(ddl)
            applied = {row[0] for row in conn.execute(self._applied_versions)}
            pending = [m for m in migrations if m[0] not in applied]
            conn.execute(self._pin_search_path)
            for version, name, text in pending:
                conn.execute(text.encode())
                conn.execute(self._record_version, {"version": version, "name": name})
        return {m[0] for m in pending}


def job_filter(
    *,
    state: State | str | None = None,
    queue: str | None = None,
    task: str | None = None,
    search: str | None = None,
    created_after: dt.datetime | None = None,
    created_before: dt.datetime | None = None,
) -> dict[str, Any]:
    """The parameters of a job filter: state, queue, task, a substring of the payload's JSON
    text, and a creation time range ``[created_after, created_before)``; None matches all."""
    return {"state": State(state).value if state else None, "queue": queue, "task": task, "search": search or None,
            "after": created_after, "until": created_before}  # fmt: skip


_STATE_ORDER = (
    State.AVAILABLE, State.RUNNING, State.COMPLETED, State.FAILED, State.DEAD, State.CANCELLED, State.WAITING
)  # fmt: skip


def _check_parents(ids: list[int], states: dict[int, State]) -> None:
    """Reject parents that do not exist, or that ended without completing (a dependent of
    theirs could never run)."""
    if not ids:
        raise InvalidInput("depends_on is empty: name at least one job, or leave it out")
    missing = [job_id for job_id in ids if job_id not in states]
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise InvalidInput(f"depends_on names job(s) that do not exist: {shown}; a job can only depend on "
                           "jobs enqueued before it")  # fmt: skip
    ended = [(job_id, states[job_id]) for job_id in ids if states[job_id] in REQUEUEABLE_STATES]
    if ended:
        job_id, state = ended[0]
        raise InvalidInput(f"depends_on names job {job_id}, which ended {state.value}: a job waiting for it would "
                           "never run (requeue it first)")  # fmt: skip


def _aligned(ids: list[int], results: Mapping[int, str] | None) -> list[str | None]:
    """``results`` as a list aligned with ``ids``; empty when no job has one (the common case)."""
    if not results:
        return []
    return [results.get(job_id) for job_id in ids]


def _monitoring(query: Query) -> Steps[Any]:
    """A monitoring query, which must answer quickly or not at all (run it atomically: the
    timeout is the transaction's)."""
    yield Query(_MONITORING_TIMEOUT)
    result = yield query
    return result


def _each(statements: Iterable[str]) -> Steps[None]:
    for statement in statements:
        yield Query(statement)


def _copy_rows(
    ids: Sequence[int],
    jobs: Iterable[NewJob],
    now: dt.datetime,
    scheduled: bool,
    due: set[str],
    trace_context: str | None,
) -> Iterator[tuple[Any, ...]]:
    """The COPY rows of :meth:`Store.copy_many`, made as they stream; adds to ``due`` each queue
    given a job that is due at once. A traced batch sends its trace context with every row."""
    for job_id, job in zip(ids, jobs, strict=True):
        if job.idempotency_key is not None or job.scopes:
            raise ValueError("copy_many() takes jobs without idempotency keys or limits: use enqueue_many()")
        row: tuple[Any, ...] = (job_id, job.queue, job.task, job.payload_json, job.priority, job.max_attempts,
                                job.max_attempts)  # fmt: skip
        if trace_context is not None:
            row = (*row, trace_context)
        if scheduled:
            at = job.run_at or now + dt.timedelta(seconds=job.delay_seconds)
            yield (*row, at)
        elif job.run_at is None and not job.delay_seconds:
            at = now
            yield row
        else:
            raise ValueError("copy_many() was given a scheduled job without scheduled=True")
        if at <= now:
            due.add(job.queue)


def _record(row: dict[str, Any]) -> JobRecord:
    """A job's row, by column name (``_JOB_COLUMNS`` are JobRecord's fields)."""
    history = tuple(
        AttemptError(e["attempt"], _parse_timestamp(e["at"]), e["worker"], e["error"]) for e in row["errors"]
    )
    links = {"parents": tuple(row["parents"] or ()), "dependents": tuple(row["dependents"] or ())}
    return JobRecord(**{**row, "state": State(row["state"]), "errors": history, **links})


def _in_claim_order(leases: Iterable[Lease]) -> list[Lease]:
    """Best first, as the claim picked them: priority, then scheduled time, then id."""
    return sorted(leases, key=lambda lease: (-lease.priority, lease.scheduled_at, lease.id))


def _scope_columns(scopes: Iterable[Scope]) -> dict[str, list[Any]]:
    """The parameters of _SCOPED: one array per column of the scope rows."""
    rows = list(scopes)
    return {"scopes": [s.name for s in rows], "maxes": [s.max_running for s in rows],
            "rates": [s.rate for s in rows], "bursts": [s.burst for s in rows]}  # fmt: skip


def _columns(leases: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """``(job id, attempt)`` pairs as two aligned columns, in ascending id order: the statements
    find an id's attempt by binary search over ``ids`` (width_bucket), which needs them sorted."""
    pairs = sorted(dict(leases).items())
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _requeue_filter(states: Iterable[State]) -> dict[str, Any]:
    return {"states": sorted(s.value for s in states), "queue": None, "task": None}


def _parse_timestamp(text: str) -> dt.datetime:
    """Parse a timestamp from jsonb (``2024-05-01T10:00:00.1234+00:00``). PostgreSQL trims the
    fraction's trailing zeros; Python 3.10's fromisoformat wants exactly 3 or 6 digits."""
    return dt.datetime.fromisoformat(_FRACTION_RE.sub(lambda m: "." + m[1].ljust(6, "0"), text, count=1))


_FRACTION_RE = re.compile(r"\.(\d{1,6})(?=[+-]|$)")
