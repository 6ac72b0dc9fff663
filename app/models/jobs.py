"""Request and response bodies of the HTTP contract (pydantic), and the checks on JSON values."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self, TypeVar

import orjson
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from app.db.rows import Status
from app.settings import Settings

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
Priority = Annotated[int, Strict(), Field(ge=-32768, le=32767), Integral]
MaxAttempts = Annotated[int, Strict(), Field(ge=1, le=1000), Integral]
JobId = Annotated[int, Strict(), Field(ge=1, le=INT64_MAX, json_schema_extra={"format": "int64"}), Integral]
Seconds = Annotated[float, Field(ge=0, strict=True, allow_inf_nan=False)]
Timestamp = Annotated[AwareDatetime, BeforeValidator(_text), AfterValidator(_utc)]
# Printable text without control characters; PostgreSQL text cannot hold NUL at all.
LABEL_PATTERN = r"^[^\x00-\x1f\x7f]+$"
Label = Annotated[str, Field(min_length=1, max_length=255, pattern=LABEL_PATTERN)]
ClaimToken = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")]
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


# --- producers ----------------------------------------------------------------------------------------------

GROUP_TEXT = (
    "The job's group (a tenant, a customer, an ordering key): the unit of the queue's group limits, fairness "
    "and order (GET/PATCH /queues/{queue}/config). Same rules as an idempotency key."
)


DEPENDS_ON_TEXT = (
    "Jobs this one runs after: it is `waiting` until each of them is `completed`. An entry is a job id (of "
    "any queue this key may enqueue to), or, in a batch, an earlier item of the same batch: its `ref` as a "
    'string, or `{"ref": n}` with its index (0-based) or its `ref`. Unknown ids -> 422. See '
    "docs/workflows.md."
)
ON_DEPENDENCY_FAILURE_TEXT = (
    "When a dependency ends `failed` or `cancelled`: `cancel` (default) cancels this job, with `last_error` "
    "naming that dependency; `run` counts that dependency as done. Only with `depends_on`."
)
REF_TEXT = "A name for this item, unique in the batch, by which later items of the batch name it in `depends_on`."


class BatchRef(Body):
    """An earlier item of the same batch, by index or by its `ref`."""

    ref: Annotated[int, Strict(), Field(ge=0), Integral] | Label = Field(
        ..., description="The index (0-based) of an earlier item of the batch, or its `ref`."
    )


Dependency = JobId | Label | BatchRef
OnDependencyFailure = Literal["cancel", "run"]


class _EnqueueRequest(Body):
    # run_at and delay_seconds exclude each other; the schema says so, so that generators know.
    model_config = ConfigDict(
        json_schema_extra={
            "not": {
                "required": ["run_at", "delay_seconds"],
                "properties": {"run_at": {"type": "string"}, "delay_seconds": {"type": "number"}},
            }
        }
    )

    payload: Json = Field(..., description="Any JSON value; stored as jsonb.")
    priority: Maybe[Priority] = omitted("Higher runs first. Default: the queue's default_priority, else 0.")
    run_at: Maybe[Timestamp] = omitted("Earliest start (RFC 3339 with offset); default: now.")
    delay_seconds: Maybe[Seconds] = omitted("Earliest start, relative to now.")
    max_attempts: Maybe[MaxAttempts] = omitted("Default: the queue's max_attempts, else JOBQ_DEFAULT_MAX_ATTEMPTS.")
    idempotency_key: Maybe[Label] = omitted(
        "A repeat on the same queue returns the existing job (200) instead of a new one."
    )
    group: Maybe[Label] = omitted(GROUP_TEXT)
    depends_on: Maybe[list[Dependency]] = omitted(DEPENDS_ON_TEXT)
    on_dependency_failure: Maybe[OnDependencyFailure] = omitted(ON_DEPENDENCY_FAILURE_TEXT)
    ref: Maybe[Label] = omitted(REF_TEXT)

    @model_validator(mode="after")
    def _one_start_time(self) -> Self:
        if self.run_at is not None and self.delay_seconds is not None:
            raise ValueError("give run_at or delay_seconds, not both")
        if self.on_dependency_failure is not None and not self.depends_on:
            raise ValueError("on_dependency_failure applies to a job with depends_on")
        return self


class _EnqueueBatchRequest(Body):
    jobs: list[_EnqueueRequest] = Field(..., min_length=1, description="Inserted all-or-nothing, in order.")


# --- workers ------------------------------------------------------------------------------------------------


COMPLETE_ON_CLAIM = (
    "Jobs this worker finished, completed before the claim runs (one request per job instead of two). "
    "Each gets its outcome in the answer's `completed`, in order, exactly as from POST /jobs/complete: a "
    "refused item (claim lost, cancelled, not found) does not stop the claim. The completes are committed "
    "even when the claim then finds nothing or fails; a retry with the same tokens is safe (a repeated "
    "complete with the token that completed the job is `completed`)."
)


class CompleteItem(Body):
    id: JobId
    claim_token: ClaimToken
    result: Json = None


class _ClaimRequest(Body):
    worker: Label = Field(..., description="Who claims; stored on the job for diagnostics.")
    limit: Annotated[int, Strict(), Field(ge=1), Integral] = Field(1, description="Most jobs to return.")
    lease_seconds: Maybe[Annotated[int, Strict(), Field(ge=1), Integral]] = omitted("Lease length.")
    wait_seconds: Seconds = Field(0, description="Long-poll: wait this long for a job (max JOBQ_WAIT_MAX_SECONDS).")
    complete: list[CompleteItem] = Field(default_factory=list, description=COMPLETE_ON_CLAIM)


PROGRESS_TEXT = (
    "Progress to show on the job (GET /jobs/{id}, the dashboard): any JSON value, e.g. "
    '`{"done": 40, "total": 100}`, up to JOBQ_MAX_PROGRESS_BYTES. It replaces what an earlier heartbeat '
    "reported; null clears it; left out, the job's progress stays as it is. The next claim clears it."
)


class _HeartbeatRequest(Body):
    claim_token: ClaimToken
    lease_seconds: Maybe[Annotated[int, Strict(), Field(ge=1), Integral]] = omitted("New lease.")
    progress: Json = Field(None, description=PROGRESS_TEXT, json_schema_extra=_omittable_schema)


class CompleteRequest(Body):
    claim_token: ClaimToken
    result: Json = Field(None, description="Any JSON value, kept on the job.")


class _FailRequest(Body):
    claim_token: ClaimToken
    error: str = Field(
        ..., max_length=ERROR_MAX_CHARS, description="Why it failed; stored cut to JOBQ_MAX_ERROR_BYTES, sanitised."
    )
    retry_in_seconds: Maybe[Seconds] = omitted("Retry after this long instead of the backoff.")
    retry: StrictBool = Field(True, description="false: fail the job for good now.")


class _ReleaseRequest(Body):
    claim_token: ClaimToken
    delay_seconds: Seconds = Field(0, description="Claimable again after this long; 0: at once.")


class _CompleteBatchRequest(Body):
    jobs: list[CompleteItem] = Field(..., min_length=1)


# The services are typed against these; the routes use the subclasses from build_contract().
EnqueueRequest = _EnqueueRequest
EnqueueBatchRequest = _EnqueueBatchRequest
ClaimRequest = _ClaimRequest
HeartbeatRequest = _HeartbeatRequest
FailRequest = _FailRequest
ReleaseRequest = _ReleaseRequest
CompleteBatchRequest = _CompleteBatchRequest


# --- responses (documentation of what the handlers serialise with orjson) -----------------------------------


class Job(BaseModel):
    id: int
    queue: str
    status: Status
    payload: Json
    priority: int
    attempts: int = Field(description="Claims so far, the current one included.")
    max_attempts: int
    run_at: datetime = Field(description="Earliest time the job may be claimed (next retry when pending).")
    created_at: datetime
    claimed_at: datetime | None = Field(description="Start of the latest claim.")
    lease_expires_at: datetime | None
    finished_at: datetime | None
    worker: str | None = Field(description="Worker of the latest claim.")
    last_error: str | None
    result: Json = Field(description="What the worker completed it with; null until then.")
    idempotency_key: str | None
    traceparent: str | None = Field(
        description="W3C trace context of the enqueue that made the job (its request's span when the service "
        "traces, else the producer's `traceparent` header); a worker continues this trace. Null when none."
    )
    schedule: str | None = Field(description="The schedule that enqueued this job; null for other jobs.")
    scheduled_for: datetime | None = Field(
        description="The schedule's tick this job stands for (its cron time); null for other jobs."
    )
    group: str | None = Field(description="The job's group; null: none.")
    progress: Json = Field(
        description="What the worker last reported with a heartbeat's `progress` during the latest claim; "
        "null when it reported nothing (a new claim clears it)."
    )
    depends_on: list[int] | None = Field(description="The jobs this one runs after, as enqueued; null: none.")
    on_dependency_failure: OnDependencyFailure | None = Field(
        description="What a failed or cancelled dependency does to this job; null for a job without dependencies."
    )
    pending_dependencies: int | None = Field(
        description="While `waiting`: how many of its dependencies have not finished yet; null otherwise."
    )


class JobList(BaseModel):
    jobs: list[Job]


class Claim(BaseModel):
    id: int
    queue: str
    payload: Json
    priority: int
    attempts: int = Field(description="Claims so far, this one included.")
    max_attempts: int
    claim_token: str = Field(description="Pass it to heartbeat, complete and fail.")
    lease_expires_at: datetime
    run_at: datetime
    created_at: datetime
    traceparent: str | None = Field(
        description="W3C trace context of the enqueue that made the job (its request's span when the service "
        "traces, else the producer's `traceparent` header): start the job's span as its child. Null when none."
    )
    group: str | None = Field(description="The job's group; null: none.")


class CompleteOutcome(BaseModel):
    id: int
    outcome: Literal["completed", "claim_lost", "not_found", "cancelled"]
    status: Status | None = Field(description="The job's status after the call; null when not found.")


class ClaimResponse(BaseModel):
    jobs: list[Claim]
    completed: list[CompleteOutcome] = Field(
        description="The outcome of each item of the request's `complete`, in order (empty when it had none)."
    )


class HeartbeatResponse(BaseModel):
    id: int
    lease_expires_at: datetime | None = Field(description="The new expiry; null when the job was cancelled.")
    cancel_requested: bool = Field(
        description="An operator cancelled the job: stop working on it and do not complete it."
    )


class CompleteBatchResponse(BaseModel):
    results: list[CompleteOutcome] = Field(description="One per item, in request order.")


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready"]


class ValidationIssue(BaseModel):
    loc: list[str | int] = Field(
        description="Where: `body`, `path`, `query` or `header`, then field names and list indexes."
    )
    msg: str = Field(description="What is wrong, in words.")
    type: str = Field(description="The kind of error (pydantic's error type, e.g. `missing`, `greater_than`).")


class Problem(BaseModel):
    type: str = Field(description="A stable URN, `urn:jobq:problem:<slug>`: branch on this, not on the text.")
    title: str
    status: int
    detail: str
    instance: str = Field(description="The request's path.")
    # Sent with validation-error (422) only, and never null.
    errors: list[ValidationIssue] | None = Field(
        None,
        description="With `validation-error` only: each problem of the request.",
        json_schema_extra=_omittable_schema,
    )


# --- the contract for one configuration ---------------------------------------------------------------------


@dataclass(frozen=True)
class Contract:
    """Request models (and query bounds) whose limits come from the settings, so that the published OpenAPI
    schema states the limits this server really enforces (client generators and fuzzers rely on it)."""

    enqueue: type[EnqueueRequest]
    enqueue_batch: type[EnqueueBatchRequest]
    claim: type[ClaimRequest]
    heartbeat: type[HeartbeatRequest]
    fail: type[FailRequest]
    release: type[ReleaseRequest]
    complete_batch: type[CompleteBatchRequest]
    wait_max_seconds: int  # the longest wait_seconds of a claim or a GET /jobs/{id}


def build_contract(s: Settings) -> Contract:
    delay = Annotated[float, Field(ge=0, le=s.max_delay_seconds, strict=True, allow_inf_nan=False)]

    key_text = Annotated[str, Field(min_length=1, max_length=s.max_idempotency_key_length, pattern=LABEL_PATTERN)]
    worker_text = Annotated[str, Field(min_length=1, max_length=s.max_worker_length, pattern=LABEL_PATTERN)]

    class EnqueueRequest(_EnqueueRequest):
        delay_seconds: Maybe[delay] = omitted("Earliest start, relative to now (seconds).")
        idempotency_key: Maybe[key_text] = omitted(
            "A repeat on the same queue returns the existing job (200) instead of a new one."
        )
        group: Maybe[key_text] = omitted(GROUP_TEXT)
        depends_on: Maybe[Annotated[list[Dependency], Field(max_length=s.max_dependencies)]] = omitted(
            DEPENDS_ON_TEXT + f" At most {s.max_dependencies} entries."
        )

    class EnqueueBatchRequest(_EnqueueBatchRequest):
        jobs: list[EnqueueRequest] = Field(  # type: ignore[assignment]
            ..., min_length=1, max_length=s.max_batch_jobs, description="Inserted all-or-nothing, in order."
        )

    class ClaimRequest(_ClaimRequest):
        worker: worker_text = Field(..., description="Who claims; stored on the job for diagnostics.")
        limit: Annotated[int, Strict(), Field(ge=1, le=s.max_claim_limit), Integral] = Field(
            1, description="Most jobs to return."
        )
        lease_seconds: Maybe[Annotated[int, Strict(), Field(ge=1, le=s.lease_max_seconds), Integral]] = omitted(
            f"Lease length (seconds); default: the queue's lease_seconds, else {s.lease_default_seconds}."
        )
        wait_seconds: float = Field(
            0,
            ge=0,
            le=s.wait_max_seconds,
            strict=True,
            allow_inf_nan=False,
            description="Long-poll: wait up to this long for a job; 0 answers at once.",
        )
        complete: list[CompleteItem] = Field(
            default_factory=list, max_length=s.max_batch_complete, description=COMPLETE_ON_CLAIM
        )

    class HeartbeatRequest(_HeartbeatRequest):
        lease_seconds: Maybe[Annotated[int, Strict(), Field(ge=1, le=s.lease_max_seconds), Integral]] = omitted(
            "New lease from now; default: the claim's lease."
        )

    class FailRequest(_FailRequest):
        retry_in_seconds: Maybe[delay] = omitted("Retry after this long instead of the backoff.")

    class ReleaseRequest(_ReleaseRequest):
        delay_seconds: delay = Field(0, description="Claimable again after this long (seconds); 0: at once.")

    class CompleteBatchRequest(_CompleteBatchRequest):
        jobs: list[CompleteItem] = Field(..., min_length=1, max_length=s.max_batch_complete)

    return Contract(
        EnqueueRequest,
        EnqueueBatchRequest,
        ClaimRequest,
        HeartbeatRequest,
        FailRequest,
        ReleaseRequest,
        CompleteBatchRequest,
        s.wait_max_seconds,
    )


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


def dump_json(value: Any) -> str:
    """Serialise a checked JSON value for a jsonb parameter. Integers beyond 64 bits go through the
    standard library so that they are stored exactly rather than refused."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
