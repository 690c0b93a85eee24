-- The claim: complete the batch a worker holds and lease up to %(limit)s available jobs, best
-- first (priority, then turn, then id), in one statement: one round trip and one
-- commit. A claim with nothing to complete is the same statement with empty arrays (%(ids)s,
-- %(attempts)s, %(results)s). It is one template, `claim` below, read top to bottom; two
-- switches stay in its text, each a named clause after it, because each changes a query plan:
--   {fast} {queue_names}
--                  from one queue (`fast_one`: one ordered scan of the claim index; the queue as
--                  one VALUES row) or several (`fast_many`: an ordered scan per queue, merged;
--                  the queues unnested from %(queues)s): see "One queue or several";
--   {next} {order} stepping up through the groups of limited jobs (`>`, ``) or down (`<`,
--                  ` DESC`): see "Up or down".
-- So the store prepares four variants, each named for its switches (claim_one, claim_many,
-- claim_one_down, claim_many_down: miniqueue/store/claim.py composes them). Every other
-- difference between two claims is a parameter: how many (%(limit)s; of a group taken together,
-- %(together)s), whether groups of a claim may share a scope (%(shared)s: several queues), the
-- worker's tasks. Some clauses are written once and used more than once: {room} and {has_room}
-- (of a limit row), {held} (whether a holder still holds its slot) and {refilled} (a rate limit's
-- tokens now); {completion} is the worker's completion (miniqueue/store/finishing.py, as outcomes
-- sends it alone). {jobs}, {limits}, {queues} and the other names in braces become the schema's
-- names. What a clause holds is the text after its `-- name:` line and comment, up to the next
-- one, byte for byte (a trailing space included); tests/sql/store.sql shows each variant whole.
--
-- A job's turn is its rank among its queue's fair jobs (given as it was enqueued: see
-- migrations/034_fair_share.sql), or for a job that is not fair its due time (scheduled_at); the
-- claim index holds it, so the order costs no sort. Within a group of limited jobs the order is
-- the due time (their index's), which for a fair key's jobs is the order they were enqueued in.
--
-- How a claim works. Jobs without limits come through `fast`, an ordered scan of the claim index
-- (their part of it: `limits IS NULL`). Jobs with limits, and every job of a queue with a cap on
-- running jobs, go through admission, in the same statement (see migration 012 for the tables):
--   open_queues  the queues claimed from that are not paused, each with its cap's scope if any;
--   kept         the groups of the limited jobs the statement completes (`completed`; none in
--                a claim with nothing to complete) that have a job left, looked at first: each has a
--                slot this very statement frees, so no holder of it needs a look, and no probe has
--                to find it. A worker stays with a key while it has jobs; they take at most the
--                groups the claim needs (%(needed)s), and at least min(%(needed)s, 16) groups of
--                every claim are left to the sweep below, so the keys no worker has yet still start.
--                Only the groups of the jobs %(keep)s names are looked at: the caller leaves out
--                the jobs whose claim took every job of their group it found, whose group most
--                likely has none left (the probe for one walks past the index entries of the jobs
--                just taken: at 10 jobs a key, a tenth of a claim's time went on finding nothing);
--   groups       step through the limited jobs' index one group of scopes at a time (one probe
--                per group, from the worker's cursor %(after)s on, upwards or downwards: see
--                "Up or down" below), so a group held back never costs its backlog;
--   snapshot     this statement's snapshot, xids modulo 2^32 (see _TOUCHED below);
--   looked       the groups taken into admission (a capped queue's jobs without limits first, as
--                one more group, then the kept groups), each with its scope rows (its own and its
--                queue's cap), locked, as of their latest version, and each row's room (see "Room"
--                below). A group's room is its tightest scope's. Groups are looked at one by one,
--                and only until %(groups)s are in (or %(scan)s were seen): those the claim needs
--                and a few more, for groups that give fewer jobs than hoped (their jobs are not
--                due yet, or another claim has them locked). A group with a scope row
--                that has no room is passed over without a lock, and one whose scope row another
--                claim has locked (or rewritten since this statement's snapshot: _TOUCHED) is
--                passed over without waiting, so that two workers never queue on the same limit,
--                nor deadlock, and a claim behind another's still fills up from the groups after it;
--   sharing, scopes
--                whether groups of the claim may share a scope, and if so each scope's room (see
--                "Sharing");
--   limited      the best jobs of each group, as many as its room (or up to %(together)s of a
--                group taken together, one of a group beyond those needed: see "Together"),
--                locked, each with its group's oldest (`lead`), found among the group's own rows
--                rather than by a sort of the claim's. Looked for only once
--                the scopes are locked (whose holders are current), they are seldom jobs another
--                worker claimed after this statement's snapshot: locking one of those would hold
--                up that worker's completion of it until this claim commits;
--   need, blocked, admitted
--                the limited jobs admitted in every scope they need: groups that share a scope
--                take its room in job order, each job its rate cost of a rate scope's tokens (one
--                slot of any other scope's), so a job whose cost the tokens left cannot cover waits
--                (and so do the group's jobs behind it, which could otherwise keep it waiting);
--   chosen       the best of the unlimited candidates and the admitted ones, the jobs of a
--                group taken together ranked, within their priority, by the group's oldest, so
--                that they come whole, and a spare group's after the others of its priority
--                (see "Together"). Its columns start with the sort's keys, which are of fixed
--                width and never NULL (a job without limits has no scopes: '{}'), so that the
--                sort reads each key at its cached offset: behind an array, or in a row with a
--                NULL, each read walked the row from its start (4% of a limited claim's time);
--   taken        the chosen jobs' slots and tokens (their rate costs summed), recorded with the
--                lease they belong to, and the holders that ended pruned. (A scope's new holders are listed in no particular
--                order, ids and attempts aligned: ordering them took a sort per scope, a thousand
--                small sorts in a claim of 1,000 keys. A job's scopes are unnested in the select
--                list here, as in `need` and `scopes`, not joined to a function scan, which builds a
--                tuplestore for every row: that doubled the cost of grouping a claim's jobs by scope.)
--   claimed      the chosen jobs leased: running, leased to %(worker)s for %(lease_duration)s seconds, their
--                attempt one higher.
-- A paused scope (back-pressure: its `paused_until` not yet passed, see migration 027) is
-- passed over in `looked` as one with no room, by one more predicate on the row it reads anyway:
-- its groups are not admitted, and jobs without limits never read a scope row.
-- A job held back stays available and spends no attempt.
-- A job past its deadline (expires_at) is passed over, whatever its limits: the reaper expires it.
--
-- Room ({room}, {has_room}). The room of a limit row `l` as of its latest version (the claim has
-- it locked, or is about to), read in `looked`: whole tokens (the bucket refilled up to now), or
-- slots not held. Whether it has any is read first, counting its holders only until they fill
-- it: a key whose slot a lane of jobs taken together holds is passed over at its first holder,
-- not after a look at each. A limit of 1 with room has no holder left to keep, so the claim
-- neither counts its room again nor looks up its ended holders when it takes its slot.
--
-- Held ({held}). Whether holder `h` (its job row `j` among the live jobs, as this statement's snapshot
-- shows it, or NULL) of limit row `l` still holds its slot, in the room and in `taken`. Read from
-- the snapshot without a lock: a job's attempt only grows, so one seen at the holder's attempt and
-- not running, or at a later attempt, has ended for good, and one seen at an earlier attempt was
-- claimed after the snapshot, and holds. A holder the snapshot does not show among the live jobs
-- has finished (or was deleted), unless `l` was rewritten since the snapshot: then it may be a
-- job enqueued, or requeued from the history, and claimed meanwhile (by a worker that preferred
-- it for its priority), held too. Erring toward "held" can only under-admit for a moment, and a
-- row rewritten since the snapshot is passed over anyway (_TOUCHED). Only the live jobs are
-- looked at (`j.state IN` the live states, which the planner prunes to their partition): a claim
-- locks no partition of the history, however many there are. A holder is not counted either if
-- the statement frees its slot itself: `AND NOT coalesce(...)`, the holder found among the leases
-- being completed (their
-- slots are free whether the completion lands or finds the lease lost, since either way the job
-- is no longer running at that attempt). Without this, a claim could not see the slots freed by
-- the completions of its own statement. The leases are found by binary search (width_bucket over
-- the ids, which come sorted), not by a join: a join of each holder with a claim's 1,000 leases
-- cost 0.1 ms a scope, most of a claim over 1,000 keys.
--
-- _TOUCHED. Whether another transaction locked or rewrote limit row `l` after this statement's
-- snapshot `t` was taken, or was still at it then: the row's xmax is a transaction the snapshot
-- does not see (one running when it was taken, or one of the next 2^20 to start; xids compared
-- modulo 2^32, as the server does), and not this one. Another claim is taking or has just taken
-- that limit's room, so the claim passes over it as it passes over a row locked now. Locking such
-- a row instead would have the server check the new version against the statement's conditions
-- (EvalPlanQual), and setting that up costs ~0.1 ms a row in a statement this size: a claim that
-- followed another through the same keys spent 300 ms doing it. A lock left by a transaction that
-- ended before the snapshot is not a reason to pass over: such a row locks at once, version
-- unchanged.
--
-- Tasks. A worker claims only jobs of the tasks its app declares (%(tasks)s; NULL: any), in each
-- place a job is picked (`fast`, `limited`): two apps on one database, or one queue, never take
-- each other's jobs, and a job of a task no worker declares waits uncharged (`miniqueue jobs why`
-- names it). The filter reads the row the scan fetches anyway; it costs nothing where every job is
-- the worker's, and passes over another app's jobs where they come first.
--
-- One queue or several ({fast}). From one queue, `queue = %(queue)s` keeps the ordered scan of
-- the claim index; a paused queue gives nothing, and a capped one gives its jobs to admission
-- instead. From several, an ordered index scan per queue, merged (`queue = ANY(...)` would scan
-- and sort every available row of every queue on each claim). `open_queues` reads one queue as
-- a VALUES row, which the planner counts as one row: an array parameter unnested is counted as
-- ten in a generic plan, and the plan of the whole claim changed with it (a drain by the testing
-- kit's worker ran 3x slower).
--
-- Sharing (`sharing`, then `scopes` and `blocked`). Whether two groups of a claim may share a
-- scope, so that their jobs must take its room in turn (`ranked`, decided once a claim). In one
-- queue, groups are distinct sets of scopes, so only a group of more than one (a key under a
-- cap, a key and a rate limit) can share; most claims have none, and skip the ranking. Across
-- queues, one key's jobs in two queues share it: %(shared)s. Weighing (migration 028): a job that
-- costs more than one token needs the running sums too, even in a group of its own, whose room
-- counts jobs (`limited` takes up to that many): `OR EXISTS` of one in `limited`, so that jobs of
-- cost 1 (every job without a cost) skip it still.
--
-- Up or down (`groups`). The two directions a claim steps through the groups in, from the
-- caller's cursor: a worker goes round them one way (`limits > ... ORDER BY limits`), its
-- neighbour the other way (`limits < ... ORDER BY limits DESC`). Two workers going the same way
-- end up one behind the other, each claim passing over the groups the other's last claim just
-- took (a probe and a look at the limit each: 2 groups seen per group taken, with 2 workers);
-- going opposite ways they meet twice a round.
--
-- Together (`limited`). A group whose one scope is a limit of 1 with no holder gives up to
-- %(together)s jobs, taken together: they hold that one slot between them, and the worker runs
-- them one after another, never two at once (its caller says how many one handler of it will
-- run). Each is a holder of the slot, so the key has no room until the last of them ends, and
-- each is leased as any job is: a lane of leases, which the limit counts as one. A larger limit
-- keeps a job a slot (a lane in its last free slot would hold the others' room until it ended);
-- a rate limit spends a token a job and a queue cap counts every running job, so their groups
-- are never taken together; nor are groups of several scopes, and where groups may share a
-- scope (several queues, weighted costs) `blocked` cuts a lane to its first job. The claim returns the ids taken together on its first row. This
-- pays the per-group work (a probe, a look at the limit, its lock and its update) once for
-- several jobs, where a key has a backlog; the worker's `per_group` says how many jobs a group
-- gave it last time, so that the claim looks at only as many groups as it needs (%(needed)s of
-- the %(groups)s in `looked`). A group beyond those needed gives one job at most, whatever
-- %(together)s: the claim locks about the jobs it leases, not a whole backlog's worth of each
-- spare group (at 100 jobs a key, 21 groups locked 2,100 jobs for a claim of 500). Where jobs
-- come together (%(together)s > 1), such a spare group's job is ranked after the other jobs of
-- its priority: it fills the claim where the groups needed fall short, and otherwise stays for a
-- later claim, which takes its key's jobs together, rather than taking one of them alone now (a
-- key started with one job costs two claims' work: at 10 jobs a key, 16 of every 66 groups did).
--
-- Completing and claiming in one statement. The two updates touch disjoint rows (running and
-- leased to us, versus available). A LEFT JOIN keeps the completed ids even when nothing is
-- claimed; they ride on the first row only (repeating the array on every claimed row cost more
-- than the claim).

-- name: claim
-- The template: every variant of the claim, with its switches and shared clauses in braces.
WITH RECURSIVE {completion},
fast AS MATERIALIZED (
{fast}),
open_queues AS MATERIALIZED (
    SELECT q.name, p.max_running,
           CASE WHEN p.max_running IS NULL THEN '{}'::text[] ELSE ARRAY['queue ' || q.name] END AS scope
      FROM {queue_names} AS q(name) LEFT JOIN {queues} p ON p.name = q.name
     WHERE NOT coalesce(p.paused, false)
),
kept AS MATERIALIZED (
    SELECT k.queue, k.limits, q.scope
      FROM (SELECT DISTINCT queue, limits FROM completed WHERE limits IS NOT NULL AND id = ANY(%(keep)b::bigint[])) k
      JOIN open_queues q ON q.name = k.queue
     CROSS JOIN LATERAL (
        SELECT 1 FROM {jobs} WHERE state = 'available' AND limits IS NOT NULL AND queue = k.queue AND limits = k.limits LIMIT 1) n
     LIMIT %(needed)s
),
groups(queue, scope, limits, depth) AS (
    SELECT q.name, q.scope, f.limits, 1 FROM open_queues q CROSS JOIN LATERAL (
        SELECT limits FROM {jobs}
         WHERE state = 'available' AND limits IS NOT NULL AND queue = q.name AND limits {next} %(after)s::text[]
         ORDER BY limits{order} LIMIT 1) f
    UNION ALL
    SELECT g.queue, g.scope, n.limits, g.depth + 1 FROM groups g CROSS JOIN LATERAL (
        SELECT limits FROM {jobs}
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits {next} g.limits
         ORDER BY limits{order} LIMIT 1) n
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
          FROM (SELECT l.scope, CASE WHEN l.max_running = 1 THEN 1 ELSE {room} END AS room, l.max_running = 1 AS single
                  FROM {limits} l WHERE l.scope = ANY(g.scopes) AND (l.paused_until IS NULL OR l.paused_until <= now()) AND NOT (l.xmax <> '0'
               AND ((l.xmax::text::bigint - t.next) & 4294967295 < 1048576 OR l.xmax::text::bigint = ANY(t.running))
               AND l.xmax::text::bigint IS DISTINCT FROM pg_current_xact_id_if_assigned()::text::bigint & 4294967295) AND {has_room}
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
        SELECT id, queue, limits, priority, scheduled_at, coalesce(rank_at, scheduled_at) AS turn, attempt, rate_cost FROM {jobs}
         WHERE state = 'available' AND limits IS NOT NULL AND queue = g.queue AND limits = g.limits
           AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
           AND (%(tasks)b::text[] IS NULL OR task = ANY(%(tasks)b::text[]))
         ORDER BY priority DESC, scheduled_at, id
         LIMIT least(%(limit)s, CASE WHEN NOT t.together THEN g.room WHEN g.spare THEN 1 ELSE %(together)s END)
           FOR UPDATE SKIP LOCKED) j) j
     WHERE g.limits IS NOT NULL
    UNION ALL
    SELECT j.*, j.turn, j.id, g.scopes, false, false FROM looked g CROSS JOIN LATERAL (
        SELECT id, queue, limits, priority, scheduled_at, coalesce(rank_at, scheduled_at) AS turn, attempt, rate_cost FROM {jobs}
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
    UPDATE {limits} l
       SET (holder_ids, holder_attempts) = (
               SELECT CASE WHEN l.max_running IS NULL THEN l.holder_ids
                           ELSE coalesce(array_agg(h.id ORDER BY h.id), '{}') || t.ids END,
                      CASE WHEN l.max_running IS NULL THEN l.holder_attempts
                           ELSE coalesce(array_agg(h.attempt ORDER BY h.id), '{}') || t.attempts END
                 FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt) LEFT JOIN {jobs} j ON j.id = h.id AND j.state IN ('waiting', 'available', 'running')
                WHERE l.max_running > 1 AND {held}),
           tokens = CASE WHEN l.rate IS NULL THEN l.tokens ELSE {refilled} - t.used END,
           refilled_at = CASE WHEN l.rate IS NULL THEN l.refilled_at ELSE greatest(l.refilled_at, now()) END
      FROM (SELECT scope, sum(rate_cost) AS used, array_agg(id) AS ids, array_agg(attempt + 1) AS attempts
              FROM (SELECT unnest(scopes) AS scope, rate_cost, id, attempt FROM chosen) c GROUP BY scope) t
     WHERE l.scope = t.scope
),
claimed AS (
UPDATE {jobs}
   SET state = 'running', leased_by = %(worker)s, attempt = attempt + 1, started_at = now(),
       lease_expires_at = now() + make_interval(secs => %(lease_duration)s)
 WHERE id = ANY(ARRAY(SELECT id FROM chosen)) AND state = 'available'
RETURNING id, queue, task, payload, priority, attempt, max_attempts, scheduled_at, created_at, lease_expires_at,
          limits, parents, trace_context, attempt_budget, run_alone, fair_key, coalesce(rank_at, scheduled_at) AS turn
)
SELECT CASE WHEN row_number() OVER () = 1 THEN d.ids END,
       CASE WHEN row_number() OVER () = 1 THEN (SELECT array_agg(id) FROM chosen WHERE together) END, c.*
  FROM (SELECT array_agg(id) AS ids FROM completed) d LEFT JOIN claimed c ON true
 WHERE (SELECT count(*) FROM settled) >= 0

-- name: fast_one
-- {fast} from one queue.
    SELECT id, priority, coalesce(rank_at, scheduled_at) AS turn, attempt FROM {jobs}
     WHERE state = 'available' AND queue = %(queue)s AND limits IS NULL AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
       AND (%(tasks)b::text[] IS NULL OR task = ANY(%(tasks)b::text[]))
       AND NOT EXISTS (SELECT 1 FROM {queues} WHERE name = %(queue)s AND (paused OR max_running IS NOT NULL))
     ORDER BY priority DESC, coalesce(rank_at, scheduled_at), id
     LIMIT %(limit)s FOR UPDATE SKIP LOCKED

-- name: queue_names_one
-- {queue_names} of one queue.
(VALUES (%(queue)s::text))

-- name: queue_names_many
-- {queue_names} of several queues.
unnest(%(queues)b::text[])

-- name: fast_many
-- {fast} from several queues.
    SELECT c.id, c.priority, c.turn, c.attempt FROM unnest(%(queues)b::text[]) AS q(name)
     CROSS JOIN LATERAL (
        SELECT id, priority, coalesce(rank_at, scheduled_at) AS turn, attempt FROM {jobs}
         WHERE state = 'available' AND queue = q.name AND limits IS NULL AND scheduled_at <= now() AND (expires_at IS NULL OR expires_at > now())
           AND (%(tasks)b::text[] IS NULL OR task = ANY(%(tasks)b::text[]))
         ORDER BY priority DESC, coalesce(rank_at, scheduled_at), id
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED) c
     WHERE NOT EXISTS (SELECT 1 FROM {queues} p WHERE p.name = q.name AND (p.paused OR p.max_running IS NOT NULL))
     ORDER BY c.priority DESC, c.turn, c.id
     LIMIT %(limit)s

-- name: room
-- {room}: a limit row's room (see "Room"), but for a limit of 1, whose room the caller knows.
CASE WHEN l.max_running IS NULL THEN floor({refilled})::int
     ELSE l.max_running - (SELECT count(*) FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                            LEFT JOIN {jobs} j ON j.id = h.id AND j.state IN ('waiting', 'available', 'running') WHERE {held})::int
     END

-- name: has_room
-- {has_room}: whether a limit row has room (see "Room"): a whole token, or a slot its holders leave.
CASE WHEN l.max_running IS NULL THEN {refilled} >= 1
     ELSE (SELECT count(*) FROM (SELECT FROM unnest(l.holder_ids, l.holder_attempts) AS h(id, attempt)
                                   LEFT JOIN {jobs} j ON j.id = h.id AND j.state IN ('waiting', 'available', 'running')
                                  WHERE {held} LIMIT l.max_running) x) < l.max_running
     END

-- name: held
-- {held}: whether holder `h` of limit row `l` still holds its slot (see "Held").
((j.state = 'running' AND j.attempt = h.attempt) OR j.attempt < h.attempt
             OR (j.id IS NULL AND NOT EXISTS (SELECT 1 FROM {limits} v WHERE v.scope = l.scope AND v.xmin = l.xmin))) AND NOT coalesce((%(ids)b::bigint[])[width_bucket(h.id, %(ids)b::bigint[])] = h.id
                AND (%(attempts)b::int[])[width_bucket(h.id, %(ids)b::bigint[])] = h.attempt, false)

-- name: refilled
-- {refilled}: a rate limit's tokens now, its bucket refilled up to now, whole or not.
least(l.burst, l.tokens + l.rate * greatest(0, extract(epoch FROM now() - l.refilled_at)))
