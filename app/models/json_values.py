"""The checks on JSON values (payloads, results, progress): what jsonb cannot store faithfully is refused."""

from __future__ import annotations

import json
import math
from typing import Any

import orjson

# --- JSON values --------------------------------------------------------------------------------------------


class JsonValueError(ValueError):
    pass


class InvalidUnicode(JsonValueError):
    """Lone surrogates: legal JSON syntax, but not I-JSON (RFC 7493) and not storable."""


def _check_text(text: str, what: str) -> None:
    if "\x00" in text:
        raise JsonValueError(f"{what} must not contain NUL (\\u0000)")
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise InvalidUnicode(f"{what} must be valid Unicode (no lone surrogates)") from None


def check_json_value(value: Any, max_depth: int) -> None:
    """Refuse what jsonb cannot store faithfully: NaN/Infinity (would turn into null), NUL characters,
    lone surrogates, and nesting deeper than max_depth. Iterative, so a hostile depth cannot exhaust the
    Python stack."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is str:
            # The common case inline (ASCII without NUL); _check_text says what is wrong otherwise.
            if not item.isascii() or "\x00" in item:
                _check_text(item, "strings")
        elif kind is float:
            if not math.isfinite(item):
                raise JsonValueError("numbers must be finite")
        elif kind is dict:
            if depth > max_depth:
                raise JsonValueError(f"nesting deeper than {max_depth} levels")
            for k, v in item.items():
                if not k.isascii() or "\x00" in k:
                    _check_text(k, "keys")
                if type(v) in _CONTAINERS_OR_TEXT:
                    stack.append((v, depth + 1))
                elif type(v) is float and not math.isfinite(v):
                    raise JsonValueError("numbers must be finite")
        elif kind is list:
            if depth > max_depth:
                raise JsonValueError(f"nesting deeper than {max_depth} levels")
            stack.extend((v, depth + 1) for v in item)


# JSON values as parsed are exactly these types (bool and int need no check; floats are checked in place).
_CONTAINERS_OR_TEXT = frozenset({str, dict, list})


def checked_json_text(value: Any, max_depth: int) -> str:
    """check_json_value() and dump_json() in one: the value's JSON text, or the check's refusal. Most values are
    let through by their text alone, which says all the check would find: orjson writes NaN and the infinities as
    `null` and NUL as `\\u0000`, refuses lone surrogates and integers past 64 bits, and a value cannot nest deeper
    than its text has brackets. A text with any of these (a `null` in it, say) goes through the whole check. Both
    orders of work answer the same; this one costs about a fifth (a job's payload is checked on every enqueue)."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:  # a lone surrogate, an integer past 64 bits
        pass
    else:
        if "null" not in text and "\\u0000" not in text and text.count("[") + text.count("{") <= max_depth:
            return text
    check_json_value(value, max_depth)
    return dump_json(value)


def dump_json(value: Any) -> str:
    """Serialise a checked JSON value for a jsonb parameter. Integers beyond 64 bits go through the
    standard library so that they are stored exactly rather than refused."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
