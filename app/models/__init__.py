"""Request and response bodies of the HTTP contract (pydantic)."""
