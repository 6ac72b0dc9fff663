-- Rendered from app/db/keys.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: API_KEYS_COUNT_LIVE --
SELECT count(*) FROM jobq.api_keys WHERE revoked_at IS NULL

-- name: API_KEYS_LIST --
SELECT id, name, selector, scopes, queue_patterns, created_at, last_used_at, revoked_at, rate_per_second,
       rate_burst
FROM jobq.api_keys
WHERE %(all)s OR revoked_at IS NULL
ORDER BY id

-- name: API_KEYS_TOUCH --
-- Batched and infrequent: a last-use stamp is diagnostics, not worth a write per request.
UPDATE jobq.api_keys SET last_used_at = now()
WHERE id = ANY(%s) AND revoked_at IS NULL

-- name: API_KEY_BY_SELECTOR --
-- Live keys only: a revoked key is unknown from the moment its revocation commits.
SELECT id, name, key_hash, scopes, queue_patterns, rate_per_second, rate_burst
FROM jobq.api_keys
WHERE selector = %s AND revoked_at IS NULL

-- name: API_KEY_FIND --
-- A live key by id or name, for `jobq keys sqs` (its AWS pair is derived from the id and the selector).
SELECT id, name, selector FROM jobq.api_keys
WHERE (id = %(id)s OR name = %(name)s) AND revoked_at IS NULL

-- name: API_KEY_INSERT --
WITH created AS (
  INSERT INTO jobq.api_keys (name, selector, key_hash, scopes, queue_patterns)
  VALUES (%(name)s, %(selector)s, %(hash)s, %(scopes)s, %(queues)s)
  RETURNING id
)
-- A process may have cached "no such key" for this selector: every process is told to forget it (_changed).
SELECT id FROM created

-- name: API_KEY_INSERT_RATED --
WITH created AS (
  INSERT INTO jobq.api_keys (name, selector, key_hash, scopes, queue_patterns, rate_per_second, rate_burst)
  VALUES (%(name)s, %(selector)s, %(hash)s, %(scopes)s, %(queues)s, %(rate)s, %(burst)s)
  RETURNING id
)
SELECT id FROM created

-- name: API_KEY_REVOKE --
WITH revoked AS (
  UPDATE jobq.api_keys SET revoked_at = now()
  WHERE (id = %(id)s OR name = %(name)s) AND revoked_at IS NULL
  RETURNING id, name
)
-- The message (_changed) is delivered at commit: every process drops its cached keys as soon as the revocation
-- is durable.
SELECT id, name FROM revoked

-- name: API_KEY_SELECTORS --
-- Every live key's selector (not secret): whether a selector may be a key, without a lookup per selector.
SELECT selector FROM jobq.api_keys WHERE revoked_at IS NULL

-- name: API_KEY_SET_RATE --
WITH changed AS (
  UPDATE jobq.api_keys SET rate_per_second = %(rate)s, rate_burst = %(burst)s
  WHERE (id = %(id)s OR name = %(name)s) AND revoked_at IS NULL
  RETURNING id, name
)
-- The message (_changed) is delivered at commit: every process reads the key again, with its new rate.
SELECT id, name FROM changed

-- name: KEYS_CHANGED_NOTIFY --
SELECT pg_notify('jobq_wakeup', 'keys k')
