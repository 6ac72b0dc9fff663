-- API keys. A key is "jobq_<selector>_<secret>": the selector finds the row, the secret is checked
-- against key_hash (SHA-256) in constant time. The key itself is never stored and cannot be recovered.
CREATE TABLE api_keys (
  id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  name           text        NOT NULL CHECK (name ~ '^[A-Za-z][A-Za-z0-9_.:@-]{0,63}$'),
  selector       text        NOT NULL UNIQUE CHECK (selector ~ '^[0-9a-f]{12}$'),
  key_hash       bytea       NOT NULL CHECK (octet_length(key_hash) = 32),
  scopes         text[]      NOT NULL CHECK (cardinality(scopes) >= 1
                                             AND scopes <@ ARRAY['produce', 'consume', 'admin']),
  -- Queue-name patterns (`*` matches any run of characters) the key is limited to; NULL: every queue.
  queue_patterns text[]      CHECK (queue_patterns IS NULL OR (cardinality(queue_patterns) >= 1
                                    AND array_to_string(queue_patterns, ' ')
                                        ~ '^[A-Za-z0-9_.:*-]{1,128}( [A-Za-z0-9_.:*-]{1,128})*$')),
  created_at     timestamptz NOT NULL DEFAULT now(),
  revoked_at     timestamptz,          -- set once; a revoked key never comes back
  last_used_at   timestamptz           -- updated lazily (at most about once a minute per process)
);

-- Operators revoke by id or by name (a name starts with a letter, so the two never look alike). Names are
-- unique among live keys only, so a name can be reused once its key is revoked.
CREATE UNIQUE INDEX api_keys_live_name_idx ON api_keys (name) WHERE revoked_at IS NULL;
