"""The queue scope of a key, in SQL: the predicate every statement addressed by job id or listing across
queues carries, so that a job outside the caller's queues is treated exactly like a missing one.

The caller's patterns become an anchored regex in app/auth/policy.py (`Principal.queue_regex`); the
statements only ever see that regex, as a parameter, and NULL for a key that reaches every queue.
"""

from __future__ import annotations


def queue_allowed(column: str, allowed: str) -> str:
    """The SQL predicate "the caller may see this job's queue": `allowed` is an SQL expression holding the
    caller's anchored queue regex (Principal.queue_regex), NULL for every queue. A job under a key of a spread
    queue (`queue#k`, app/db/spread.py) is the queue's: the name before `#` is what the regex is matched against
    (an immutable function, as Citus requires in a distributed UPDATE's WHERE)."""
    return f"({allowed} IS NULL OR split_part({column}, '#', 1) ~ {allowed})"
