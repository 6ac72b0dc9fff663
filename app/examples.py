"""Example documents for the published OpenAPI contract, by schema name and by problem type (a test
validates each against its schema)."""

from __future__ import annotations

from typing import Any

from app.errors import (
    AppError,
    BadRequest,
    ClaimLost,
    DatabaseUnavailable,
    InvalidState,
    JobNotFound,
    NotReady,
    PayloadTooLarge,
    TooManyWaiters,
    UnsupportedMediaType,
    ValidationFailed,
)

_TOKEN = "q7Hc2dVx9Jm3Kp0LwZtY4s"
_AT = "2026-11-29T12:00:00.125+00:00"
_LATER = "2026-11-29T12:05:00.125+00:00"

_JOB: dict[str, Any] = {
    "id": 42,
    "queue": "emails",
    "status": "pending",
    "payload": {"to": "ada@example.com", "template": "welcome"},
    "priority": 5,
    "attempts": 0,
    "max_attempts": 5,
    "run_at": _AT,
    "created_at": _AT,
    "claimed_at": None,
    "lease_expires_at": None,
    "finished_at": None,
    "worker": None,
    "last_error": None,
    "result": None,
    "idempotency_key": "welcome-ada",
}
_DONE = {
    **_JOB,
    "status": "completed",
    "attempts": 1,
    "claimed_at": _AT,
    "finished_at": "2026-11-29T12:00:01.5+00:00",
    "worker": "mailer-1",
    "result": {"message_id": "abc"},
}
_CLAIM = {
    "id": 42,
    "queue": "emails",
    "payload": {"to": "ada@example.com", "template": "welcome"},
    "priority": 5,
    "attempts": 1,
    "max_attempts": 5,
    "claim_token": _TOKEN,
    "lease_expires_at": _LATER,
    "run_at": _AT,
    "created_at": _AT,
}
_ENQUEUE = {"payload": _JOB["payload"], "priority": 5, "idempotency_key": "welcome-ada"}

# Component schema name -> examples (JSON Schema `examples`; the first also becomes the media type's).
SCHEMAS: dict[str, list[Any]] = {
    "EnqueueRequest": [
        _ENQUEUE,
        {"payload": {"report": "daily"}, "run_at": "2026-11-30T06:00:00+00:00", "max_attempts": 3},
        {"payload": [1, 2, 3], "delay_seconds": 60},
    ],
    "EnqueueBatchRequest": [{"jobs": [{"payload": {"n": 1}}, {"payload": {"n": 2}, "priority": 10}]}],
    "ClaimRequest": [{"worker": "mailer-1", "limit": 10, "lease_seconds": 300, "wait_seconds": 20}],
    "HeartbeatRequest": [{"claim_token": _TOKEN}, {"claim_token": _TOKEN, "lease_seconds": 600}],
    "CompleteRequest": [{"claim_token": _TOKEN, "result": {"message_id": "abc"}}],
    "FailRequest": [
        {"claim_token": _TOKEN, "error": "SMTP 451: try again later", "retry_in_seconds": 30},
        {"claim_token": _TOKEN, "error": "no such recipient", "retry": False},
    ],
    "CompleteBatchRequest": [
        {"jobs": [{"id": 42, "claim_token": _TOKEN, "result": "sent"}, {"id": 43, "claim_token": _TOKEN}]}
    ],
    "Job": [_JOB, _DONE],
    "JobList": [{"jobs": [_JOB, {**_JOB, "id": 43, "priority": 0, "idempotency_key": None}]}],
    "Claim": [_CLAIM],
    "ClaimResponse": [{"jobs": [_CLAIM]}, {"jobs": []}],
    "HeartbeatResponse": [{"id": 42, "lease_expires_at": _LATER}],
    "CompleteOutcome": [{"id": 42, "outcome": "completed", "status": "completed"}],
    "CompleteBatchResponse": [
        {
            "results": [
                {"id": 42, "outcome": "completed", "status": "completed"},
                {"id": 43, "outcome": "claim_lost", "status": "pending"},
                {"id": 44, "outcome": "not_found", "status": None},
            ]
        }
    ],
    "Health": [{"status": "ok"}],
    "Readiness": [{"status": "ready"}],
}


# Status -> named problems an operation documenting that status may answer (rendered with its path).
PROBLEMS: dict[int, dict[str, AppError]] = {
    400: {"malformed-request": BadRequest("The request body is not valid JSON: EOF while parsing a value")},
    404: {"job-not-found": JobNotFound()},
    409: {"claim-lost": ClaimLost(), "invalid-state": InvalidState("The job was cancelled while this claim held it.")},
    413: {"payload-too-large": PayloadTooLarge("The request body is larger than 16777216 bytes.")},
    415: {"unsupported-media-type": UnsupportedMediaType()},
    422: {
        "missing-body": ValidationFailed(
            "body: Field required", errors=[{"loc": ["body"], "msg": "Field required", "type": "missing"}]
        ),
        "bad-job-id": ValidationFailed(
            "path.job_id: Input should be greater than or equal to 1",
            errors=[
                {
                    "loc": ["path", "job_id"],
                    "msg": "Input should be greater than or equal to 1",
                    "type": "greater_than_equal",
                }
            ],
        ),
    },
    429: {"too-many-waiters": TooManyWaiters()},
    503: {"database-unavailable": DatabaseUnavailable(), "not-ready": NotReady()},
}

# Problems that only some operations give: by operationId or HTTP method.
ONLY_ON: dict[str, set[str]] = {"not-ready": {"readyz"}, "missing-body": {"post"}, "bad-job-id": {"getJob"}}
