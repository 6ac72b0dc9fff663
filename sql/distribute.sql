-- Rendered from app/db/distribute.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: DISTRIBUTED --
SELECT c.relname FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid
WHERE c.relnamespace = to_regnamespace(%s)

-- name: HAS_CITUS --
SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')

-- name: PRIMARY_KEY_COLUMNS --
SELECT array_agg(a.attname::text ORDER BY k.n)
FROM pg_constraint c
CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, n)
JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
WHERE c.conrelid = to_regclass(%s) AND c.contype = 'p'
