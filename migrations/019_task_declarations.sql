-- What each task declares, published by the workers of the apps that run against this database,
-- so that a task's queue, priority, attempts and limits apply however its jobs are enqueued: a
-- Client, the CLI or an integration that has no app loaded fills what its caller left unset
-- from here (what the caller sets explicitly wins). One row per task name; the latest worker to
-- start with a changed declaration rewrites it (see the README's "Tasks and their options").
--
-- A key computed from each job's payload by a function of the app cannot be computed here: the
-- row says so (`*_computed`), and a producer without the app must pass the key itself.
CREATE TABLE miniqueue_tasks (
    task                     TEXT        PRIMARY KEY,
    queue                    TEXT        NOT NULL,
    priority                 SMALLINT    NOT NULL,
    max_attempts             INT         NOT NULL CHECK (max_attempts > 0),
    concurrency_key          TEXT,
    concurrency_key_computed BOOLEAN     NOT NULL DEFAULT false,
    max_concurrent           INT         CHECK (max_concurrent > 0),
    rate_limit               TEXT,
    rate_limit_key           TEXT,
    rate_limit_key_computed  BOOLEAN     NOT NULL DEFAULT false,
    published_at             TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The queues some worker has served, and when one last started serving it: a job waiting in a
-- queue that no worker has ever served is shown as such (`miniqueue stats`, the dashboard), not
-- left to wait in silence.
CREATE TABLE miniqueue_served_queues (
    queue     TEXT        PRIMARY KEY,
    served_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
