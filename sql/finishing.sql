-- Rendered from app/db/finishing.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: COUNTS_ADD --
-- `n` (negative: deleted) to one queue's counter of one status; each backend its own shard of the counter
-- (backend pid mod 64), as count_finished.
INSERT INTO jobq.queue_counts AS c (queue_name, status, shard, n)
VALUES (%(queue)s, %(status)s, mod(pg_backend_pid(), 64), %(n)s)
ON CONFLICT (queue_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n

-- name: RELEASES_RECORD --
-- The jobs of one queue just finished that other jobs depend on, as they are now in this transaction: the
-- dependency release (app/db/releases.py) releases or cancels their dependants.
INSERT INTO jobq.dependency_releases (queue_name, job_id, status)
SELECT j.queue_name, j.id, j.status FROM jobq.jobs j
WHERE j.queue_name = %(queue)s AND j.id = ANY(%(ids)s::bigint[]) AND j.status IN ('completed', 'failed', 'cancelled')
