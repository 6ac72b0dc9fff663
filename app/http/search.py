"""Operator routes of job search and bulk actions (admin). A key limited to some queues finds and acts on
the jobs of those only; naming another queue in a filter is refused (403)."""

from fastapi import FastAPI, Request
from fastapi.responses import Response

from app.auth.policy import authorize, client_identity, principal, requires
from app.core.search import SearchService
from app.http.documents import job_document
from app.http.jobs import _problems
from app.http.responses import json_response
from app.http.served import SERVED_BY_RESPONSES, recording_served, served_by
from app.models.search import BULK_MAX_JOBS, BulkRequest, BulkResult, SearchRequest, SearchResult
from app.services import services

_WRITE = (400, 401, 403, 413, 415, 422, 429, 503)

SEARCH_DESCRIPTION = (
    "Find jobs by `id`, by `idempotency_key`, by text in `last_error` (`error_contains`), by JSON containment "
    "on the payload (`payload_contains`), narrowed by `queue` and `status`; the conditions given all hold. "
    "A page is bounded: it examines at most JOBQ_SEARCH_SCAN_ROWS jobs (`examined`), in one index's order, "
    "and stops there (`partial: true`) with a `next_cursor` to go on, so a rare match in a big table takes "
    "more pages rather than one long query; it runs within JOBQ_SEARCH_TIMEOUT_MS (422 `search-too-broad` "
    "past it). Order: with a `queue` and one `status`, the listing's (GET /queues/{queue}/jobs); otherwise "
    "newest first. Payload filters are indexed for failed and cancelled jobs; on other statuses they are "
    "checked on each job examined. One key runs at most JOBQ_MAX_SEARCHES_PER_KEY searches at once (and bulk "
    "actions by filter) per server, all keys JOBQ_MAX_SEARCHES: past either, 429 `too-many-searches`."
)
BULK_DESCRIPTION = (
    "Cancel or retry many jobs in one request: the jobs named in `ids`, or up to `limit` of those a search "
    "with `filter` finds among the statuses the action applies to. Each job is guarded by its status exactly "
    "as POST /jobs/{id}/cancel and /retry are, in one statement: a job that finished meanwhile is `skipped`, "
    "never forced. `dry_run` answers what would be done and changes nothing. At most "
    f"{BULK_MAX_JOBS} jobs a call; with `filter`, follow `next_cursor` for more."
)


def searcher(request: Request) -> SearchService:
    return services(request).search


def add_search_routes(api: FastAPI) -> None:
    @api.post(
        "/jobs/search",
        operation_id="searchJobs",
        summary="Search jobs",
        description=SEARCH_DESCRIPTION,
        tags=["operators"],
        response_model=SearchResult,
        responses={**_problems(*_WRITE), **SERVED_BY_RESPONSES},
    )
    @requires("admin")
    async def search_jobs(body: SearchRequest, request: Request) -> Response:
        who = principal(request)
        if body.queue is not None:
            authorize(who, "admin", body.queue)
        svc = searcher(request)
        statuses = (body.status.value,) if body.status is not None else None
        criteria = svc.criteria(body, statuses, ["body"])
        with recording_served() as served:
            found = await svc.search(
                criteria, who.queue_regex, body.limit, body.cursor, client=client_identity(request), replica=True
            )
        doc = {
            "jobs": [job_document(j) for j in found.jobs],
            "next_cursor": found.next_cursor,
            "examined": found.examined,
            "partial": found.partial,
        }
        return served_by(json_response(doc), served)

    @api.post(
        "/jobs/bulk",
        operation_id="bulkJobs",
        summary="Cancel or retry many jobs",
        description=BULK_DESCRIPTION,
        tags=["operators"],
        response_model=BulkResult,
        responses=_problems(*_WRITE),
    )
    @requires("admin")
    async def bulk_jobs(body: BulkRequest, request: Request) -> Response:
        who = principal(request)
        if body.filter is not None and body.filter.queue is not None:
            authorize(who, "admin", body.filter.queue)
        return json_response(await searcher(request).bulk(body, who.queue_regex, client_identity(request)))
