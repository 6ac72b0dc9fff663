-- Progress a worker reports while it runs a job (POST /jobs/{id}/heartbeat with `progress`): any JSON value,
-- up to JOBQ_MAX_PROGRESS_BYTES, kept on the job and shown by GET /jobs/{id} and the dashboard. The next
-- claim clears it, so what is shown always belongs to the current (or the last) attempt. NULL: none reported.
ALTER TABLE jobs ADD COLUMN progress jsonb;
