-- Back-pressure for limits created during a pause: a RateLimited pause is kept on the limit rows
-- of its key that exist when it is raised (see 027), and here by its key as well, so that a limit
-- row created while the pause lasts (a task's first job of the key, enqueued during the pause)
-- starts paused: the enqueue that creates the row reads the key's pause by primary key. Jobs
-- without limits never read this table, and an enqueue of a limited job reads one index entry.
--   paused_until: the latest end of a pause of this key (the database's clock); only grows.
--   paused_by:    the job whose handler paused it last.
-- The reaper deletes the rows whose pause has ended.
CREATE TABLE miniqueue_pauses (
    key          TEXT        PRIMARY KEY,
    paused_until TIMESTAMPTZ NOT NULL,
    paused_by    BIGINT      NOT NULL
);

-- The pauses in force when this migration runs, so that an upgrade in the middle of one keeps it.
INSERT INTO miniqueue_pauses (key, paused_until, paused_by)
SELECT DISTINCT ON (key) key, paused_until, paused_by
  FROM (SELECT substring(scope FROM '^(?:concurrency|rate) [^ ]+ (.*)$') AS key, paused_until, paused_by
          FROM miniqueue_limits
         WHERE paused_until > now() AND paused_by IS NOT NULL) AS paused
 WHERE key IS NOT NULL
 ORDER BY key, paused_until DESC;
