-- 'cancelled' is the terminal state an operator puts a job in. It is distinct from 'failed'
-- (the handler said never retry) and 'dead' (attempts exhausted) so that reports can tell
-- a human decision from a failure.
ALTER TABLE miniqueue_jobs DROP CONSTRAINT valid_state;
ALTER TABLE miniqueue_jobs ADD CONSTRAINT valid_state
    CHECK (state IN ('available', 'running', 'completed', 'failed', 'dead', 'cancelled'));
