"""HTTP routes: validate -> service -> response. One definition per endpoint; app/http/fastpath.py serves
the hot ones by calling these same functions.

No `from __future__ import annotations` here: the request models are built per settings inside
build_router(), and FastAPI must see the real classes in the signatures."""

import json
import logging
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, TypeVar

import pydantic_core
from fastapi import FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.routing import APIRoute
from orjson import Fragment
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match, Route

from app.auth.policy import client_identity, principal, requires
from app.core.jobs import JobService
from app.core.workers import Agent, agent_of
from app.errors import (
    AppError,
    BadRequest,
    InternalError,
    MethodNotAllowed,
    NotFound,
    validation_problem,
)
from app.http.documents import (
    claim_document,
    enqueued_document,
    job_document,
    jobs_text,
    outcome_document,
    renewal_document,
    state_document,
)
from app.http.fastpath import hot
from app.http.prefer import APPLIED, prefers_minimal
from app.http.responses import json_response
from app.models.answers import (
    ClaimResponse,
    CompleteBatchResponse,
    EnqueuedJobs,
    HeartbeatResponse,
    Job,
    Problem,
)
from app.models.fields import INT64_MAX, QUEUE_PATTERN
from app.models.jobs import (
    ClaimRequest,
    CompleteBatchRequest,
    CompleteRequest,
    Contract,
    EnqueueBatchRequest,
    EnqueueRequest,
    FailRequest,
    HeartbeatRequest,
    ReleaseRequest,
)
from app.problems import problem_response
from app.services import services

log = logging.getLogger("jobq.api")

QueueName = Annotated[str, Path(pattern=QUEUE_PATTERN, description="`[A-Za-z0-9_.:-]{1,128}`")]
JobIdPath = Annotated[int, Path(ge=1, le=INT64_MAX, description="Job id.", json_schema_extra={"format": "int64"})]

_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before trying again.", "schema": {"type": "integer"}}}
# On a 429 `rate-limited` (draft-ietf-httpapi-ratelimit-headers): the key's bucket, and that it is empty.
RATE_LIMIT_HEADERS = {
    "RateLimit-Policy": {
        "description": 'On `rate-limited`: the key\'s policy, `"key";q=<burst>;w=<seconds to refill it>`.',
        "schema": {"type": "string"},
    },
    "RateLimit": {
        "description": 'On `rate-limited`: `"key";r=0;t=<seconds until a request is allowed>`.',
        "schema": {"type": "string"},
    },
}
TOO_MANY_REQUESTS = (
    "Retry after Retry-After. Any operation: `rate-limited`, the API key's request rate (with the RateLimit "
    "fields); `too-many-requests-in-flight`, this client's share of the server's connections. Some: "
    "`too-many-waiters` (long-polls), `queue-full` (enqueue past the queue's `max_pending`), "
    "`too-many-searches` (searches at once)."
)


