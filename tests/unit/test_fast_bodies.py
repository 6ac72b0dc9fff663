"""The compiled decoders of the hot bodies (app/models/fast.py: enqueue, batch enqueue, claim, batch complete)
against the pydantic models they stand in front of: whatever a decoder takes, the model takes too and gives the same
values (types included), so the 4xx answers stay the model's; and the common shapes do take the fast way."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from app.models import fast
from app.models.fast import FAST_MAX_BYTES, HIDDEN_MAX, LONGEST_NUMBER, MOST_NESTED
from app.models.jobs import Contract, build_contract
from app.settings import Settings

SETTINGS = Settings(
    max_delay_seconds=3600,
    max_idempotency_key_length=20,
    max_batch_jobs=5,
    max_worker_length=10,
    max_claim_limit=50,
    lease_max_seconds=600,
    wait_max_seconds=20,
    max_batch_complete=3,
)
CONTRACT = build_contract(SETTINGS)
ONE, BATCH, CLAIM, COMPLETE = CONTRACT.enqueue, CONTRACT.enqueue_batch, CONTRACT.claim, CONTRACT.complete_batch
# The limits at their other ends: the defaults, and the largest the settings allow.
CONTRACTS = [
    CONTRACT,
    build_contract(Settings()),
    build_contract(
        Settings(
            max_delay_seconds=31_622_400,
            max_idempotency_key_length=512,
            max_batch_jobs=10_000,
            max_worker_length=1024,
            max_claim_limit=1000,
            lease_max_seconds=604_800,
            wait_max_seconds=300,
            max_batch_complete=10_000,
        )
    ),
]
# What the service reads of a job (app/core/jobs.py _new_job, enqueue_batch, _keyed).
READ = (
    "payload", "priority", "run_at", "delay_seconds", "max_attempts", "idempotency_key", "group", "timeout_seconds",
    "depends_on", "on_dependency_failure", "ref", "unique", "debounce",
)  # fmt: skip


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values and of the same Python types all the way down (1 is not 1.0, nor True), dicts in
    the same key order (the order the answer's payload is written in)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, float) and a != a:
        return b != b
    return bool(a == b)


def check(body: bytes, contract: Contract = CONTRACT) -> bool:
    """Both decoders of the single body and of a batch of it agree; True when the fast one took it."""
    took = False
    one, batch = contract.enqueue, contract.enqueue_batch
    for model, wrapped in ((one, body), (batch, b'{"jobs": [' + body + b"]}")):
        assert model.fast_json is not None
        fast = model.fast_json(wrapped)
        if fast is None:
            continue
        took = True
        slow = model.model_validate_json(wrapped)  # raises if the model refuses what the decoder took
        pairs = [(fast, slow)] if model is one else list(zip(fast.jobs, slow.jobs, strict=True))
        assert pairs, wrapped
        for f, s in pairs:
            for name in READ:
                assert same(getattr(f, name), getattr(s, name)), (wrapped, name, getattr(f, name), getattr(s, name))
    return took


COMMON = [
    b'{"payload": {"to": "user@example.com", "template": "welcome"}}',
    b'{"payload": null}',
    b'{"payload": [1, 2.5, "x", true, null, {"a": {}}]}',
    b'{"payload": 1, "priority": -32768, "max_attempts": 1000, "timeout_seconds": 604800}',
    b'{"payload": 1, "delay_seconds": 5}',
    b'{"payload": 1, "delay_seconds": 0.25}',
    b'{"payload": 1, "idempotency_key": "order-17", "group": "tenant \xc3\xa9 \xf0\x9f\x98\x80"}',
    b'{"payload": "caf\xc3\xa9 \\u00e9 \\ud83d\\ude00 \\/ \\n"}',
    b'{"payload": {"a": 1, "b": 2, "a": 3}}',
    b'{"payload": 123456789012345678901234567890, "priority": 32767}',
    b'{"payload": -0.0}',
    b'{"payload": 1E2}',
    b'{"payload": 1, "payload": 2}',
    b'{"payload": ["see [1", "a[0] = {", "}}", "\\"]", "\\\\[", "0.' + b"0" * 60 + b'"]}',
    b'{"payload": ' + b"[" * MOST_NESTED + b"]" * MOST_NESTED + b"}",
]

REFUSED_OR_MODELS = [
    b'{"payload": 1, "priority": null}',
    b'{"payload": 1, "priority": 2.0}',
    b'{"payload": 1, "priority": true}',
    b'{"payload": 1, "priority": "2"}',
    b'{"payload": 1, "priority": 32768}',
    b'{"payload": 1, "max_attempts": 0}',
    b'{"payload": 1, "delay_seconds": 3601}',
    b'{"payload": 1, "delay_seconds": -1}',
    b'{"payload": 1, "delay_seconds": true}',
    b'{"payload": 1, "idempotency_key": ""}',
    b'{"payload": 1, "idempotency_key": "abc\\n"}',
    b'{"payload": 1, "idempotency_key": "abc\\u0000"}',
    b'{"payload": 1, "idempotency_key": "123456789012345678901"}',
    b'{"payload": 1, "run_at": "2030-01-01T00:00:00Z"}',
    b'{"payload": 1, "depends_on": []}',
    b'{"payload": 1, "ref": "a"}',
    b'{"payload": 1, "unique": {}}',
    b'{"payload": 1, "debounce": {"key": "k", "seconds": 1}}',
    b'{"payload": 1, "on_dependency_failure": "run"}',
    b'{"payload": 1, "nope": 1}',
    b'{"priority": 1}',
    b'{"payload": 1e400}',
    b'{"payload": NaN}',
    b'{"payload": "\\ud800"}',
    b'{"payload": "\\udc00x"}',
    b'{"payload": "\xed\xa0\x80"}',
    b'{"payload": "\xff"}',
    b'{"payload": "a\tb"}',
    b'{"payload": 01}',
    b'{"payload": [1,]}',
    b'\xef\xbb\xbf{"payload": 1}',
    b'{"payload": 1} x',
    b"[]",
    b"null",
    b'{"payload": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # past msgspec's own depth (RecursionError)
    # Where the parsers part (see app/models/fast.py plain()): pydantic refuses nesting past 200 levels ...
    b'{"payload": ' + b"[" * 201 + b"]" * 201 + b"}",
    b'{"payload": ' + b'{"a": ' * 200 + b"1" + b"}" * 200 + b"}",
    # ... and numbers past 4,300 digits, which msgspec reads as 1.0.
    b'{"payload": 1' + b"0" * 4301 + b"e-4301}",
    b'{"payload": 1, "delay_seconds": 1' + b"0" * 4301 + b"e-4301}",
    b'{"payload": 1' + b"0" * 4000 + b".0e-4000}",
    # Past the decoder's own bounds, where the model decides even if both agree.
    b'{"payload": 1' + b"0" * LONGEST_NUMBER + b"}",
    b'{"payload": "' + b"-" * (LONGEST_NUMBER + 1) + b'"}',
    b'{"payload": ' + b"[" * (MOST_NESTED + 1) + b"]" * (MOST_NESTED + 1) + b"}",
]


@pytest.mark.parametrize("body", COMMON)
def test_the_common_shapes_take_the_compiled_decoder_and_give_the_models_values(body: bytes) -> None:
    assert check(body)


@pytest.mark.parametrize("body", REFUSED_OR_MODELS)
def test_what_the_decoder_does_not_take_goes_to_the_model(body: bytes) -> None:
    assert not check(body)


def _nest(depth: int, kind: str) -> bytes:
    """A JSON value `depth` levels deep: arrays, objects, or arrays whose strings hold the brackets that would pair
    with the real ones if strings were not told apart (the second review's break of a byte-level check)."""
    if kind == "arrays":
        return b"[" * depth + b"]" * depth
    if kind == "objects":
        return b'{"k": ' * depth + b"1" + b"}" * depth
    return b'["]",' * depth + b"0" + b',"["]' * depth


@pytest.mark.parametrize("kind", ["arrays", "objects", "strings"])
@pytest.mark.parametrize("depth", [1, MOST_NESTED, MOST_NESTED + 1, 150, 196, 197, 198, 199, 200, 201, 500, 999, 1100])
def test_nesting_at_any_depth_is_read_alike(depth: int, kind: str) -> None:
    """A payload or a result nested to the decoder's bound is taken, deeper ones go to the model, which refuses past
    200 levels of the whole body while msgspec would go on to about 1,000."""
    value = _nest(depth, kind)
    assert check(b'{"payload": ' + value + b"}") == (depth <= MOST_NESTED), depth
    claim = b'{"worker": "w", "complete": [{"id": 1, "claim_token": "ab", "result": %s}]}' % value
    assert check_claim(claim) == (depth <= MOST_NESTED), depth


def test_the_depth_check_is_bounded_by_its_levels_not_by_the_body() -> None:
    """A value of many levels costs the check its bound's levels, once each: it stops at the first too deep."""
    calls = 0
    original = fast.containers

    def counted(value: Any, levels: int = MOST_NESTED) -> int:
        nonlocal calls
        calls += 1
        return original(value, levels)

    deep = orjson.loads(b"[" * 900 + b"]" * 900)
    fast.containers = counted  # type: ignore[assignment]
    try:
        assert fast.containers(deep) == -1
    finally:
        fast.containers = original  # type: ignore[assignment]
    assert calls == MOST_NESTED + 1  # one a level down to the bound, not one of the 900
    assert original(orjson.loads(b"[" * MOST_NESTED + b"]" * MOST_NESTED)) == MOST_NESTED
    assert (
        original(orjson.loads(b'{"a": [1, {"b": []}, "[{"], "c": {}}')) == 5
    )  # the object, a's list, the object in it, b's list, c's object


@pytest.mark.parametrize("depth", [150, 163, 164, 196, 199, 200, 201, 500, 990])
def test_a_deep_value_replaced_by_a_later_duplicate_key_goes_to_the_model(depth: int) -> None:
    """msgspec keeps the last of a repeated key, pydantic parses every one first: a deep value hidden behind a later
    duplicate is counted among the brackets the decoded value does not hold (the third review's break)."""
    hidden = b"[" * depth + b"]" * depth
    for body in (
        b'{"payload": {"a": ' + hidden + b', "a": 1}}',
        b'{"payload": ' + hidden + b', "payload": 1}',
        b'{"payload": {"x": ' + _nest(30, "objects") + b', "a": ' + hidden + b', "a": 1}}',
    ):
        assert not check(body), depth
    tail = b'{"id": 1, "claim_token": "ab", "result": ' + hidden + b', "result": 1}'
    assert not check_claim(b'{"worker": "w", "complete": [' + tail + b"]}")
    first = b'[{"id": 2, "claim_token": "ab", "result": ' + hidden + b"}]"
    assert CLAIM.fast_json is not None
    assert CLAIM.fast_json(b'{"worker": "w", "complete": ' + first + b', "complete": []}') is None
    assert BATCH.fast_json is not None and COMPLETE.fast_json is not None
    assert BATCH.fast_json(b'{"jobs": ' + hidden + b', "jobs": [{"payload": 1}]}') is None
    assert COMPLETE.fast_json(b'{"jobs": ' + hidden + b', "jobs": [{"id": 1, "claim_token": "ab"}]}') is None


def test_brackets_in_strings_are_taken_up_to_the_bound() -> None:
    """Brackets the value does not hold (in strings) up to HIDDEN_MAX keep a body on the fast way; past it, the
    model decides (a batch of strings full of brackets is read alike, only slower)."""
    assert check(b'{"payload": "' + b"[" * HIDDEN_MAX + b'"}')
    assert not check(b'{"payload": "' + b"{" * (HIDDEN_MAX + 1) + b'"}')
    assert check(b'{"payload": ["' + b"[" * (HIDDEN_MAX - 1) + b'", {"a": []}]}')


def test_a_body_past_the_fast_bound_goes_to_the_model() -> None:
    big = b'{"payload": "' + b"x" * FAST_MAX_BYTES + b'"}'
    assert ONE.fast_json is not None and ONE.fast_json(big) is None
    assert ONE.fast_json(b'{"payload": "' + b"x" * (FAST_MAX_BYTES - 20) + b'"}') is not None


def test_a_batch_outside_its_bounds_goes_to_the_model() -> None:
    assert BATCH.fast_json is not None
    assert BATCH.fast_json(b'{"jobs": []}') is None  # the model: at least one
    assert BATCH.fast_json(b'{"jobs": [' + b", ".join([b'{"payload": 1}'] * 6) + b"]}") is None  # at most 5 here
    assert BATCH.fast_json(b'{"jobs": [{"payload": 1}], "more": 1}') is None
    assert BATCH.fast_json(b'{"jobs": null}') is None
    took = BATCH.fast_json(b'{"jobs": [' + b", ".join([b'{"payload": 1}'] * 5) + b"]}")
    assert took is not None and len(took.jobs) == 5


# Pieces of JSON chosen where parsers part: escapes, surrogates, UTF-8, numbers at and past their limits.
_STRINGS = [
    '""', '"a"', '"\\u0000"', '"\\u001f"', '"\\u007f"', '"\\ud83d\\ude00"', '"\\ud83d"', '"\\ude00"',
    '"\\uD800\\u0041"',
    '"\\""', '"\\\\"', '"\\/"', '"\\x"', '"\\u12"', '"é"', '"😀"', '"\u2028"', '"\x7f"', '"a\nb"', '"\\n"', "'a'",
]  # fmt: skip
_NUMBERS = [
    "0", "-0", "1", "-1", "2.0", "1.5", "1e2", "1E-2", "-0.0", "1e308", "1e309", "-1e309", "5e-324", "1e-400",
    "1" + "0" * 4301 + "e-4301", "1" + "0" * 4300 + "e-4300", "0." + "0" * 70 + "1", "1" + "0" * 63 + "e-63",
    "9223372036854775807", "9223372036854775808", "-9223372036854775809", "18446744073709551616",
    "123456789012345678901234567890", "01", "1.", ".5", "+1", "0x10", "Infinity", "NaN", "-", "1e", "3600", "3600.0",
    "3600.5", "32767", "32768", "-32768", "-32769", "1000", "1001", "604800", "604801",
]  # fmt: skip
_OTHERS = ["true", "false", "null", "[]", "{}", "[1,]", "{,}", '{"a":1,"a":2}', "[[[[[]]]]]"]
_FIELDS = [
    "priority", "delay_seconds", "max_attempts", "idempotency_key", "group", "timeout_seconds", "run_at", "ref",
    "payload", "unknown",
]  # fmt: skip


def _value(rng: random.Random, depth: int = 0) -> str:
    roll = rng.random()
    if roll < 0.35:
        return rng.choice(_STRINGS)
    if roll < 0.7:
        return rng.choice(_NUMBERS)
    if roll < 0.8 or depth > 2:
        return rng.choice(_OTHERS)
    if roll < 0.9:
        return "[" + ", ".join(_value(rng, depth + 1) for _ in range(rng.randrange(3))) + "]"
    items = [f"{rng.choice(_STRINGS)}: {_value(rng, depth + 1)}" for _ in range(rng.randrange(3))]
    return "{" + ", ".join(items) + "}"


@pytest.mark.parametrize("contract", CONTRACTS, ids=["small", "default", "largest"])
def test_on_thousands_of_bodies_built_to_tell_them_apart_whatever_the_decoder_takes_the_model_takes_alike(
    contract: Contract,
) -> None:
    rng = random.Random(20261207)
    taken = 0
    for _ in range(4000):
        fields = [f'"payload": {_value(rng)}'] if rng.random() < 0.9 else []
        for name in rng.sample(_FIELDS, rng.randrange(3)):
            fields.append(f'"{name}": {_value(rng)}')
        taken += check(("{" + ", ".join(fields) + "}").encode(), contract)
    assert taken > 400  # the corpus reaches the decoder's acceptances, not only its refusals


def test_the_values_written_are_the_models() -> None:
    """The payload a job is stored with is serialised from the decoded value: the same text either way."""
    body = b'{"payload": {"b": [1, 2.50, -0.0, 1e2, "\\u00e9"], "a": {"x": null}, "b": 7}}'
    assert ONE.fast_json is not None
    fast, slow = ONE.fast_json(body), ONE.model_validate_json(body)
    assert orjson.dumps(fast.payload) == orjson.dumps(slow.payload) == b'{"b":7,"a":{"x":null}}'


# --- claims and batch completes ------------------------------------------------------------------------------

TOKEN = "A" * 43 + "cXVldWU"


def completes(item: Any) -> list[tuple[Any, Any, Any]]:
    return [(i.id, i.claim_token, i.result) for i in item]


def check_claim(body: bytes, contract: Contract = CONTRACT) -> bool:
    """The claim body, and its `complete` list as written (the bytes after `"complete": `, when the body has one
    at its end) as a batch complete: both decoders agree; True when the fast one took either."""
    took = False
    claim, complete = contract.claim, contract.complete_batch
    assert claim.fast_json is not None and complete.fast_json is not None
    if (fast := claim.fast_json(body)) is not None:
        took = True
        slow = claim.model_validate_json(body)
        for name in ("worker", "limit", "lease_seconds", "wait_seconds"):
            assert same(getattr(fast, name), getattr(slow, name)), (body, name)
        assert len(fast.complete) == len(slow.complete)
        assert all(map(same, completes(fast.complete), completes(slow.complete))), body
    marker = b'"complete": '
    if marker in body and body.endswith(b"]}"):
        batch = b'{"jobs": ' + body[body.rindex(marker) + len(marker) : -1] + b"}"
        if (fast := complete.fast_json(batch)) is not None:
            took = True
            slow = complete.model_validate_json(batch)
            assert len(fast.jobs) == len(slow.jobs) and all(map(same, completes(fast.jobs), completes(slow.jobs)))
    return took


CLAIMS_COMMON = [
    b'{"worker": "w1"}',
    b'{"worker": "w1", "limit": 10, "wait_seconds": 5}',
    b'{"worker": "w\\u00e9 \\ud83d\\ude00", "limit": 50, "wait_seconds": 0.5, "lease_seconds": 600}',
    b'{"worker": "w1", "limit": 10, "complete": [{"id": 1, "claim_token": "%s"}]}' % TOKEN.encode(),
    b'{"worker": "w1", "complete": [{"id": 9223372036854775807, "claim_token": "a-_9", "result": {"n": 1.5}}]}',
    b'{"worker": "w1", "complete": [{"id": 2, "claim_token": "x", "result": null}, {"id": 3, "claim_token": "y"}]}',
    b'{"worker": "w1", "complete": []}',
]

CLAIMS_REFUSED = [
    b'{"worker": ""}',
    b'{"worker": "w1\\n"}',
    b'{"worker": "12345678901"}',
    b'{"worker": "w1", "limit": 51}',
    b'{"worker": "w1", "limit": 0}',
    b'{"worker": "w1", "limit": 2.0}',
    b'{"worker": "w1", "limit": null}',
    b'{"worker": "w1", "lease_seconds": null}',
    b'{"worker": "w1", "lease_seconds": 601}',
    b'{"worker": "w1", "wait_seconds": 20.5}',
    b'{"worker": "w1", "wait_seconds": null}',
    b'{"worker": "w1", "wait_seconds": false}',
    b'{"worker": "w1", "complete": null}',
    b'{"worker": "w1", "other": 1}',
    b'{"limit": 1}',
    b'{"worker": "w1", "complete": [{"id": 1, "claim_token": "a b"}]}',
    b'{"worker": "w1", "complete": [{"id": 1, "claim_token": "ab\\n"}]}',
    b'{"worker": "w1", "complete": [{"id": 1, "claim_token": "\\u00e9"}]}',
    b'{"worker": "w1", "complete": [{"id": 1, "claim_token": ""}]}',
    b'{"worker": "w1", "complete": [{"id": 1, "claim_token": "a+b"}]}',
    b'{"worker": "w1", "complete": [{"id": 0, "claim_token": "ab"}]}',
    b'{"worker": "w1", "complete": [{"id": 9223372036854775808, "claim_token": "ab"}]}',
    b'{"worker": "w1", "complete": [{"id": 1.0, "claim_token": "ab"}]}',
    b'{"worker": "w1", "complete": [{"id": 1}]}',
    b'{"worker": "w1", "complete": [{"id": 1, "claim_token": "ab", "extra": 1}]}',
    b'{"worker": "w1", "complete": [{"id": 1, "claim_token": "%s"}]}' % (b"a" * 1000),
    b'{"worker": "w1", "complete": [{"id": 1, "claim_token": "a"}, {"id": 2, "claim_token": "b"}, '
    b'{"id": 3, "claim_token": "c"}, {"id": 4, "claim_token": "d"}]}',
]


@pytest.mark.parametrize("body", CLAIMS_COMMON)
def test_common_claims_and_completes_take_the_compiled_decoder_and_give_the_models_values(body: bytes) -> None:
    assert check_claim(body)


@pytest.mark.parametrize("body", CLAIMS_REFUSED)
def test_claims_and_completes_the_decoder_does_not_take_go_to_the_model(body: bytes) -> None:
    assert not check_claim(body)


def test_an_empty_batch_complete_goes_to_the_model() -> None:
    assert COMPLETE.fast_json is not None and COMPLETE.fast_json(b'{"jobs": []}') is None


_TOKENS = [
    '"ab"',
    '"a-_9Z"',
    '"a b"',
    '"a\\n"',
    '"\\u0041"',
    '"é"',
    '"a.b"',
    '""',
    '"a/b"',
    '"٣"',
    '"\uff41"',  # fullwidth a: isalnum() but not ASCII
    '"²"',
    *_STRINGS,
]


@pytest.mark.parametrize("contract", CONTRACTS, ids=["small", "default", "largest"])
def test_on_thousands_of_claims_built_to_tell_them_apart_whatever_the_decoder_takes_the_model_takes_alike(
    contract: Contract,
) -> None:
    rng = random.Random(2026120702)
    taken = 0
    names = ["worker", "limit", "lease_seconds", "wait_seconds", "complete", "other"]
    for _ in range(4000):
        fields = [f'"worker": {rng.choice(_TOKENS)}'] if rng.random() < 0.9 else []
        chosen = rng.sample(names, rng.randrange(3))
        for name in chosen:
            if name != "complete":
                fields.append(f'"{name}": {_value(rng)}')
        if "complete" in chosen:  # last: check_claim also sends the list as written as a batch complete
            items = []
            for _ in range(rng.randrange(5)):
                item = [f'"id": {rng.choice(_NUMBERS)}', f'"claim_token": {rng.choice(_TOKENS)}']
                if rng.random() < 0.5:
                    item.append(f'"result": {_value(rng)}')
                items.append("{" + ", ".join(rng.sample(item, len(item))) + "}")
            fields.append(f'"complete": [{", ".join(items)}]')
        taken += check_claim(("{" + ", ".join(fields) + "}").encode(), contract)
    assert taken > 400
