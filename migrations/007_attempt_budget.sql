-- attempt is the fencing token: a worker's writes match (id, leased_by, attempt), so it must
-- never repeat for a job. Requeueing therefore cannot reset attempt to 0; it raises
-- max_attempts instead, by the budget the job was enqueued with, kept here.
ALTER TABLE miniqueue_jobs ADD COLUMN attempt_budget INT;
UPDATE miniqueue_jobs SET attempt_budget = max_attempts;
ALTER TABLE miniqueue_jobs ALTER COLUMN attempt_budget SET NOT NULL;
ALTER TABLE miniqueue_jobs ADD CONSTRAINT positive_attempts CHECK (max_attempts >= 1 AND attempt_budget >= 1);
