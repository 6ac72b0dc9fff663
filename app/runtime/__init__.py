"""Running the service: the CLI, uvicorn and its connection caps, the managed PostgreSQL."""
