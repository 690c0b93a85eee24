-- Operators pause a queue to stop every worker, on every host, from claiming it (a bad deploy,
-- a downstream outage) without stopping the workers. Absent row = not paused, so the claim's
-- check is one primary-key probe and queues need no registration.
CREATE TABLE miniqueue_queues (
    name       TEXT        PRIMARY KEY,
    paused     BOOLEAN     NOT NULL DEFAULT false,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- A registry of supervisors and their children, refreshed by each supervisor every few
-- seconds, so that dashboards can show every host's processes from the one place they all
-- share. Rows not refreshed for a while belong to a supervisor that is gone.
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
    current_jobs BIGINT[]    NOT NULL DEFAULT '{}'
);
CREATE INDEX idx_miniqueue_processes_supervisor ON miniqueue_processes (supervisor);
