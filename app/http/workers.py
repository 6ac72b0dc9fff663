"""Operator routes of the worker registry: who is working, on which queues, holding what (admin). A key
limited to some queues sees only workers that claimed from those, and of each only what it did there."""

from typing import Annotated

from fastapi import FastAPI, Path, Query, Request
from fastapi.responses import Response

from app.auth.policy import principal, requires
from app.http.documents import held_job_document, worker_document
from app.http.jobs import _problems
from app.http.responses import json_response
from app.http.served import SERVED_BY_RESPONSES, recording_served, served_by
from app.models.answers import Problem
from app.models.fields import LABEL_PATTERN
from app.models.workers import WorkerDetail, WorkerList
from app.services import services

WorkerName = Annotated[
    str, Path(min_length=1, max_length=255, pattern=LABEL_PATTERN, description="The `worker` its claims named.")
]


def add_worker_routes(api: FastAPI) -> None:
    @api.get(
        "/workers",
        operation_id="listWorkers",
        summary="Workers: live ones, and those gone recently",
        description="Every worker seen within JOBQ_WORKERS_KEEP_SECONDS: live ones first (holding a lease that "
        "has not lapsed, or seen within JOBQ_WORKER_GONE_SECONDS), then gone ones, each with the queues it "
        "claimed from, its SDK, version and host, when it was first and last seen, the jobs it holds now and "
        "what it completed and failed in the last hour. A worker is recorded by each process about once a "
        "second, so `last_seen` lags by that much. With a key limited to some queues, only those queues count.",
        tags=["operators"],
        response_model=WorkerList,
        responses={**_problems(401, 403, 422, 503), **SERVED_BY_RESPONSES},
    )
    @requires("admin")
    async def list_workers(
        request: Request,
        limit: Annotated[int, Query(ge=1, le=1000, description="Most workers listed.")] = 200,
    ) -> Response:
        with recording_served() as served:
            rows = await services(request).workers.list(principal(request).queue_regex, limit)
        return served_by(json_response({"workers": [worker_document(r) for r in rows]}), served)

    @api.get(
        "/workers/{name}",
        operation_id="getWorker",
        summary="A worker, with the jobs it holds now",
        tags=["operators"],
        response_model=WorkerDetail,
        responses={
            **_problems(401, 403, 422, 503),
            **SERVED_BY_RESPONSES,
            404: {
                "model": Problem,
                "description": "`worker-not-found`: no worker of this name was seen within "
                "JOBQ_WORKERS_KEEP_SECONDS (in a queue this key may use).",
            },
        },
    )
    @requires("admin")
    async def get_worker(name: WorkerName, request: Request) -> Response:
        with recording_served() as served:
            found = await services(request).workers.get(name, principal(request).queue_regex)
        doc = {**worker_document(found.worker), "jobs": [held_job_document(j) for j in found.jobs]}
        return served_by(json_response(doc), served)
