"""The constraint an integrity error names, on both engines.

PostgreSQL names it in the error's fields (`diag.constraint_name`). On Citus an error raised on a worker
node reaches the client through the coordinator with its message alone, and the message names the shard's
constraint: the table's constraint name with the shard's id appended (`jobs_unique_idx_102029`)."""

from __future__ import annotations

import re

import psycopg

_QUOTED = re.compile(r'constraint "([^"]+)"')
_SHARD = re.compile(r"_\d+$")


def constraint_of(exc: psycopg.Error, known: tuple[str, ...] = ()) -> str:
    """The constraint `exc` names ("" if none): the field when PostgreSQL set it; else the one its message
    quotes, reduced to the name in `known` that it is a shard of (the shard's id taken off)."""
    if exc.diag.constraint_name:
        return exc.diag.constraint_name
    found = _QUOTED.search(exc.diag.message_primary or "")
    if found is None:
        return ""
    name = found.group(1)
    base = _SHARD.sub("", name)
    return base if base in known else name
