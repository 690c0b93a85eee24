"""The harness's own tables in the chaos database, and the audit trigger on the queue table.

``chaos_transitions`` is filled by triggers on ``miniqueue_jobs``: every state change and
every claim, in the transaction that made it, with the worker that held the job and the
error that ended an attempt. A change that moves a job to another partition (a finish, a
requeue) fires DELETE on the partition it leaves and INSERT on the one it enters, not UPDATE:
the INSERT turns the DELETE it follows, in the same transaction, into the transition. It turns
"completed more than once" into something the database can count (completions per job) and
gives each attempt a start, an end and a cause. It also records a dependent's release
(``waiting`` to ``available``, in its last parent's completion).
"""

from __future__ import annotations

from typing import Any

import psycopg

DDL = """
CREATE TABLE chaos_executions (
    token   TEXT PRIMARY KEY,                 -- one per handler call: a retried insert is not a second execution
    job_id  BIGINT NOT NULL,
    attempt INT NOT NULL,
    pid     INT NOT NULL,
    at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    parents JSONB,                            -- a dependent's job.parent_results as it read them: {"id": result}
    ended   TIMESTAMPTZ,                      -- keyed jobs: the handler's work done (before its completion commits)
    batch   TEXT                              -- batch jobs: the batch handler's call it ran in (one token per call)
);
CREATE INDEX chaos_executions_job ON chaos_executions (job_id, attempt);

CREATE TABLE chaos_effects (
    job_id  BIGINT PRIMARY KEY,               -- one effect per job, ever
    attempt INT NOT NULL,
    pid     INT NOT NULL,
    at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

-- A handler that found its job's effect already committed (a late attempt) notes it here,
-- outside its transaction; fencing should then roll that transaction back.
CREATE TABLE chaos_effect_conflicts (
    token   TEXT PRIMARY KEY,
    job_id  BIGINT NOT NULL,
    attempt INT NOT NULL,
    pid     INT NOT NULL,
    at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

-- ... and here, inside its transaction: a row survives only if that transaction committed,
-- that is, if a second completion of the job (and a second effect) stood.
CREATE TABLE chaos_duplicate_effects (
    job_id  BIGINT NOT NULL,
    attempt INT NOT NULL,
    pid     INT NOT NULL,
    at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE chaos_transitions (
    id         BIGSERIAL PRIMARY KEY,
    job_id     BIGINT NOT NULL,
    attempt    INT NOT NULL,
    from_state TEXT,
    to_state   TEXT NOT NULL,
    worker     TEXT,                          -- the lease holder: the claimer, or the one whose lease ended
    error      TEXT,
    at         TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    -- The transaction that made it. Within one transaction the stamps need not follow the order of
    -- the changes: a change a function makes inside a statement (a sequence's next job released by
    -- miniqueue_settle) is stamped before the change of the statement itself (the completion),
    -- whose AFTER trigger fires when the statement ends.
    xact       BIGINT NOT NULL DEFAULT txid_current(),
    -- A DELETE's: how many entries the job's error history had (a move's INSERT compares).
    errors_before INT,
    -- Back to 'available': when it is due again, and the attempts charged so far (of its budget).
    due        TIMESTAMPTZ,
    charged    INT
);
CREATE INDEX chaos_transitions_job ON chaos_transitions (job_id);

CREATE FUNCTION chaos_record_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO chaos_transitions (job_id, attempt, from_state, to_state, worker, errors_before)
        VALUES (OLD.id, OLD.attempt, OLD.state, 'deleted', OLD.leased_by, jsonb_array_length(OLD.errors));
        RETURN NULL;
    END IF;
    INSERT INTO chaos_transitions (job_id, attempt, from_state, to_state, worker, error, due, charged)
    VALUES (
        NEW.id,
        CASE WHEN NEW.state = 'running' THEN NEW.attempt ELSE OLD.attempt END,
        OLD.state,
        NEW.state,
        CASE WHEN NEW.state = 'running' THEN NEW.leased_by ELSE OLD.leased_by END,
        -- The entry the transition appended to the history (a failure, or the note of a job handed
        -- back without spending an attempt), else last_error.
        CASE WHEN NEW.state IN ('available', 'dead', 'failed') THEN left(
            CASE WHEN jsonb_array_length(NEW.errors) > jsonb_array_length(OLD.errors)
                 THEN NEW.errors -> -1 ->> 'error' ELSE NEW.last_error END, 4000) END,
        CASE WHEN NEW.state = 'available' THEN NEW.scheduled_at END,
        NEW.attempt_budget - (NEW.max_attempts - NEW.attempt)
    );
    RETURN NULL;
END
$$;

CREATE TABLE chaos_keyed (
    job_id       BIGINT PRIMARY KEY,
    unique_key   TEXT,
    sequence_key TEXT,
    at           TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()  -- stored (after its unique index let it in)
);

-- An INSERT is a job's enqueue, or the arrival of a job that a change moved from another
-- partition: the DELETE just recorded for it in this transaction becomes that change (as the
-- UPDATE trigger would have recorded it).
CREATE FUNCTION chaos_record_arrival() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE chaos_transitions t
       SET to_state = NEW.state,
           error = CASE WHEN NEW.state IN ('available', 'dead', 'failed') THEN left(
               CASE WHEN jsonb_array_length(NEW.errors) > t.errors_before
                    THEN NEW.errors -> -1 ->> 'error' ELSE NEW.last_error END, 4000) END
     WHERE t.id = (SELECT max(id) FROM chaos_transitions
                    WHERE job_id = NEW.id AND xact = txid_current() AND to_state = 'deleted');
    IF NOT FOUND AND (NEW.unique_key IS NOT NULL OR NEW.sequence_key IS NOT NULL) THEN
        INSERT INTO chaos_keyed (job_id, unique_key, sequence_key) VALUES (NEW.id, NEW.unique_key, NEW.sequence_key);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER chaos_arrival AFTER INSERT ON miniqueue_jobs FOR EACH ROW
    EXECUTE FUNCTION chaos_record_arrival();
CREATE TRIGGER chaos_transitions_update AFTER UPDATE ON miniqueue_jobs FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.attempt IS DISTINCT FROM NEW.attempt)
    EXECUTE FUNCTION chaos_record_transition();
CREATE TRIGGER chaos_transitions_delete AFTER DELETE ON miniqueue_jobs FOR EACH ROW
    EXECUTE FUNCTION chaos_record_transition();
"""


#: ``--durable``'s tables (see chaos.durable_jobs): each run of a step's function, the transactional
#: step's effect, and a second record of it.
DURABLE_DDL = """
CREATE TABLE chaos_step_runs (
    token   TEXT PRIMARY KEY,                 -- one per run of a step's function
    job_id  BIGINT NOT NULL,
    step    TEXT NOT NULL,
    attempt INT NOT NULL,
    at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE chaos_durable_effects (
    job_id  BIGINT PRIMARY KEY,               -- the transactional step's effect: one per job, ever
    attempt INT NOT NULL,
    pid     INT NOT NULL
);
-- Written inside the step's transaction when its effect was there already: a row survives only
-- if that transaction committed, i.e. if a second record of the step (and effect) stood.
CREATE TABLE chaos_durable_duplicates (
    job_id  BIGINT NOT NULL,
    attempt INT NOT NULL,
    pid     INT NOT NULL
);
"""


def install(conn: psycopg.Connection[Any]) -> None:
    """Create the harness's tables and the audit trigger (the queue's tables must exist)."""
    with conn.transaction():
        conn.execute(DDL)
        conn.execute(DURABLE_DDL)