def _problems(*codes: int, conflict: str | None = None) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the problem responses an operation can give (examples: app/http/problem_examples.py);
    `conflict` says what a 409 means for this operation."""
    text = {
        400: "Body is not valid JSON.",
        401: "No API key, or one that is unknown, revoked or malformed (see WWW-Authenticate).",
        403: "The API key lacks the scope, or may not use this queue.",
        404: "No such job (or none that this key may see).",
        409: "`claim-lost`: the token no longer holds the job (lease lapsed, job reclaimed or finished); "
        "`job-cancelled`: an operator cancelled the job under this claim. Either way the worker stops and "
        "does not complete it. `invalid-state` (admin actions): the job's status does not allow the action.",
        413: "Body larger than the server accepts.",
        415: "Body is not application/json.",
        422: "Request breaks the contract (see `errors`).",
        429: TOO_MANY_REQUESTS,
        503: "Unavailable (database unreachable, shutting down, or schema behind): retry after Retry-After.",
    }
    entries: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        entries[code] = {"model": Problem, "description": conflict if code == 409 and conflict else text[code]}
        if code in (429, 503):
            entries[code]["headers"] = {k: dict(v) for k, v in _RETRY_AFTER.items()}
        if code == 429:
            entries[code]["headers"].update({k: dict(v) for k, v in RATE_LIMIT_HEADERS.items()})
    return entries


_WRITE = (400, 401, 403, 413, 415, 422, 503)
# What an enqueue did: made the job, or found it already made (an idempotency key or a unique key named it).
# A debounced enqueue may also have replaced the pending job of its key.
CREATED, EXISTING, REPLACED = "created", "existing", "replaced"
_ENQUEUED = {True: (b"jobq-enqueued", CREATED.encode()), False: (b"jobq-enqueued", EXISTING.encode())}
_REPLACED = (b"jobq-enqueued", REPLACED.encode())
_ENQUEUED_HEADER = {
    "Jobq-Enqueued": {
        "description": "`created`: this call made the job; `existing`: its idempotency key or unique key "
        "already named this job, and nothing was made (the job is kept as it was); `replaced`: a debounced "
        "enqueue replaced the pending job of its key (payload, priority, run time).",
        "schema": {"type": "string", "enum": [CREATED, EXISTING, REPLACED]},
    }
}
_ENQUEUE_409 = (
    "`too-many-queues`: the queue is new and the service holds JOBQ_MAX_QUEUES live queues; nothing was written."
)

# What a 409 means to a worker, per call. Either way the job is no longer this claim's: stop working on it
# and send nothing more for it.
_CLAIM_LOST = (
    "`claim-lost`: this token no longer holds the job. Its lease lapsed (the sweeper put the job back to "
    "pending, or failed it on its last attempt), another worker has claimed it since, an operator retried "
    "it, or this claim already ended{ended}."
)
_CANCELLED = " `job-cancelled`: an operator cancelled the job while this claim held it; it stays cancelled."
_HEARTBEAT_409 = _CLAIM_LOST.format(ended=" (the job was completed, failed or released with this token)")
_COMPLETE_409 = (
    _CLAIM_LOST.format(ended=" otherwise than by completing it (failed or released with this token)") + _CANCELLED
)
_FAIL_409 = (
    _CLAIM_LOST.format(ended=" otherwise than by failing it (completed or released with this token)") + _CANCELLED
)
_RELEASE_409 = _CLAIM_LOST.format(ended=" (a repeated release ends here: treat it as done)") + _CANCELLED


def _prefer_minimal(schema: str, *codes: int) -> dict[str, Any]:
    """OpenAPI for an operation that honours `Prefer: return=minimal` (app/http/prefer.py): the Prefer
    parameter, and on each success answer the Preference-Applied field and, as `x-jobq-minimal`, the
    minimal answer's schema (the `content` stays the full answer, the default)."""
    minimal = {"$ref": f"#/components/schemas/{schema}"}
    parameter = {
        "name": "Prefer",
        "in": "header",
        "required": False,
        "schema": {"type": "string"},
        "example": "return=minimal",
        "description": f"`return=minimal` (RFC 7240): answer ids and states only (`{schema}`), with "
        "`Preference-Applied: return=minimal`; status codes are the same. `return=representation`, or no "
        "Prefer: the full answer. Other preferences and values are ignored.",
    }
    applied = {
        "Preference-Applied": {
            "description": f"`return=minimal` when the answer is the minimal one (`{schema}`); absent otherwise.",
            "schema": {"type": "string"},
        }
    }
    return {
        "parameters": [parameter],
        "responses": {str(code): {"headers": applied, "x-jobq-minimal": minimal} for code in codes},
    }


class _JsonRequest(Request):
    """Parses JSON bodies with pydantic-core, as the lean dispatcher does, so that both paths accept and
    refuse the same texts (json.loads recurses without a limit and answers a deep body with a crash)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = pydantic_core.from_json(await self.body(), allow_inf_nan=True)
            except ValueError as exc:
                raise json.JSONDecodeError(str(exc), "", 0) from None
        return self._json


class JobqRoute(APIRoute):
    """Every FastAPI route reads its JSON body through _JsonRequest."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            return await handler(_JsonRequest(request.scope, request.receive))

        return handle


def service(request: Request) -> JobService:
    return services(request).jobs


def agent(request: Request) -> Agent:
    """What the request tells of the worker's program, for the worker registry (app/core/workers.py)."""
    client = request.scope.get("client")
    return agent_of(request.headers.get("user-agent"), str(client[0]) if client else None)


