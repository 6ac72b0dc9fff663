"""Operator routes of the statistics' history: the series behind the dashboard's charts (per queue and for
every queue) and its sparklines. Admin; a key limited to some queues sees the sum over those only."""

from typing import Annotated

from fastapi import FastAPI, Query, Request
from fastapi.responses import Response

from app.auth.policy import principal, requires
from app.core.history import HistoryService
from app.http.jobs import QueueName, _problems
from app.http.responses import json_response
from app.http.served import SERVED_BY_RESPONSES, recording_served, served_by
from app.models.history import RANGE_DESCRIPTION, HistoryRange, Series, Sparklines
from app.services import services

Range = Annotated[HistoryRange, Query(description=RANGE_DESCRIPTION)]


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
        "plain lists (a number per bucket).",
        tags=["operators"],
        response_model=Sparklines,
        responses={**_problems(401, 403, 422, 503), **SERVED_BY_RESPONSES},
    )
    @requires("admin")
    async def get_sparklines(request: Request, range: Range = "hour") -> Response:
        with recording_served() as served:
            doc = await history(request).sparklines(range, principal(request).queue_regex)
        return served_by(json_response(doc), served)
