"""The check of JSON values (app/models/json_values.py): checked_json_text, which lets most values through by their
text alone, answers as the whole check followed by the serialisation does, for every value (the same text, or the
same refusal)."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from app.models.json_values import InvalidUnicode, JsonValueError, check_json_value, checked_json_text, dump_json


def _both_ways(value: Any, depth: int) -> tuple[str, str]:
    try:
        check_json_value(value, depth)
        whole = ("text", dump_json(value))
    except JsonValueError as exc:
        whole = (type(exc).__name__, str(exc))
    try:
        fast = ("text", checked_json_text(value, depth))
    except JsonValueError as exc:
        fast = (type(exc).__name__, str(exc))
    return whole, fast


def _nested(levels: int, kind: str = "list") -> Any:
    value: Any = 1
    for _ in range(levels):  # `levels` containers, one inside the other
        value = [value] if kind == "list" else {"k": value}
    return value


_ODD = [
    "plain",
    "null",
    "nullable",
    "\x00",
    "a\x00b",
    "\\u0000",
    "\\\\u0000",
    "\ud800",
    "é\udfff",
    "[[[[{{{{",
    "]]}}",
    "😀",
    "\u2028",
]
_NUMBERS = [0, -1, 2**63 - 1, -(2**63), 2**64, -(2**80), 10**400, 1.5, -0.0, 1e308, math.nan, math.inf, -math.inf]


@pytest.mark.parametrize(
    "value",
    [
        {"to": "user@example.com", "template": "welcome"},
        None,
        True,
        [],
        {},
        *_ODD,
        *_NUMBERS,
        {"\x00": 1},
        {"\ud800": 1},
        {"k": None},
        [1, [2, [3, math.nan]]],
        {"deep": _nested(40)},
        _nested(32),
        _nested(33),
        _nested(32, "dict"),
        _nested(33, "dict"),
        ["[" * 40],
        [["{" * 40]],
    ],
)
def test_a_value_gets_the_same_text_or_the_same_refusal_as_from_the_whole_check(value: Any) -> None:
    whole, fast = _both_ways(value, 32)
    assert fast == whole


def test_generated_values_agree_at_every_depth_limit() -> None:
    rnd = random.Random(7)

    def value(level: int) -> Any:
        pick = rnd.random()
        if level > 6 or pick < 0.4:
            return rnd.choice([*_ODD, *_NUMBERS, None, True, False, "text"])
        if pick < 0.7:
            return [value(level + 1) for _ in range(rnd.randint(0, 3))]
        keys = ["a", "b", "null", "\x00", "ü", "\ud800"]
        return {rnd.choice(keys): value(level + 1) for _ in range(rnd.randint(0, 3))}

    refused = passed = 0
    for _ in range(20_000):
        v, depth = value(1), rnd.randint(1, 8)
        whole, fast = _both_ways(v, depth)
        assert fast == whole, v
        passed += whole[0] == "text"
        refused += whole[0] != "text"
    assert passed > 1000 and refused > 1000  # both sides of the check were exercised


def test_the_refusals_name_what_is_wrong() -> None:
    with pytest.raises(InvalidUnicode):
        checked_json_text({"k": "\ud800"}, 32)
    with pytest.raises(JsonValueError, match="finite"):
        checked_json_text([math.inf], 32)
    with pytest.raises(JsonValueError, match="NUL"):
        checked_json_text({"k\x00": 1}, 32)
    with pytest.raises(JsonValueError, match="deeper than 32"):
        checked_json_text(_nested(33), 32)
    assert checked_json_text(2**64, 32) == str(2**64)  # stored exactly, through the standard library
