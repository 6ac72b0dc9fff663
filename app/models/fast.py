"""Compiled decoders (msgspec) of the hot bodies' common shape: an enqueue or a batch of jobs with a payload and
any of the plain options, a claim (with the completes it hands in), a batch complete. A body they take is the value
the pydantic model would give, field for field; any other body (a field they do not know, `null` where the model
refuses it, `2.0` for an integer, a refused value, malformed JSON) makes them answer None, and the model validates
it and answers as it always has, its 4xx included. So they only ever decide what is accepted faster, never what
is accepted.

Why: pydantic's model of a job, fourteen optional fields and a check across them, took 2.3 µs a job of a batch of
1,000, msgspec with the checks below 0.7; a claim of 10 handing in 10 completes 13.2 µs against 8.1 (timeit;
BENCHMARKS.md, stop 45).

tests/unit/test_fast_bodies.py holds both to that on bodies chosen to tell them apart."""

# No `from __future__ import annotations`: the structs' types name this function's limits, read when the class
# is made.
from collections.abc import Callable
from typing import Annotated, Any, ClassVar

import msgspec
from msgspec import Meta

from app.db import tokens
from app.models.fields import (
    INT64_MAX,
    LABEL_PATTERN,
    MAX_ATTEMPTS_MAX,
    PRIORITY_MAX,
    PRIORITY_MIN,
    TIMEOUT_MAX_SECONDS,
)

# The model's LABEL_PATTERN with Python's end of string: `$` would also match before a final newline, which the
# model's (Rust) `$` does not.
_LABEL = LABEL_PATTERN.removesuffix("$") + r"\Z"


