-- What each worker of the process registry serves: its queues and the tasks its app declares, so
-- that `miniqueue jobs why` can say that no live worker serves a job's queue while workers of
-- other queues are live, or that the live workers of its queue do not declare its task. NULL: not
-- reported (a supervisor, a reaper, or a worker of an older version).
ALTER TABLE miniqueue_processes ADD COLUMN queues TEXT[], ADD COLUMN tasks TEXT[];
