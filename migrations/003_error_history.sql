-- last_error alone hides what happened on earlier attempts. Each failed attempt appends
-- {"attempt", "at", "worker", "error"} here, in the same UPDATE that records the failure,
-- so the history can never disagree with the state.
ALTER TABLE miniqueue_jobs ADD COLUMN errors JSONB NOT NULL DEFAULT '[]'::jsonb;
