"""app/db/constraints.py: the constraint an error names, from its field or, as Citus passes a worker's error on,
from its message (the Citus runs exercise it for real: tests/test_unique.py, tests/test_security.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from app.db.constraints import constraint_of


def error(constraint: str | None, message: str) -> Any:
    return SimpleNamespace(diag=SimpleNamespace(constraint_name=constraint, message_primary=message))


def test_the_field_when_postgresql_sets_it() -> None:
    assert constraint_of(error("jobs_unique_idx", "whatever")) == "jobs_unique_idx"


def test_a_shard_of_a_known_constraint_from_the_message() -> None:
    message = 'duplicate key value violates unique constraint "jobs_unique_idx_102029"'
    assert constraint_of(error(None, message), ("jobs_unique_idx",)) == "jobs_unique_idx"
    assert constraint_of(error(None, message)) == "jobs_unique_idx_102029"  # not known: as the message says


def test_a_name_ending_in_digits_that_is_no_shard_is_kept() -> None:
    message = 'new row for relation "api_keys_102100" violates check constraint "api_keys_name_check2"'
    assert constraint_of(error(None, message), ("api_keys_name_check",)) == "api_keys_name_check2"


def test_nothing_named() -> None:
    assert constraint_of(error(None, "deadlock detected")) == ""
    assert constraint_of(error(None, None)) == ""  # type: ignore[arg-type]
