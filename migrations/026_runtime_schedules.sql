-- Periodic schedules created, changed and deleted at run time (client.schedules, `miniqueue
-- periodic add`), beside those an app declares in code. Every reaper reads this table once a pass
-- (it holds one row per schedule an operator made, so a sequential scan is the cheapest read),
-- and schedules each row exactly as a schedule of the code: a slot is claimed by advancing the
-- schedule's row in miniqueue_periodic, so runtime and code schedules share one namespace, and
-- each slot is enqueued once fleet-wide without a leader.
--
-- Whether a schedule is enabled and its last slot stay in miniqueue_periodic, where the claim
-- reads them; this table holds only the definition. updated_at changes with every change, and a
-- scheduler claims a slot only while the definition it read is still the stored one (the claim
-- re-checks it in the same statement), so a change or a delete takes effect at the next pass.
CREATE TABLE miniqueue_schedules (
    name       TEXT             PRIMARY KEY,
    cron       TEXT             NOT NULL,
    task       TEXT             NOT NULL,
    -- NULL: the job's payload is left empty, as a code schedule without a payload.
    payload    JSONB,
    timezone   TEXT             NOT NULL DEFAULT 'UTC',
    catch_up   TEXT             NOT NULL DEFAULT 'skip' CHECK (catch_up IN ('latest', 'skip')),
    grace      DOUBLE PRECISION NOT NULL DEFAULT 300 CHECK (grace >= 0),
    created_at TIMESTAMPTZ      NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ      NOT NULL DEFAULT now()
);
