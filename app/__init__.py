"""jobq, an HTTP job queue on PostgreSQL; `__version__` is the release (hatch reads it, CHANGELOG.md tells it)."""

__version__ = "1.1.0"
