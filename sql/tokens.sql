-- Rendered from app/db/tokens.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: JOB_QUEUE --
SELECT queue_name FROM jobq.jobs WHERE id = %(id)s
