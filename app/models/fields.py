"""The vocabulary request bodies are written in: field types and their checks, optional fields, Body."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError

from app.db import tokens

QUEUE_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
INT64_MAX = 2**63 - 1


def _text(value: Any) -> Any:
    """Times are RFC 3339 strings. pydantic would also take a number as a Unix time: not in this API."""
    if not isinstance(value, str | datetime):
        raise ValueError("must be an RFC 3339 date-time string with an offset")
    return value


def _utc(value: datetime) -> datetime:
    """The instant in UTC: RFC 3339 allows offsets up to 23:59, PostgreSQL only up to 15:59."""
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("out of range (years 1 to 9999 in UTC)") from None


def _integral(value: Any) -> Any:
    """JSON has one number type, and JSON Schema calls 2.0 an integer: take it as 2. Anything else that is
    not an int ("5", true, 2.5) stays as it is and fails the strict int check, never coerced."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


Integral = BeforeValidator(_integral)
# Integers: strict (no strings, booleans or fractions), integral floats accepted. The constraint goes
# before the validator, or pydantic writes it into the JSON Schema under its own name (`ge`).
PRIORITY_MIN, PRIORITY_MAX = -32768, 32767  # smallint
MAX_ATTEMPTS_MAX = 1000
TIMEOUT_MAX_SECONDS = 604_800  # a hard timeout: at most a week, the longest lease
Priority = Annotated[int, Strict(), Field(ge=PRIORITY_MIN, le=PRIORITY_MAX), Integral]
MaxAttempts = Annotated[int, Strict(), Field(ge=1, le=MAX_ATTEMPTS_MAX), Integral]
TimeoutSeconds = Annotated[int, Strict(), Field(ge=1, le=TIMEOUT_MAX_SECONDS), Integral]
JobId = Annotated[int, Strict(), Field(ge=1, le=INT64_MAX, json_schema_extra={"format": "int64"}), Integral]
Seconds = Annotated[float, Field(ge=0, strict=True, allow_inf_nan=False)]
Timestamp = Annotated[AwareDatetime, BeforeValidator(_text), AfterValidator(_utc)]
# Printable text without control characters; PostgreSQL text cannot hold NUL at all.
LABEL_PATTERN = r"^[^\x00-\x1f\x7f]+$"
Label = Annotated[str, Field(min_length=1, max_length=255, pattern=LABEL_PATTERN)]
# 43 random characters, then (from 1.2.0) the queue's name in base64url (app/db/tokens.py): at most MAX_CHARS.
ClaimToken = Annotated[str, Field(min_length=1, max_length=tokens.MAX_CHARS, pattern=r"^[A-Za-z0-9_-]+$")]
ERROR_MAX_CHARS = 65_536  # accepted in a fail request; what is stored is cut to JOBQ_MAX_ERROR_BYTES

# Payloads and results: any JSON value that jsonb can hold. app/http/openapi.py replaces this marker with a
# reference to the JsonValue schema, which says so in words (no NUL, depth and size limits): a recursive
# schema defeats client generators, and depth and size are settings. check_json_value() enforces it.
JSON_VALUE_MARKER = "x-jobq-json-value"
Json = Annotated[Any, WithJsonSchema({JSON_VALUE_MARKER: True})]

T = TypeVar("T")


def _not_null(value: Any) -> Any:
    if value is None:
        raise PydanticCustomError("not_null", "Input should not be null: leave the field out instead")
    return value


def _omittable_schema(schema: dict[str, Any]) -> None:
    """The value's schema alone: no null branch and no `default: null`, so that generated clients type the
    field as absent-or-value, not a three-way absent/null/value."""
    variants = [v for v in schema.pop("anyOf", []) if v != {"type": "null"}]
    if len(variants) == 1:
        schema.update(variants[0])
    elif variants:
        schema["anyOf"] = variants
    schema.pop("default", None)


# An optional request field: left out or a value, never null (null would mean nothing more than leaving it
# out). Declare it `x: Maybe[T] = omitted("...")`: the type stays `T | None` for the code, the validator
# refuses an explicit null, and the schema shows T alone.
Maybe = Annotated[T | None, BeforeValidator(_not_null)]


def omitted(description: str) -> Any:
    return Field(None, description=description, json_schema_extra=_omittable_schema)


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # A compiled decoder of the body's common shape (app/models/fast.py), tried before the model by the fast path
    # (app/http/fastpath.py): its value, or None to validate with the model, which then answers as it always does.
    fast_json: ClassVar[Callable[[bytes], Any] | None] = None
