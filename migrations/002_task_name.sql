-- Jobs are dispatched to a handler by name, as in every Python queue. Rows that predate the
-- column get 'default' so the NOT NULL constraint can be added without a rewrite of meaning.
ALTER TABLE miniqueue_jobs ADD COLUMN task TEXT NOT NULL DEFAULT 'default';
ALTER TABLE miniqueue_jobs ALTER COLUMN task DROP DEFAULT;
