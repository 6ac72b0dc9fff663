"""Operator routes: queue statistics, listings, admin actions, Prometheus metrics. All need an admin key
(app/auth/policy.py), except /metrics, which a `metrics` key reaches too: a key limited to some queues sees and
acts on those only, and cannot read /metrics, which covers every queue."""

from typing import Annotated

from fastapi import FastAPI, Query, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from app.auth.policy import principal, requires
from app.core.operations import OpsService
from app.core.scale import DEFAULT_CAP
from app.db.rows import Status
from app.errors import Forbidden, ValidationFailed
from app.http.documents import config_document, job_document, scale_document
from app.http.examples import METRICS_EXAMPLE
from app.http.jobs import JobIdPath, QueueName, _problems
from app.http.responses import json_response
from app.http.served import SERVED_BY_RESPONSES, recording_served, served_by
from app.models.answers import Job
from app.models.explain import JobExplanation
from app.models.flow import QueueConfig, QueueConfigPatch
from app.models.operations import (
    QUEUES_PAGE_DEFAULT,
    QUEUES_PAGE_MAX,
    CancelRequest,
    JobPage,
    QueueList,
    QueueScale,
    QueueState,
    QueueStats,
    RedriveRequest,
    RedriveResult,
)
from app.services import services

_ADMIN_WRITE = (400, 401, 403, 413, 415, 422, 503)
_CANCEL_409 = "`invalid-state`: the job is finished (completed, failed or cancelled) and cannot be cancelled."
_RETRY_409 = "`invalid-state`: only failed, cancelled or completed jobs can be retried."


def ops(request: Request) -> OpsService:
    return services(request).ops


async def _not_null(request: Request, body: BaseModel | None) -> None:
    """An optional body may be left out, but one that is sent must be an object, as the schema says;
    FastAPI would take a JSON `null` for a missing body."""
    if body is None and (await request.body()).strip():
        msg = "Input should be an object"
        raise ValidationFailed(f"body: {msg}", errors=[{"loc": ["body"], "msg": msg, "type": "model_type"}])


