"""Listing cursors (app/core/cursors.py): they round-trip, and anything else is refused before SQL."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import orjson
import pytest

from app.core.cursors import BadCursor, decode_cursor, encode_cursor

WHEN = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("status", "keys"),
    [("pending", [5, WHEN, 42]), ("running", [WHEN, 42]), ("failed", [WHEN, 7]), (None, [2**63 - 1])],
)
def test_a_cursor_round_trips(status: str | None, keys: list[object]) -> None:
    assert decode_cursor(encode_cursor(status, keys), status) == keys


def forge(doc: object) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(doc)).decode().rstrip("=")


@pytest.mark.parametrize(
    ("cursor", "status"),
    [
        (encode_cursor("running", [WHEN, 1]), "failed"),  # another listing's
        (encode_cursor(None, [1]), "pending"),
        ("not base64 at all!", None),
        (forge({"s": None, "k": [{"$gt": 1}]}), None),  # an object where an id goes
        (forge({"s": None, "k": [[1, 2]]}), None),  # a list would become an array
        (forge({"s": None, "k": [2**63]}), None),  # past bigint
        (forge({"s": None, "k": [True]}), None),
        (forge({"s": "pending", "k": [2**15, WHEN.isoformat(), 1]}), "pending"),  # past smallint
        (forge({"s": "running", "k": ["2026-11-30T12:00:00", 1]}), "running"),  # a time without offset
        (forge({"s": "running", "k": [1, 1]}), "running"),
        (forge({"s": None}), None),
        (forge([1]), None),
    ],
)
def test_anything_else_is_a_bad_cursor(cursor: str, status: str | None) -> None:
    with pytest.raises(BadCursor):
        decode_cursor(cursor, status)
