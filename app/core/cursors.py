"""Cursors of the job listings, and of the queue list (QUEUES): the last row's sort key, as opaque URL-safe
text. A cursor is client input: decoding checks that it belongs to this listing and that each key has its
column's type before anything reaches SQL."""

from __future__ import annotations

import base64
import binascii
import re
from datetime import datetime
from typing import Any

import orjson

from app.db.rows import FINISHED, Status


class BadCursor(ValueError):
    """Not a cursor of this listing."""


# The sort keys a cursor carries, per listing (app/db/operations.py LISTINGS): smallint priority,
# bigint id, timestamps as RFC 3339 text.
_SMALLINT, _BIGINT, _TIME, _NAME = (-(2**15), 2**15 - 1), (-(2**63), 2**63 - 1), "time", "name"
QUEUES = "queues"  # GET /queues: the last queue name of a page
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_CURSOR_KEYS: dict[str | None, tuple[Any, ...]] = {
    Status.pending: (_SMALLINT, _TIME, _BIGINT),
    Status.running: (_TIME, _BIGINT),
    Status.waiting: (_BIGINT,),
    **{status: (_TIME, _BIGINT) for status in FINISHED},
    None: (_BIGINT,),
    QUEUES: (_NAME,),
}


def encode_cursor(status: str | None, keys: list[Any]) -> str:
    plain = [k.isoformat() if isinstance(k, datetime) else k for k in keys]
    raw = orjson.dumps({"s": status, "k": plain})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _cursor_key(kind: Any, value: Any) -> Any:
    """One sort key, checked against its column's type (psycopg cannot adapt a JSON object; a list would
    become an array)."""
    if kind == _NAME:
        if not isinstance(value, str) or not _QUEUE_NAME.fullmatch(value):
            raise TypeError(value)
        return value
    if kind == _TIME:
        if not isinstance(value, str):
            raise TypeError(value)
        stamp = datetime.fromisoformat(value)
        if stamp.tzinfo is None:
            raise ValueError(value)
        return stamp
    low, high = kind
    if type(value) is not int or not low <= value <= high:
        raise TypeError(value)
    return value


def decode_cursor(cursor: str, status: str | None) -> list[Any]:
    """The sort key a cursor of the `status` listing holds; BadCursor for anything else."""
    kinds = _CURSOR_KEYS.get(status, ())
    try:
        doc = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        keys = doc["k"]
        if doc["s"] != status or not isinstance(keys, list) or len(keys) != len(kinds):
            raise BadCursor(cursor)
        return [_cursor_key(kind, key) for kind, key in zip(kinds, keys, strict=True)]
    except (binascii.Error, ValueError, KeyError, TypeError, OverflowError):
        raise BadCursor(cursor) from None
