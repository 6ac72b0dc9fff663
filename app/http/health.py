"""Health checks: /healthz (the process answers) and /readyz (the database is reachable, the schema current;
with details on the primary's replication and the read replica)."""

from typing import Any

from fastapi import FastAPI, Request

from app import __version__
from app.db import migrate
from app.errors import DatabaseUnavailable, NotReady, ShuttingDown
from app.http.jobs import _problems
from app.http.responses import json_response
from app.models.answers import Health, Readiness
from app.problems import problem_response
from app.services import services

READY_TIMEOUT_SECONDS = 1.0  # /readyz answers within about this, database up or not


def add_health_routes(api: FastAPI) -> None:
    @api.get("/healthz", operation_id="healthz", summary="The process is alive", tags=["health"], response_model=Health)
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    @api.get(
        "/readyz",
        operation_id="readyz",
        summary="Database reachable, schema current",
        tags=["health"],
        response_model=Readiness,
        responses=_problems(503),
    )
    async def readyz(request: Request) -> Any:
        parts = services(request)
        if parts.dispatcher.closing:
            return problem_response(ShuttingDown(), "/readyz")  # a load balancer stops sending work here
        try:
            async with parts.db.connection(timeout=READY_TIMEOUT_SECONDS) as conn:
                missing = await migrate.missing_migrations(conn, parts.db.location)
        except DatabaseUnavailable as exc:
            return problem_response(exc, "/readyz")
        if missing:
            return problem_response(NotReady(migrate.behind(missing)), "/readyz")
        replication = parts.db.replication
        return json_response(
            {
                "status": "ready",
                "replication": replication.summary() if replication else None,
                "read_replica": parts.reads.document(),
            }
        )
