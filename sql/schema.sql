-- Rendered from app/db/schema.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: WHERE --
SELECT to_regclass(format('%%I.jobq_migrations', %(configured)s::text)) IS NOT NULL, to_regclass('public.jobq_migrations') IS NOT NULL