def add_operator_routes(api: FastAPI) -> None:
    @api.get(
        "/queues",
        operation_id="listQueues",
        summary="The queues with their counts, a page at a time",
        tags=["operators"],
        response_model=QueueList,
        description="Every queue with a job not finished, a count of finished jobs or a configuration, by name, "
        f"a page at a time (`limit`, by default {QUEUES_PAGE_DEFAULT}; follow `next_cursor`). With a key limited "
        "to some queues, only those.",
        responses={**_problems(401, 403, 422, 503), **SERVED_BY_RESPONSES},
    )
    @requires("admin")
    async def list_queues(
        request: Request,
        limit: Annotated[
            int, Query(ge=1, le=QUEUES_PAGE_MAX, description=f"Page size (default {QUEUES_PAGE_DEFAULT}).")
        ] = QUEUES_PAGE_DEFAULT,
        cursor: Annotated[str | None, Query(max_length=1000, description="next_cursor of the previous page.")] = None,
    ) -> Response:
        with recording_served() as served:
            queues, next_cursor = await ops(request).queues(principal(request).queue_regex, limit, cursor)
        return served_by(json_response({"queues": queues, "next_cursor": next_cursor}), served)

    @api.get(
        "/queues/{queue}/stats",
        operation_id="getQueueStats",
        summary="Health of one queue",
        tags=["operators"],
        response_model=QueueStats,
        responses={**_problems(401, 403, 422, 503), **SERVED_BY_RESPONSES},
    )
    @requires("admin")
    async def queue_stats(
        queue: QueueName,
        request: Request,
        window_seconds: Annotated[
            int | None, Query(ge=60, le=3600, description="Window of the windowed figures (default 300).")
        ] = None,
    ) -> Response:
        with recording_served() as served:
            stats = await ops(request).stats(queue, window_seconds)
        return served_by(json_response({**stats, "config": config_document(queue, stats["config"])}), served)

    @api.get(
        "/queues/{queue}/jobs",
        operation_id="listJobs",
        summary="Jobs of a queue, a page at a time",
        description="Pending jobs are listed in claim order, waiting ones oldest first, running ones by lease "
        "expiry, finished ones newest first, all statuses together by id (newest first). Pages follow a cursor, "
        "so they do not shift when jobs are added.",
        tags=["operators"],
        response_model=JobPage,
        responses={**_problems(401, 403, 422, 503), **SERVED_BY_RESPONSES},
    )
    @requires("admin")
    async def list_jobs(
        queue: QueueName,
        request: Request,
        status: Annotated[Status | None, Query(description="Only jobs in this status.")] = None,
        limit: Annotated[int, Query(ge=1, le=500, description="Page size.")] = 50,
        cursor: Annotated[str | None, Query(max_length=1000, description="next_cursor of the previous page.")] = None,
    ) -> Response:
        with recording_served() as served:
            page = await ops(request).list_jobs(queue, status.value if status else None, limit, cursor)
        doc = {"jobs": [job_document(j) for j in page.jobs], "next_cursor": page.next_cursor}
        return served_by(json_response(doc), served)

    @api.get(
        "/queues/{queue}/scale",
        operation_id="getQueueScale",
        summary="How many workers the queue could use now (for autoscalers)",
        description="`claimable`: how many more jobs claims could take right now under the queue's limits "
        "(ready jobs that concurrency, rate and group limits let through; 0 while paused), with the jobs in "
        "flight and the age of the oldest ready job. One statement whose cost does not grow with the backlog "
        "(ready jobs are counted up to `max`). For KEDA's metrics-api scaler; the same figures are the gauges "
        "jobq_queue_claimable_jobs and jobq_queue_running_jobs on /metrics. An admin key, or a `metrics` key (a "
        "scraper's credential); a key limited to some queues reaches those only. See docs/autoscaling.md.",
        tags=["operators"],
        response_model=QueueScale,
        responses={**_problems(401, 403, 422, 503), **SERVED_BY_RESPONSES},
    )
    @requires("metrics")
    async def queue_scale(
        queue: QueueName,
        request: Request,
        max: Annotated[
            int, Query(ge=1, le=10_000, description="Count ready jobs up to this many (default 1000).")
        ] = DEFAULT_CAP,
    ) -> Response:
        with recording_served() as served:
            found = await services(request).scale.scale(queue, max)
        return served_by(json_response(scale_document(found)), served)

    @api.post(
        "/jobs/{job_id:int}/cancel",
        operation_id="cancelJob",
        summary="Cancel a pending or running job",
        description="A pending job is cancelled at once. A running job is cancelled too; its worker learns "
        "it from its next heartbeat (`cancel_requested`) and its complete or fail is refused with "
        "`job-cancelled`. A finished job cannot be cancelled (409 invalid-state).",
        tags=["operators"],
        response_model=Job,
        responses=_problems(*_ADMIN_WRITE, 404, 409, conflict=_CANCEL_409),
    )
    @requires("admin")
    async def cancel_job(job_id: JobIdPath, request: Request, body: CancelRequest | None = None) -> Response:
        await _not_null(request, body)
        reason = body.reason if body else None
        return json_response(job_document(await ops(request).cancel(job_id, reason, principal(request).queue_regex)))

    @api.get(
        "/jobs/{job_id:int}/explain",
        operation_id="explainJob",
        summary="Why a job is not running",
        description="Every rule of the claim that holds the job right now, as data: its queue paused, due later "
        "(`scheduled`) or after a failed attempt (`backoff`), the queue's `concurrency` or `rate` full, its "
        "group's `group_concurrency` or `group_rate` full, not its turn in an `ordered` group, waiting for "
        "`dependencies`; or that it is running or finished. Read with the claim's own SQL fragments, so it "
        "says what the claim does. `runnable: true` (no reasons): the next claim may take it, in claim order.",
        tags=["operators"],
        response_model=JobExplanation,
        responses=_problems(401, 403, 404, 422, 503),
    )
    @requires("admin")
    async def explain_job(job_id: JobIdPath, request: Request) -> Response:
        return json_response(await services(request).explain.explain(job_id, principal(request).queue_regex))

    @api.post(
        "/jobs/{job_id:int}/retry",
        operation_id="retryJob",
        summary="Run a failed, cancelled or completed job again",
        description="Back to pending with its attempts reset, due now: the same job (its id, payload, group and "
        "creation time), so its history stays with it; `last_error`, `worker` and `claimed_at` show its last "
        "run until it is claimed again. A completed job runs again with the same payload (a replay); its "
        "result is dropped, and the jobs that depend on it, which already ran, do not run again. 409 "
        "invalid-state for pending, waiting and running jobs.",
        tags=["operators"],
        response_model=Job,
        responses=_problems(401, 403, 404, 409, 422, 503, conflict=_RETRY_409),
    )
    @requires("admin")
    async def retry_job(job_id: JobIdPath, request: Request) -> Response:
        return json_response(job_document(await ops(request).retry(job_id, principal(request).queue_regex)))

    @api.post(
        "/queues/{queue}/redrive",
        operation_id="redriveQueue",
        summary="Send a queue's failed jobs back to pending",
        tags=["operators"],
        response_model=RedriveResult,
        responses=_problems(400, 401, 403, 413, 415, 422, 503),
    )
    @requires("admin")
    async def redrive_queue(queue: QueueName, request: Request, body: RedriveRequest | None = None) -> Response:
        await _not_null(request, body)
        body = body or RedriveRequest()
        result = await ops(request).redrive(queue, body.error_contains, body.dry_run, body.limit)
        return json_response(result)

    @api.post(
        "/queues/{queue}/pause",
        operation_id="pauseQueue",
        summary="Pause a queue: it accepts jobs, claims return empty",
        tags=["operators"],
        response_model=QueueState,
        responses=_problems(401, 403, 422, 503),
    )
    @requires("admin")
    async def pause_queue(queue: QueueName, request: Request) -> Response:
        return json_response(await ops(request).set_paused(queue, True))

    @api.post(
        "/queues/{queue}/resume",
        operation_id="resumeQueue",
        summary="Resume a paused queue",
        tags=["operators"],
        response_model=QueueState,
        responses=_problems(401, 403, 422, 503),
    )
    @requires("admin")
    async def resume_queue(queue: QueueName, request: Request) -> Response:
        return json_response(await ops(request).set_paused(queue, False))

    @api.get(
        "/queues/{queue}/config",
        operation_id="getQueueConfig",
        summary="A queue's configuration: defaults and limits",
        description="Every field is null until set: the global setting applies (for the limits: no limit).",
        tags=["operators"],
        response_model=QueueConfig,
        responses=_problems(401, 403, 422, 503),
    )
    @requires("admin")
    async def get_queue_config(queue: QueueName, request: Request) -> Response:
        return json_response(config_document(queue, await ops(request).config(queue)))

    @api.patch(
        "/queues/{queue}/config",
        operation_id="setQueueConfig",
        summary="Change a queue's configuration (partial update)",
        description="Fields left out keep their value; `null` clears a field back to the global setting. "
        "A change takes effect at once in every process (it commits with a notification that each one "
        "hears), including for claims already waiting. Limits count every replica's claims together; see "
        "docs/flow-control.md for what counts against each. 422 when a value is out of range or the fields "
        "contradict each other (`ordered` with `group_concurrency` above 1, `backoff_base_seconds` above "
        "`backoff_max_seconds`).",
        tags=["operators"],
        response_model=QueueConfig,
        responses=_problems(*_ADMIN_WRITE),
    )
    @requires("admin")
    async def set_queue_config(queue: QueueName, body: QueueConfigPatch, request: Request) -> Response:
        return json_response(config_document(queue, await ops(request).configure(queue, body)))

    @api.get(
        "/metrics",
        operation_id="metrics",
        summary="Prometheus metrics",
        tags=["health"],
        response_class=Response,
        description="Covers every queue: needs a `metrics` key (GET /metrics and nothing else, for a "
        "scraper) or an admin key that is not limited to some queues.",
        responses={
            200: {
                "description": "Prometheus text exposition format.",
                "content": {
                    CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}, "example": METRICS_EXAMPLE}
                },
            },
            **_problems(401, 403),
        },
    )
    @requires("metrics")
    async def metrics(request: Request) -> Response:
        if principal(request).queue_regex is not None:
            raise Forbidden("/metrics covers every queue: use a metrics key, or an admin key not limited to some.")
        registry = services(request).metrics.exposition_registry()
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
