"""Peers that bench/run.py measures beside jobq, each on its own fresh database of the same PostgreSQL."""
