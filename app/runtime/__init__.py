"""Running the service: the CLI, uvicorn, the managed PostgreSQL, logs and metrics."""
