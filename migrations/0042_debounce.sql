-- Debounced jobs (issue 24): enqueue `debounce: {key, seconds, max_wait_seconds?}` (docs/producers.md).
-- While a job with the key is pending, an enqueue with it replaces that job's payload and priority and moves
-- its run time (app/db/debounce.py). The key and the options of the latest enqueue stay on the job; the first
-- enqueue is its created_at. Nullable without defaults: metadata-only changes, no scan under a lock.
ALTER TABLE jobs ADD COLUMN debounce_key text;
ALTER TABLE jobs ADD COLUMN debounce_seconds float8;
ALTER TABLE jobs ADD COLUMN debounce_max_wait_seconds float8;
