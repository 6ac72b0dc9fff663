"""PostgreSQL: the connection pool, migrations, and all SQL (jobs, operations, API keys)."""
