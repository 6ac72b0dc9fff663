"""Request bodies of the jobs API (pydantic) and the contract that fits their limits to the settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, Self

from pydantic import ConfigDict, Field, Strict, StrictBool, model_validator

from app.models import fast
from app.models.fields import (
    ERROR_MAX_CHARS,
    LABEL_PATTERN,
    Body,
    ClaimToken,
    Integral,
    JobId,
    Json,
    Label,
    MaxAttempts,
    Maybe,
    Priority,
    Seconds,
    TimeoutSeconds,
    Timestamp,
    _omittable_schema,
    omitted,
)
from app.settings import Settings

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


UNIQUE_STATES = ("pending", "running", "completed", "failed", "cancelled")
UniqueState = Literal["pending", "running", "completed", "failed", "cancelled"]
# A unique job always holds its key while pending or running: a job moves between those two by itself (a
# claim, a lease that lapsed, a failed attempt retried), and none of those moves may meet a second job with
# its key (River requires the same of ByState). The other states are the caller's choice.
UNIQUE_ALWAYS = ("pending", "running")
UNIQUE_DEFAULT_STATES = ("pending", "running", "completed")
UNIQUE_MAX_SECONDS = 31_622_400  # 366 days
UNIQUE_TEXT = (
    "At most one job per key: while a job with this key is in one of the `while` states (and, with "
    "`for_seconds`, was enqueued in the same window), an enqueue returns that job (200, `Jobq-Enqueued: "
    "existing`) instead of making one. Not with `idempotency_key` or `depends_on`. See docs/producers.md."
)


class UniqueOptions(Body):
    """What makes a job unique (docs/producers.md)."""

    key: Maybe[Label] = omitted(
        "The key, per queue. Default: a hash (SHA-256) of the payload, so the same payload on the same queue."
    )
    for_seconds: Maybe[Annotated[int, Strict(), Field(ge=1, le=UNIQUE_MAX_SECONDS), Integral]] = omitted(
        "The window: the key holds among the jobs enqueued in the same window of this many seconds. Windows "
        "are aligned to multiples of for_seconds since the Unix epoch, on the database's clock (3600: clock "
        "hours in UTC; 86400: UTC days), as River's ByPeriod and pg-boss's singletonSeconds. Default: no "
        "window, the key holds as long as such a job is in one of the `while` states."
    )
    while_: Maybe[Annotated[list[UniqueState], Field(min_length=1, max_length=5)]] = Field(
        None,
        alias="while",
        description="The states in which a job holds the key; they must include `pending` and `running`. "
        'Default `["pending", "running", "completed"]` (as River and Oban): a failed or cancelled job frees '
        "it. A job deleted by retention frees it too.",
        json_schema_extra=_omittable_schema,
    )

    @model_validator(mode="after")
    def _live_states(self) -> Self:
        if self.while_ is not None and not set(UNIQUE_ALWAYS) <= set(self.while_):
            missing = ", ".join(s for s in UNIQUE_ALWAYS if s not in self.while_)
            raise ValueError(
                f"while must include pending and running (missing: {missing}): a job moves between them "
                "by itself (claimed, its lease lapsed, retried), and may not meet a second job with its key"
            )
        return self

    def states(self) -> tuple[str, ...]:
        """The states, in a fixed order, without repeats."""
        given = UNIQUE_DEFAULT_STATES if self.while_ is None else self.while_
        return tuple(s for s in UNIQUE_STATES if s in given)


DEBOUNCE_MAX_SECONDS = 31_622_400  # 366 days
DEBOUNCE_TEXT = (
    "While a job with this key is pending on the queue, replace its payload and priority and move its run "
    "time to now + `seconds` (never past its first enqueue + `max_wait_seconds`, never earlier than it was) "
    "instead of making a job: 200, `Jobq-Enqueued: replaced`. Else (none, or it is running or finished) a "
    "new pending job due in `seconds`: 201. Not with `unique`, `idempotency_key`, `depends_on`, `run_at` or "
    "`delay_seconds`. See docs/producers.md."
)
DebounceSeconds = Annotated[float, Field(ge=0, le=DEBOUNCE_MAX_SECONDS, strict=True, allow_inf_nan=False)]


class DebounceOptions(Body):
    """What makes an enqueue debounced (docs/producers.md)."""

    key: Label = Field(..., description="The debounce key, per queue.")
    seconds: DebounceSeconds = Field(
        ..., description="Quiet time: the job runs this long after the latest enqueue with the key."
    )
    max_wait_seconds: Maybe[DebounceSeconds] = omitted(
        "The longest a job waits from its first enqueue, however often it is replaced: its run time is never "
        "moved past created_at + max_wait_seconds. At least `seconds`. Default: no limit."
    )

    @model_validator(mode="after")
    def _wait_covers_seconds(self) -> Self:
        if self.max_wait_seconds is not None and self.max_wait_seconds < self.seconds:
            raise ValueError("max_wait_seconds must be at least seconds")
        return self


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
    timeout_seconds: Maybe[TimeoutSeconds] = omitted(
        'Hard timeout (1-604800): a claim that runs this long is failed (`last_error` "timeout"), heartbeats '
        "or not, and the job retried or not as after any failure. Default: the queue's `timeout_seconds`, else "
        "none."
    )
    depends_on: Maybe[list[Dependency]] = omitted(DEPENDS_ON_TEXT)
    on_dependency_failure: Maybe[OnDependencyFailure] = omitted(ON_DEPENDENCY_FAILURE_TEXT)
    ref: Maybe[Label] = omitted(REF_TEXT)
    unique: Maybe[UniqueOptions] = omitted(UNIQUE_TEXT)
    debounce: Maybe[DebounceOptions] = omitted(DEBOUNCE_TEXT)

    @model_validator(mode="after")
    def _one_start_time(self) -> Self:
        if self.run_at is not None and self.delay_seconds is not None:
            raise ValueError("give run_at or delay_seconds, not both")
        if self.unique is not None and self.idempotency_key is not None:
            raise ValueError(
                "give unique or idempotency_key, not both: an idempotency key is a unique key that holds in "
                'every state, i.e. unique: {"key": ..., "while": [all five states]}'
            )
        if self.debounce is not None:
            clash = [
                name
                for name in ("unique", "idempotency_key", "depends_on", "run_at", "delay_seconds")
                if getattr(self, name)
            ]
            if clash:
                raise ValueError(
                    f"debounce goes with none of {', '.join(clash)}: a debounced job's run time and identity "
                    "are its debounce key's"
                )
        if self.unique is not None and self.depends_on:
            raise ValueError("unique is not supported with depends_on (yet): enqueue the unique job on its own")
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
            DEPENDS_ON_TEXT + f" At most {s.max_dependencies} entries; the job at most {s.max_dependency_depth} "
            "dependencies deep (1 + the deepest of the jobs it names), else 422."
        )

    class EnqueueBatchRequest(_EnqueueBatchRequest):
        jobs: list[EnqueueRequest] = Field(  # type: ignore[assignment]
            ..., min_length=1, max_length=s.max_batch_jobs, description="Inserted all-or-nothing, in order."
        )

    # The common shapes of both, decoded by msgspec before the models are asked (app/models/fast.py).
    fast_one, fast_batch = fast.enqueue_structs(s.max_delay_seconds, s.max_idempotency_key_length, s.max_batch_jobs)
    EnqueueRequest.fast_json = fast.decoder(fast_one, fast.one_counted)
    EnqueueBatchRequest.fast_json = fast.decoder(fast_batch, fast.batch_counted)

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

    fast_claim, fast_complete = fast.claim_structs(
        s.max_worker_length, s.max_claim_limit, s.lease_max_seconds, s.wait_max_seconds, s.max_batch_complete
    )
    ClaimRequest.fast_json = fast.decoder(fast_claim, fast.claim_counted)

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

    CompleteBatchRequest.fast_json = fast.decoder(fast_complete, fast.complete_batch_counted)

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
