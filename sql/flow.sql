-- Rendered from app/db/flow.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: QUEUES_SPREAD --
SELECT queue_name, keys_used FROM jobq.queue_state WHERE queue_name = ANY(%(queues)s) AND keys_used > 1

-- name: QUEUE_CLAIMS_PRUNE --
-- One queue's ledger rows older than every rate window of the queue (a day when it has none any more).
DELETE FROM jobq.queue_claims c
WHERE c.queue_name = %(queue)s AND c.claimed_at < now() - make_interval(secs => coalesce(
  (SELECT greatest(coalesce(s.rate_per_seconds, 0), coalesce(s.group_rate_per_seconds, 0))
   FROM jobq.queue_state s WHERE s.queue_name = %(queue)s), 86400))

-- name: QUEUE_CLAIMS_QUEUES --
SELECT queue_name FROM jobq.queue_claims GROUP BY queue_name

-- name: QUEUE_CONFIGS_RETENTION --
-- Queues whose retention differs from the global setting in some status.
SELECT queue_name, retention_completed_seconds, retention_failed_seconds, retention_cancelled_seconds
FROM jobq.queue_state
WHERE retention_completed_seconds IS NOT NULL OR retention_failed_seconds IS NOT NULL
   OR retention_cancelled_seconds IS NOT NULL

-- name: QUEUE_CONFIG_CHANGED --
SELECT pg_notify('jobq_wakeup', 'config ' || %(queue)s::text)

-- name: QUEUE_CONFIG_GET --
SELECT queue_name AS queue, max_attempts, backoff_base_seconds, backoff_max_seconds, lease_seconds, default_priority, retention_completed_seconds, retention_failed_seconds, retention_cancelled_seconds, concurrency, rate_limit, rate_per_seconds, group_concurrency, group_rate_limit, group_rate_per_seconds, fair, ordered, max_pending, timeout_seconds, spread, keys_used, limited, grouped, changed_at FROM jobq.queue_state WHERE queue_name = %(queue)s

-- name: QUEUE_CONFIG_LOCK --
-- The row to change, created when the queue has none, and locked until the change commits (DO UPDATE
-- locks the row it finds): two changes of one queue apply one after the other, each to what the other left.
INSERT INTO jobq.queue_state AS s (queue_name) VALUES (%(queue)s)
ON CONFLICT (queue_name) DO UPDATE SET queue_name = s.queue_name
RETURNING queue_name AS queue, max_attempts, backoff_base_seconds, backoff_max_seconds, lease_seconds, default_priority, retention_completed_seconds, retention_failed_seconds, retention_cancelled_seconds, concurrency, rate_limit, rate_per_seconds, group_concurrency, group_rate_limit, group_rate_per_seconds, fair, ordered, max_pending, timeout_seconds, spread, keys_used, limited, grouped, changed_at

-- name: QUEUE_CONFIG_SET --
UPDATE jobq.queue_state SET max_attempts = %(max_attempts)s, backoff_base_seconds = %(backoff_base_seconds)s, backoff_max_seconds = %(backoff_max_seconds)s, lease_seconds = %(lease_seconds)s, default_priority = %(default_priority)s, retention_completed_seconds = %(retention_completed_seconds)s, retention_failed_seconds = %(retention_failed_seconds)s, retention_cancelled_seconds = %(retention_cancelled_seconds)s, concurrency = %(concurrency)s, rate_limit = %(rate_limit)s, rate_per_seconds = %(rate_per_seconds)s, group_concurrency = %(group_concurrency)s, group_rate_limit = %(group_rate_limit)s, group_rate_per_seconds = %(group_rate_per_seconds)s, fair = %(fair)s, ordered = %(ordered)s, max_pending = %(max_pending)s, timeout_seconds = %(timeout_seconds)s,
  spread = coalesce(%(spread)s, 1), keys_used = %(keys_used)s, changed_at = now()
WHERE queue_name = %(queue)s
RETURNING queue_name AS queue, max_attempts, backoff_base_seconds, backoff_max_seconds, lease_seconds, default_priority, retention_completed_seconds, retention_failed_seconds, retention_cancelled_seconds, concurrency, rate_limit, rate_per_seconds, group_concurrency, group_rate_limit, group_rate_per_seconds, fair, ordered, max_pending, timeout_seconds, spread, keys_used, limited, grouped, changed_at

-- name: QUEUE_KEY_BUSY --
SELECT EXISTS (SELECT FROM jobq.jobs WHERE queue_name = %(key)s AND status = 'pending')
    OR EXISTS (SELECT FROM jobq.jobs WHERE queue_name = %(key)s AND status = 'running' COLLATE "C")
    OR EXISTS (SELECT FROM jobq.jobs WHERE queue_name = %(key)s AND status = 'waiting')

-- name: QUEUE_KEY_COPY --
INSERT INTO jobq.queue_state AS s (queue_name, paused, max_attempts, backoff_base_seconds, backoff_max_seconds, lease_seconds, default_priority, retention_completed_seconds, retention_failed_seconds, retention_cancelled_seconds, concurrency, rate_limit, rate_per_seconds, group_concurrency, group_rate_limit, group_rate_per_seconds, fair, ordered, max_pending, timeout_seconds, changed_at)
VALUES (%(key)s, %(paused)s, %(max_attempts)s, %(backoff_base_seconds)s, %(backoff_max_seconds)s, %(lease_seconds)s, %(default_priority)s, %(retention_completed_seconds)s, %(retention_failed_seconds)s, %(retention_cancelled_seconds)s, %(concurrency)s, %(rate_limit)s, %(rate_per_seconds)s, %(group_concurrency)s, %(group_rate_limit)s, %(group_rate_per_seconds)s, %(fair)s, %(ordered)s, %(max_pending)s, %(timeout_seconds)s, %(changed_at)s)
ON CONFLICT (queue_name) DO UPDATE SET paused = EXCLUDED.paused, max_attempts = EXCLUDED.max_attempts, backoff_base_seconds = EXCLUDED.backoff_base_seconds, backoff_max_seconds = EXCLUDED.backoff_max_seconds, lease_seconds = EXCLUDED.lease_seconds, default_priority = EXCLUDED.default_priority, retention_completed_seconds = EXCLUDED.retention_completed_seconds, retention_failed_seconds = EXCLUDED.retention_failed_seconds, retention_cancelled_seconds = EXCLUDED.retention_cancelled_seconds, concurrency = EXCLUDED.concurrency, rate_limit = EXCLUDED.rate_limit, rate_per_seconds = EXCLUDED.rate_per_seconds, group_concurrency = EXCLUDED.group_concurrency, group_rate_limit = EXCLUDED.group_rate_limit, group_rate_per_seconds = EXCLUDED.group_rate_per_seconds, fair = EXCLUDED.fair, ordered = EXCLUDED.ordered, max_pending = EXCLUDED.max_pending, timeout_seconds = EXCLUDED.timeout_seconds, changed_at = EXCLUDED.changed_at

-- name: QUEUE_KEY_SOURCE --
SELECT paused, max_attempts, backoff_base_seconds, backoff_max_seconds, lease_seconds, default_priority, retention_completed_seconds, retention_failed_seconds, retention_cancelled_seconds, concurrency, rate_limit, rate_per_seconds, group_concurrency, group_rate_limit, group_rate_per_seconds, fair, ordered, max_pending, timeout_seconds, changed_at FROM jobq.queue_state WHERE queue_name = %(queue)s
