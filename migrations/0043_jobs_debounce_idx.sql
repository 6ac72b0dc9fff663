-- jobq: no-transaction
-- The pending job of a debounce key, per queue: what a debounced enqueue looks up (app/db/debounce.py). Not
-- unique: a job retried back to pending may meet a newer one with its key, and the enqueue then takes the
-- newest. Only pending jobs with a key are in it, so it stays small and costs other writes nothing.
-- Built concurrently: enqueues and claims go on while it is built.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_debounce_idx ON jobs (queue_name, debounce_key)
  WHERE debounce_key IS NOT NULL AND status = 'pending';
