"""Operator routes of the statistics' history: the series behind the dashboard's charts (per queue and for
every queue) and its sparklines. Admin; a key limited to some queues sees the sum over those only."""

from typing import Annotated

from fastapi import FastAPI, Query, Request
from fastapi.responses import Response
from pydantic import StringConstraints

from app.auth.policy import principal, requires
from app.core.history import SPARKLINES_CACHE_SECONDS, HistoryService
from app.http.jobs import QueueName, _problems
from app.http.responses import json_response
from app.http.served import SERVED_BY_RESPONSES, recording_served, served_by
from app.models.fields import QUEUE_PATTERN
from app.models.history import RANGE_DESCRIPTION, HistoryRange, Series, Sparklines
from app.services import services

Range = Annotated[HistoryRange, Query(description=RANGE_DESCRIPTION)]
SparklineQueue = Annotated[str, StringConstraints(pattern=QUEUE_PATTERN)]
SPARKLINE_QUEUES = 100  # queues one request may name: a dashboard page's


def history(request: Request) -> HistoryService:
    return services(request).history


def add_history_routes(api: FastAPI) -> None:
    @api.get(
        "/stats/series",
        operation_id="getSeries",
        summary="Throughput, durations and backlog over time, all queues together",
        description="The sum over every queue this key may see, a point per bucket: jobs enqueued, completed and "
        "failed, claim-to-completion p50 and p95, and the ready backlog sampled once a minute. Minutes are kept "
        "a day and hours a week (docs/operations.md, History).",
        tags=["operators"],
        response_model=Series,
        responses={**_problems(401, 403, 422, 503), **SERVED_BY_RESPONSES},
    )
    @requires("admin")
    async def get_series(request: Request, range: Range = "hour") -> Response:
        with recording_served() as served:
            doc = await history(request).series(range, None, principal(request).queue_regex)
        return served_by(json_response(doc), served)

    @api.get(
        "/queues/{queue}/stats/series",
        operation_id="getQueueSeries",
        summary="Throughput, durations and backlog of one queue over time",
        tags=["operators"],
        response_model=Series,
        responses={**_problems(401, 403, 422, 503), **SERVED_BY_RESPONSES},
    )
    @requires("admin")
    async def get_queue_series(queue: QueueName, request: Request, range: Range = "hour") -> Response:
        with recording_served() as served:
            doc = await history(request).series(range, queue, None)
        return served_by(json_response(doc), served)

    @api.get(
        "/stats/sparklines",
        operation_id="getSparklines",
        summary="Per queue: enqueued, completed, failed and backlog per bucket",
        description="For an overview of many queues: each queue with statistics in the range, its figures as "
        f"plain lists (a number per bucket). Only the queues named by `queue` (at most {SPARKLINE_QUEUES}), or "
        f"else a page of `limit` queues by name (follow `next_cursor`). Answers are kept "
        f"{SPARKLINES_CACHE_SECONDS:g} s by each server (the buckets are minutes).",
        tags=["operators"],
        response_model=Sparklines,
        responses={**_problems(401, 403, 422, 503), **SERVED_BY_RESPONSES},
    )
    @requires("admin")
    async def get_sparklines(
        request: Request,
        range: Range = "hour",
        queue: Annotated[
            list[SparklineQueue] | None,
            Query(max_length=SPARKLINE_QUEUES, description="Only these queues (repeat the parameter)."),
        ] = None,
        limit: Annotated[int, Query(ge=1, le=1000, description="Page size (default 1000).")] = 1000,
        cursor: Annotated[str | None, Query(max_length=1000, description="next_cursor of the previous page.")] = None,
    ) -> Response:
        with recording_served() as served:
            doc = await history(request).sparklines(range, principal(request).queue_regex, queue, cursor, limit)
        response = served_by(json_response(doc), served)
        response.raw_headers.append((b"cache-control", b"private, max-age=%d" % SPARKLINES_CACHE_SECONDS))
        return response