async def _disconnected(request: Request) -> None:
    """Completes when the client goes away (http.disconnect) while its long-poll waits."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


F = TypeVar("F", bound=Callable[..., Any])


def configured(**models: type[BaseModel]) -> Callable[[F], F]:
    """Show FastAPI the request models built for this configuration (their bounds are the settings');
    the signatures name the base classes, which is what the handlers rely on."""

    def bind(endpoint: F) -> F:
        endpoint.__annotations__.update(models)
        return endpoint

    return bind


def add_routes(router: FastAPI, c: Contract) -> None:
    """Register the endpoints on the app itself (not an included APIRouter): app/http/fastpath.py looks the
    hot ones up among the app's own routes."""

    @router.post(
        "/queues/{queue}/jobs",
        operation_id="enqueueJob",
        summary="Enqueue a job",
        tags=["producers"],
        status_code=201,
        response_model=Job,
        responses={
            200: {
                "model": Job,
                "description": "The idempotency key, or the unique key, already named this job "
                "(`Jobq-Enqueued: existing`), or a debounced enqueue replaced the pending job of its key "
                "(`Jobq-Enqueued: replaced`).",
                "headers": _ENQUEUED_HEADER,
            },
            201: {"description": "A new job (`Jobq-Enqueued: created`).", "headers": _ENQUEUED_HEADER},
            **_problems(*_WRITE, 409, 429, conflict=_ENQUEUE_409),
        },
        openapi_extra=_prefer_minimal("EnqueuedJob", 201, 200),
    )
    @hot
    @requires("produce")
    @configured(body=c.enqueue)
    async def enqueue_job(queue: QueueName, body: EnqueueRequest, request: Request) -> Response:
        context, allowed = services(request).job_context(request.scope), principal(request).queue_regex
        minimal = prefers_minimal(request)
        inserted = await service(request).enqueue(queue, body, context, allowed, minimal=minimal)
        status = 201 if inserted.created else 200
        if minimal:
            response = json_response(enqueued_document(inserted), status, APPLIED)
        else:
            response = json_response(job_document(inserted.job), status)
        response.raw_headers.append(_REPLACED if inserted.replaced else _ENQUEUED[inserted.created])
        return response

    @router.post(
        "/queues/{queue}/jobs/batch",
        operation_id="enqueueJobs",
        summary="Enqueue several jobs, all or nothing",
        tags=["producers"],
        status_code=201,
        response_model=EnqueuedJobs,
        responses=_problems(*_WRITE, 409, 429, conflict=_ENQUEUE_409),
        openapi_extra=_prefer_minimal("MinimalEnqueuedJobs", 201),
    )
    @hot
    @requires("produce")
    @configured(body=c.enqueue_batch)
    async def enqueue_jobs(queue: QueueName, body: EnqueueBatchRequest, request: Request) -> Response:
        context, allowed = services(request).job_context(request.scope), principal(request).queue_regex
        minimal = prefers_minimal(request)
        inserted = await service(request).enqueue_batch(queue, body.jobs, context, allowed, minimal=minimal)
        if minimal:
            return json_response({"jobs": [enqueued_document(i) for i in inserted]}, 201, APPLIED)
        enqueued = [CREATED if i.created else REPLACED if i.replaced else EXISTING for i in inserted]
        return json_response({"jobs": Fragment(jobs_text([i.job for i in inserted])), "enqueued": enqueued}, 201)

    @router.post(
        "/queues/{queue}/claim",
        operation_id="claimJobs",
        summary="Claim jobs (long-poll with wait_seconds)",
        tags=["workers"],
        response_model=ClaimResponse,
        responses=_problems(*_WRITE, 429),
    )
    @hot
    @requires("consume")
    @configured(body=c.claim)
    async def claim_jobs(queue: QueueName, body: ClaimRequest, request: Request) -> Response:
        waiting = (lambda: _disconnected(request)) if body.wait_seconds > 0 else None
        claimed = await service(request).claim(
            queue,
            body,
            principal(request).queue_regex,
            waiting,
            client=client_identity(request),
            still_authorized=request.scope["state"].get("recheck"),
            agent=agent(request),
        )
        if (tracing := services(request).tracing) is not None:
            tracing.link_jobs(claimed.jobs)
        return json_response(
            {
                "jobs": [claim_document(row) for row in claimed.jobs],
                "completed": [outcome_document(o) for o in claimed.completed],
            }
        )

    @router.post(
        "/jobs/{job_id:int}/heartbeat",
        operation_id="heartbeatJob",
        summary="Extend the lease of a claimed job",
        description="Renews the claim's lease from now, by `lease_seconds` or else by the claim's lease. "
        "Send one every third of the lease while the job runs. Repeating a heartbeat (after a timeout, "
        "say) is harmless: each renews the lease from the moment it arrives. An operator's cancel shows "
        "here, not as an error: 200 with `cancel_requested: true` and `lease_expires_at: null`; stop the "
        "work and send nothing more for the job. 404 `job-not-found`: no such job (or not in a queue this "
        "key may use). " + _HEARTBEAT_409,
        tags=["workers"],
        response_model=HeartbeatResponse,
        responses=_problems(*_WRITE, 404, 409, conflict=_HEARTBEAT_409),
    )
    @hot
    @requires("consume")
    @configured(body=c.heartbeat)
    async def heartbeat_job(job_id: JobIdPath, body: HeartbeatRequest, request: Request) -> Response:
        renewal = await service(request).heartbeat(job_id, body, principal(request).queue_regex, agent(request))
        return json_response(renewal_document(renewal))

    @router.post(
        "/jobs/{job_id:int}/complete",
        operation_id="completeJob",
        summary="Complete a claimed job",
        description="The job becomes `completed` with `result` (default null), and the answer is the job. "
        "Retrying is safe: a complete repeated with the token that completed the job answers 200 with the "
        "job as the first call left it (the first result is kept), so a worker whose answer was lost simply "
        "sends it again. 404 `job-not-found`: no such job (or not in a queue this key may use). " + _COMPLETE_409,
        tags=["workers"],
        response_model=Job,
        responses=_problems(*_WRITE, 404, 409, conflict=_COMPLETE_409),
        openapi_extra=_prefer_minimal("JobState", 200),
    )
    @hot
    @requires("consume")
    async def complete_job(job_id: JobIdPath, body: CompleteRequest, request: Request) -> Response:
        minimal = prefers_minimal(request)
        job = await service(request).complete(job_id, body, principal(request).queue_regex, minimal=minimal)
        if minimal:
            return json_response(state_document(job), 200, APPLIED)
        return json_response(job_document(job))

    @router.post(
        "/jobs/{job_id:int}/fail",
        operation_id="failJob",
        summary="Fail a claimed job (retry later, or fail for good)",
        description="Records a failed attempt with `error` as the job's `last_error`. The job goes back to "
        "`pending`, claimable after `retry_in_seconds` or else after exponential backoff with jitter, while "
        "attempts remain and `retry` is true; otherwise it is `failed` for good. Retrying is safe: a fail "
        "repeated with the same token answers 200 with the job as the first call left it, until the job "
        "moves on (another worker claims the retried job, or an operator retries or cancels it), after "
        "which the token gets 409 `claim-lost` and changes nothing. 404 `job-not-found`: no such job (or "
        "not in a queue this key may use). " + _FAIL_409,
        tags=["workers"],
        response_model=Job,
        responses=_problems(*_WRITE, 404, 409, conflict=_FAIL_409),
        openapi_extra=_prefer_minimal("JobState", 200),
    )
    @hot
    @requires("consume")
    @configured(body=c.fail)
    async def fail_job(job_id: JobIdPath, body: FailRequest, request: Request) -> Response:
        job = await service(request).fail(job_id, body, principal(request).queue_regex)
        if prefers_minimal(request):
            return json_response(state_document(job), 200, APPLIED)
        return json_response(job_document(job))

    @router.post(
        "/jobs/{job_id:int}/release",
        operation_id="releaseJob",
        summary="Hand a claimed job back untried (the attempt is not counted)",
        description="For a worker that must give a job back without having tried it (it is shutting down, or "
        "lacks a resource right now): the job is `pending` again, claimable after `delay_seconds`, and the "
        "claim's attempt is given back (`attempts` goes down by one; `last_error` is unchanged). Use `fail` "
        "when the job was tried. The claim ends here: a repeated release with the same token is 409 "
        "`claim-lost`. A job cancelled under this claim answers 409 `job-cancelled` and stays cancelled.",
        tags=["workers"],
        response_model=Job,
        responses=_problems(*_WRITE, 404, 409, conflict=_RELEASE_409),
    )
    @requires("consume")
    @configured(body=c.release)
    async def release_job(job_id: JobIdPath, body: ReleaseRequest, request: Request) -> Response:
        job = await service(request).release(job_id, body, principal(request).queue_regex)
        return json_response(job_document(job))

    @router.post(
        "/jobs/complete",
        operation_id="completeJobs",
        summary="Complete several claimed jobs, each on its own",
        tags=["workers"],
        response_model=CompleteBatchResponse,
        responses=_problems(*_WRITE),
    )
    @hot
    @requires("consume")
    @configured(body=c.complete_batch)
    async def complete_jobs(body: CompleteBatchRequest, request: Request) -> Response:
        outcomes = await service(request).complete_batch(body, principal(request).queue_regex)
        return json_response({"results": [outcome_document(o) for o in outcomes]})

    @router.get(
        "/jobs/{job_id:int}",
        operation_id="getJob",
        summary="Get a job, or wait for its result",
        tags=["operators"],
        response_model=Job,
        description="Any key with a job scope (produce, consume or admin) may read the jobs of the queues it "
        "may use; other jobs are 404. A key with only the `metrics` scope gets 403. With `wait_seconds`, the "
        "answer comes as soon as the job is finished (`completed`, `failed` or `cancelled`, with its `result` "
        "or `last_error`), or at the deadline with the job as it is then: 200 either way, so look at "
        "`status`. A waiting request holds no database connection; waits count against JOBQ_MAX_WAITERS "
        "and JOBQ_MAX_WAITERS_PER_CLIENT with waiting claims (429 past either).",
        responses=_problems(401, 403, 404, 422, 429, 503),
    )
    @requires(None)
    async def get_job(
        job_id: JobIdPath,
        request: Request,
        wait_seconds: Annotated[
            float,
            Query(
                ge=0,
                le=c.wait_max_seconds,
                allow_inf_nan=False,
                description="Wait up to this long for the job to finish (max JOBQ_WAIT_MAX_SECONDS); 0 answers "
                "at once.",
            ),
        ] = 0,
    ) -> Response:
        waiting = (lambda: _disconnected(request)) if wait_seconds > 0 else None
        job = await service(request).get(
            job_id,
            principal(request).queue_regex,
            wait_seconds,
            waiting,
            client=client_identity(request),
            still_authorized=request.scope["state"].get("recheck"),
        )
        return json_response(job_document(job))


def _allowed_methods(routes: list[BaseRoute], scope: Any) -> list[str]:
    """The methods of the path that the request's path resolves to: of every route with the same path
    template as the first that matches (Starlette names only that first route's own methods)."""
    template = next((r.path for r in routes if isinstance(r, Route) and r.matches(scope)[0] != Match.NONE), None)
    methods: set[str] = set()
    for route in routes:
        if isinstance(route, Route) and route.path == template:
            methods.update(route.methods or ())
    return sorted(methods)


def install_error_handlers(app: FastAPI) -> None:
    async def app_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, AppError)
        return problem_response(exc, request.url.path)

    async def invalid_request(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return problem_response(validation_problem(list(exc.errors())), request.url.path)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        err: AppError
        if isinstance(exc.__cause__, AppError):
            # Raised while FastAPI read the body (RequestGuard's 413), which FastAPI wraps as a 400.
            err = exc.__cause__
        elif exc.status_code == 404:
            err = NotFound()
        elif exc.status_code == 405:
            err = MethodNotAllowed(_allowed_methods(app.routes, request.scope))
        elif exc.status_code == 400:
            err = BadRequest("The request body could not be read as JSON.")
        else:
            err = AppError(str(exc.detail))
            err.status = exc.status_code  # type: ignore[misc]
        return problem_response(err, request.url.path)

    async def crash(request: Request, exc: Exception) -> Response:
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return problem_response(InternalError(), request.url.path)

    app.add_exception_handler(AppError, app_error)
    app.add_exception_handler(RequestValidationError, invalid_request)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, crash)