def enqueue_structs(
    max_delay_seconds: float, max_key_chars: int, max_batch_jobs: int
) -> tuple[type[msgspec.Struct], type[msgspec.Struct]]:
    """The shapes of one job (POST /queues/{q}/jobs) and of a batch, with the limits of build_contract().

    Each field has its model's type and bounds and no `| None`: an explicit null is not taken (the model refuses
    it: leave the field out). Integers are JSON integers only (the model also takes 2.0: the model's answer). The
    options with rules across fields or a parse of their own (run_at, depends_on, ref, on_dependency_failure,
    unique, debounce) are not fields: a body with one goes to the model; the service reads them as None here."""
    label = Meta(min_length=1, max_length=max_key_chars, pattern=_LABEL)

    class FastEnqueue(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
        payload: Any
        priority: Annotated[int, Meta(ge=PRIORITY_MIN, le=PRIORITY_MAX)] = None  # type: ignore[assignment]
        delay_seconds: Annotated[float, Meta(ge=0, le=max_delay_seconds)] = None  # type: ignore[assignment]
        max_attempts: Annotated[int, Meta(ge=1, le=MAX_ATTEMPTS_MAX)] = None  # type: ignore[assignment]
        idempotency_key: Annotated[str, label] = None  # type: ignore[assignment]
        group: Annotated[str, label] = None  # type: ignore[assignment]
        timeout_seconds: Annotated[int, Meta(ge=1, le=TIMEOUT_MAX_SECONDS)] = None  # type: ignore[assignment]
        run_at: ClassVar[None] = None
        depends_on: ClassVar[None] = None
        on_dependency_failure: ClassVar[None] = None
        ref: ClassVar[None] = None
        unique: ClassVar[None] = None
        debounce: ClassVar[None] = None

    class FastEnqueueBatch(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
        jobs: Annotated[list[FastEnqueue], Meta(min_length=1, max_length=max_batch_jobs)]

    return FastEnqueue, FastEnqueueBatch


class FastCompleteItem(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """CompleteItem: `result` may be null (the model's default is None). The token's characters are checked for
    all items at once (_tokens_valid): msgspec's pattern is a Python regex call a string, 0.7 µs each."""

    id: Annotated[int, Meta(ge=1, le=INT64_MAX)]
    claim_token: Annotated[str, Meta(min_length=1, max_length=tokens.MAX_CHARS)]
    result: Any = None


def _tokens_valid(items: list[FastCompleteItem]) -> bool:
    """Every token of `items` of ClaimToken's characters ([A-Za-z0-9_-], each at least one: min_length)."""
    if not items:
        return True
    text = "".join([i.claim_token for i in items])
    return text.isascii() and text.replace("-", "a").replace("_", "a").isalnum()


def claim_structs(
    max_worker_chars: int, max_claim_limit: int, lease_max_seconds: int, wait_max_seconds: float, max_complete: int
) -> tuple[type[msgspec.Struct], type[msgspec.Struct]]:
    """The shapes of a claim and of a batch complete, with the limits of build_contract(). The defaults are the
    models' values, of their types (`wait_seconds` 0, an int, as the model's default)."""
    completes = Annotated[list[FastCompleteItem], Meta(max_length=max_complete)]
    worker_text = Meta(min_length=1, max_length=max_worker_chars, pattern=_LABEL)

    class FastClaim(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
        worker: Annotated[str, worker_text]
        limit: Annotated[int, Meta(ge=1, le=max_claim_limit)] = 1
        lease_seconds: Annotated[int, Meta(ge=1, le=lease_max_seconds)] = None  # type: ignore[assignment]
        wait_seconds: Annotated[float, Meta(ge=0, le=wait_max_seconds)] = 0
        complete: completes = msgspec.field(default_factory=list)

    class FastCompleteBatch(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
        jobs: Annotated[list[FastCompleteItem], Meta(min_length=1, max_length=max_complete)]

    return FastClaim, FastCompleteBatch


def _results_counted(items: list[FastCompleteItem]) -> int:
    """The arrays and objects of the items (theirs, their results'), or -1 (see containers())."""
    if not _tokens_valid(items):
        return -1
    n = _held([i.result for i in items])
    return -1 if n < 0 else n + len(items)


def claim_counted(claim: Any) -> int:
    n = _results_counted(claim.complete)
    return -1 if n < 0 else n + 2  # the body, its `complete` list (counted given or not: one less surplus)


def complete_batch_counted(batch: Any) -> int:
    n = _results_counted(batch.jobs)
    return -1 if n < 0 else n + 2  # the body, its `jobs` list


# Where the two parsers part on well-formed JSON: pydantic refuses a number whose digits pass Python's 4,300 (as
# 1000...0e-4301), msgspec reads it; pydantic refuses nesting past 200 levels, msgspec goes on to Python's recursion
# limit. So a body goes to the model
#   * before it is decoded: past FAST_MAX_BYTES (bounds what the checks below cost on a hostile body, which then
#     costs the model's parse on top), or with a run of number characters longer than LONGEST_NUMBER (number
#     characters inside strings count too: at worst a body goes to the model);
#   * once decoded: with a payload or result nested deeper than MOST_NESTED (the bodies' own levels are at most four
#     more), or with more than HIDDEN_MAX brackets that the decoded value does not hold (inside strings, or in a value
#     a later duplicate key replaced, which msgspec parsed but does not keep: such a value needs 164 levels to reach
#     pydantic's 200 below a visible depth of at most 36).
FAST_MAX_BYTES = 4 * 1024 * 1024
LONGEST_NUMBER = 64  # a double needs at most 24 characters, a 64-bit integer 20
MOST_NESTED = 32  # levels of arrays and objects in a payload or a result (JOBQ_MAX_JSON_DEPTH's default)
HIDDEN_MAX = 128
_NUMBERISH = bytes(48 if chr(i) in "0123456789.eE+-" else 32 for i in range(256))  # number characters -> "0"
_LONG_RUN = b"0" * (LONGEST_NUMBER + 1)
_NESTS = (dict, list)


def plain(body: bytes) -> bool:
    """Small enough, and no number longer than LONGEST_NUMBER characters: two C-speed passes over the bytes (17 ms
    for 10 MB)."""
    return len(body) <= FAST_MAX_BYTES and _LONG_RUN not in body.translate(_NUMBERISH)


def containers(value: Any, levels: int = MOST_NESTED) -> int:
    """How many arrays and objects `value` (a decoded JSON value) holds, itself included; -1 when they nest more than
    `levels` deep. The recursion is bounded by `levels`; a scalar or a flat object costs a look at each value."""
    kind = type(value)
    if kind is dict:
        values: Any = value.values()
    elif kind is list:
        values = value
    else:
        return 0
    if levels == 0:
        return -1
    n = _held(values, levels - 1)
    return -1 if n < 0 else n + 1


def _held(values: Any, levels: int = MOST_NESTED) -> int:
    """The arrays and objects among `values` and in them (containers(), each at most `levels` deep), summed; -1 when
    one nests deeper."""
    seen = 0
    for value in values:
        if type(value) in _NESTS:
            n = containers(value, levels)
            if n < 0:
                return -1
            seen += n
    return seen


def one_counted(job: Any) -> int:
    n = containers(job.payload)
    return -1 if n < 0 else n + 1  # the body


def batch_counted(batch: Any) -> int:
    n = _held([j.payload for j in batch.jobs])
    return -1 if n < 0 else n + 2 + len(batch.jobs)  # the body, its `jobs` list, each job


def decoder(shape: type[msgspec.Struct], counted: Callable[[Any], int]) -> Callable[[bytes], Any]:
    """`shape` decoded from JSON, or None where it is not, or where `counted` (the arrays and objects of the value,
    -1 for a refusal of its own) says the body is not plain (see above): the model decides then."""
    decode = msgspec.json.Decoder(shape).decode

    def fast_json(body: bytes) -> Any:
        if not plain(body):
            return None
        try:
            value = decode(body)
        except Exception:  # malformed or refused (DecodeError), or anything else: the model decides
            return None
        seen = counted(value)
        if seen < 0 or body.count(b"[") + body.count(b"{") - seen > HIDDEN_MAX:
            return None
        return value

    return fast_json
