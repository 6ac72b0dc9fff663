"""create_app(): the ASGI application, and the lifespan that starts and stops its background parts."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from app import migrate
from app.api import HOT_OPERATIONS, _problems, add_routes, install_error_handlers
from app.broker import Broker
from app.db import Database
from app.errors import DatabaseUnavailable, NotReady
from app.fastpath import FastPath, RequestGuard
from app.models import Readiness, build_contract
from app.openapi import customise_openapi
from app.responses import json_response, problem_response
from app.service import JobService
from app.settings import Settings
from app.sweeper import Sweeper
from app.wakeup import Wakeups

log = logging.getLogger("jobq")

STARTUP_TIMEOUT_SECONDS = 30.0


class JobqApp:
    """The ASGI stack: RequestGuard -> FastPath -> FastAPI. `.api` is the FastAPI app (state, routes)."""

    def __init__(self, api: FastAPI, settings: Settings) -> None:
        self.api = api
        inner: ASGIApp = FastPath(api, HOT_OPERATIONS) if settings.fast_path else api
        self._stack = RequestGuard(inner, settings.max_request_bytes)

    @property
    def state(self) -> Any:
        return self.api.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._stack(scope, receive, send)


def create_app(settings: Settings | None = None) -> JobqApp:
    settings = settings or Settings()
    api = FastAPI(
        title="jobq",
        version="1",
        summary="An HTTP job queue on PostgreSQL.",
        description=(
            "Producers enqueue jobs; workers in any language claim them with a lease, heartbeat, and "
            "complete or fail them with the claim token. Errors are RFC 9457 problem+json."
        ),
        lifespan=_lifespan,
    )
    api.state.settings = settings
    add_routes(api, build_contract(settings))

    @api.get(
        "/readyz",
        operation_id="readyz",
        summary="Database reachable, schema current",
        tags=["health"],
        response_model=Readiness,
        responses=_problems(503),
    )
    async def readyz(request: Request) -> Any:
        try:
            async with request.app.state.db.connection() as conn:
                current = await migrate.schema_is_current(conn)
        except DatabaseUnavailable as exc:
            return problem_response(exc, "/readyz")
        if not current:
            return problem_response(NotReady(), "/readyz")
        return json_response({"status": "ready"})

    install_error_handlers(api)
    customise_openapi(api)
    return JobqApp(api, settings)


async def _wait_for_database(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(url, connect_timeout=5)
            await conn.close()
            return
        except psycopg.OperationalError as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"database not reachable after {timeout:.0f}s: {exc}") from exc
            log.warning("waiting for the database: %s", str(exc).strip().splitlines()[0])
            await asyncio.sleep(1)


@asynccontextmanager
async def _lifespan(api: FastAPI) -> AsyncIterator[None]:
    settings: Settings = api.state.settings
    url = settings.database_url
    if not url:
        raise RuntimeError("JOBQ_DATABASE_URL is not set (`jobq serve` sets it for the embedded database)")
    await _wait_for_database(url, STARTUP_TIMEOUT_SECONDS)
    if settings.migrate_on_start:
        applied = await asyncio.to_thread(migrate.migrate, url)
        if applied:
            log.info("migrations applied: %s", ", ".join(applied))
    db = Database(settings, url)
    await db.open(wait_seconds=STARTUP_TIMEOUT_SECONDS)

    broker = Broker(settings, db)
    wakeups = Wakeups(db, url, settings.notify_min_interval_ms, broker.wake, broker.waiting_queues)
    broker.on_parked = wakeups.parked

    def wake(queues: Iterable[str]) -> None:
        queues = set(queues)
        broker.wake(queues)
        wakeups.publish(queues)

    sweeper = Sweeper(settings, db, on_rescued=wake)
    jobs = JobService(settings, db, broker, wake)
    api.state.db = db
    api.state.broker = broker
    api.state.wakeups = wakeups
    api.state.sweeper = sweeper
    api.state.jobs = jobs

    broker.start()
    wakeups.start()
    sweeper.start()
    log.info("jobq ready (fast path %s)", "on" if settings.fast_path else "off")
    try:
        yield
    finally:
        await broker.drain()
        await sweeper.aclose()
        await wakeups.aclose()
        await jobs.aclose()
        await db.close()
        log.info("jobq stopped")
