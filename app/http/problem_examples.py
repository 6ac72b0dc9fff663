"""Example problems for the published OpenAPI contract: per status, the named problems an operation may
answer, and which operations alone give some of them."""

from __future__ import annotations

from app.auth.exposure import TURN_KEYS_ON
from app.errors import (
    AppError,
    BadRequest,
    ClaimLost,
    DatabaseUnavailable,
    Forbidden,
    InvalidState,
    JobCancelled,
    JobNotFound,
    JobTimedOut,
    NotReady,
    PayloadTooLarge,
    ProxyWithoutKeys,
    ScheduleNotFound,
    SearchTooBroad,
    TooManyConnections,
    TooManyWaiters,
    Unauthorized,
    UnsupportedMediaType,
    ValidationFailed,
    WorkerNotFound,
)

# Status -> named problems an operation documenting that status may answer (rendered with its path).
PROBLEMS: dict[int, dict[str, AppError]] = {
    400: {"malformed-request": BadRequest("The request body is not valid JSON: EOF while parsing a value")},
    401: {"unauthorized": Unauthorized("Send an API key: `Authorization: Bearer <key>`.")},
    403: {
        "forbidden": Forbidden("This API key lacks the `consume` scope."),
        "proxy-without-keys": ProxyWithoutKeys(
            "This jobq runs without API keys, which is safe only while nothing but this machine can reach it, and "
            "this request came through a proxy (it carries `x-forwarded-for`). " + TURN_KEYS_ON
        ),
    },
    404: {
        "job-not-found": JobNotFound(),
        "schedule-not-found": ScheduleNotFound(),
        "worker-not-found": WorkerNotFound("No worker named 'mailer-9-1' was seen (in a queue this key may use)."),
    },
    409: {
        "claim-lost": ClaimLost(),
        "job-cancelled": JobCancelled(),
        "job-timed-out": JobTimedOut(),
        "invalid-state": InvalidState("The job is completed; only pending, waiting and running jobs can be cancelled."),
    },
    413: {"payload-too-large": PayloadTooLarge("The request body is larger than 16777216 bytes.")},
    415: {
        "unsupported-media-type": UnsupportedMediaType("Send the body as JSON with `Content-Type: application/json`.")
    },
    422: {
        "missing-body": ValidationFailed(
            "body: Field required", errors=[{"loc": ["body"], "msg": "Field required", "type": "missing"}]
        ),
        "bad-queue-name": ValidationFailed(
            "path.queue: String should match pattern '^[A-Za-z0-9_.:-]{1,128}$'",
            errors=[
                {
                    "loc": ["path", "queue"],
                    "msg": "String should match pattern '^[A-Za-z0-9_.:-]{1,128}$'",
                    "type": "string_pattern_mismatch",
                }
            ],
        ),
        "unknown-dependency": ValidationFailed(
            "body.depends_on.1: no job 41 (in a queue this key may use)",
            errors=[
                {
                    "loc": ["body", "depends_on", 1],
                    "msg": "no job 41 (in a queue this key may use)",
                    "type": "unknown_job",
                }
            ],
        ),
        "bad-cron": ValidationFailed(
            "body.cron: Value error, minute: 61 is out of range 0-59",
            errors=[
                {"loc": ["body", "cron"], "msg": "Value error, minute: 61 is out of range 0-59", "type": "value_error"}
            ],
        ),
        "bad-schedule-name": ValidationFailed(
            "path.name: String should match pattern '^[A-Za-z0-9_.:-]{1,128}$'",
            errors=[
                {
                    "loc": ["path", "name"],
                    "msg": "String should match pattern '^[A-Za-z0-9_.:-]{1,128}$'",
                    "type": "string_pattern_mismatch",
                }
            ],
        ),
        "bad-wait": ValidationFailed(
            "query.wait_seconds: Input should be less than or equal to 30",
            errors=[
                {
                    "loc": ["query", "wait_seconds"],
                    "msg": "Input should be less than or equal to 30",
                    "type": "less_than_equal",
                }
            ],
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
        "bad-range": ValidationFailed(
            "query.range: Input should be 'hour', 'day' or 'week'",
            errors=[
                {"loc": ["query", "range"], "msg": "Input should be 'hour', 'day' or 'week'", "type": "literal_error"}
            ],
        ),
        "bad-limit": ValidationFailed(
            "query.limit: Input should be greater than or equal to 1",
            errors=[
                {
                    "loc": ["query", "limit"],
                    "msg": "Input should be greater than or equal to 1",
                    "type": "greater_than_equal",
                }
            ],
        ),
        "bad-worker-name": ValidationFailed(
            "path.name: String should match pattern '^[^\\x00-\\x1f\\x7f]+$'",
            errors=[
                {
                    "loc": ["path", "name"],
                    "msg": "String should match pattern '^[^\\x00-\\x1f\\x7f]+$'",
                    "type": "string_pattern_mismatch",
                }
            ],
        ),
        "search-too-broad": SearchTooBroad(
            "The search did not finish within 5000 ms: narrow it (a queue and a status, or a more specific filter)."
        ),
    },
    429: {"too-many-waiters": TooManyWaiters()},
    503: {
        "database-unavailable": DatabaseUnavailable(),
        "too-many-connections": TooManyConnections(),
        "not-ready": NotReady(),
    },
}

_WORKER_WRITES = {"heartbeatJob", "completeJob", "failJob", "releaseJob"}
_JOB_ROUTES = {"getJob", "cancelJob", "retryJob", "explainJob", *_WORKER_WRITES}
_SCHEDULE_ROUTES = {"putSchedule", "getSchedule", "deleteSchedule", "pauseSchedule", "resumeSchedule"}

# Problems that only some operations give: by operationId or HTTP method.
ONLY_ON: dict[str, set[str]] = {
    "not-ready": {"readyz"},
    "search-too-broad": {"searchJobs", "bulkJobs"},
    "bad-range": {"getSeries", "getQueueSeries", "getSparklines"},
    "missing-body": {
        "enqueueJob",
        "enqueueJobs",
        "claimJobs",
        "completeJobs",
        "putSchedule",
        "searchJobs",
        "bulkJobs",
        "setQueueConfig",
        *_WORKER_WRITES,
    },
    "bad-job-id": _JOB_ROUTES,
    "bad-queue-name": {
        "enqueueJob",
        "enqueueJobs",
        "claimJobs",
        "getQueueStats",
        "getQueueSeries",
        "listJobs",
        "redriveQueue",
        "pauseQueue",
        "resumeQueue",
        "getQueueConfig",
        "setQueueConfig",
        "getQueueScale",
    },
    "job-not-found": _JOB_ROUTES,
    "schedule-not-found": _SCHEDULE_ROUTES - {"putSchedule"},
    "bad-schedule-name": _SCHEDULE_ROUTES,
    "bad-cron": {"putSchedule"},
    "unknown-dependency": {"enqueueJob", "enqueueJobs"},
    "bad-wait": {"getJob"},
    "claim-lost": _WORKER_WRITES,
    "job-cancelled": {"completeJob", "failJob", "releaseJob"},
    "job-timed-out": _WORKER_WRITES,
    "worker-not-found": {"getWorker"},
    "bad-limit": {"listWorkers", "getQueueScale"},
    "bad-worker-name": {"getWorker"},
    "invalid-state": {"cancelJob", "retryJob"},
}
