"""create_app(): the ASGI application, and the lifespan that starts and stops its background parts."""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from types import FrameType
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from app.auth.exposure import Exposure, is_loopback
from app.auth.keyring import KeyRing
from app.auth.middleware import Authenticate, Authenticator
from app.auth.policy import OPEN_OPERATIONS
from app.core.dispatcher import ClaimDispatcher
from app.core.effects import Effects
from app.core.flow import QueueConfigs
from app.core.history import HistoryService
from app.core.jobs import JobService
from app.core.operations import OpsService
from app.core.results import ResultWaiters
from app.core.schedules import ScheduleService
from app.core.search import SearchService
from app.core.wakeups import Wakeups
from app.db import keys as store_keys
from app.db import migrate
from app.db.pool import Database
from app.errors import DatabaseUnavailable, NotReady, ShuttingDown
from app.http.apidocs import add_docs_routes
from app.http.dashboard import add_dashboard_routes
from app.http.fastpath import FastPath, RequestGuard
from app.http.history import add_history_routes
from app.http.jobs import JobqRoute, _problems, add_routes, install_error_handlers
from app.http.openapi import customise_openapi
from app.http.operations import add_operator_routes
from app.http.responses import json_response, problem_response
from app.http.schedules import add_schedule_routes
from app.http.search import add_search_routes
from app.maintenance.base import Supervisor
from app.maintenance.gauges import Gauges
from app.maintenance.keys import KeyUse
from app.maintenance.listener import WakeupListener
from app.maintenance.poll import FallbackPoll
from app.maintenance.rescuer import LeaseRescuer
from app.maintenance.retention import Retention
from app.maintenance.samples import BacklogSampler
from app.maintenance.scheduler import Scheduler
from app.maintenance.stats import StatsFlush
from app.maintenance.vacuum import Vacuum
from app.models.jobs import Readiness, build_contract
from app.runtime.clients import ClientAddress
from app.runtime.logs import AccessLog, Observability, resolve_format
from app.runtime.metrics import Metrics
from app.runtime.tracing import from_environment as tracing_from_environment
from app.runtime.tracing import incoming_traceparent
from app.runtime.tracing import provided as tracing_with
from app.settings import Settings

log = logging.getLogger("jobq")

STARTUP_TIMEOUT_SECONDS = 30.0
READY_TIMEOUT_SECONDS = 1.0  # /readyz answers within about this, database up or not


class JobqApp:
    """The ASGI stack: Observability -> Authenticate -> RequestGuard -> FastPath -> FastAPI. `.api` is the
    FastAPI app (state, routes). Authentication comes before the guard so that a caller without a key gets
    401 before its body is read; both HTTP paths below it see the same principal. Observability is
    outermost so that refusals are counted and logged like any answer."""

    def __init__(self, api: FastAPI, settings: Settings) -> None:
        self.api = api
        inner: ASGIApp = FastPath(api) if settings.fast_path else api
        self.guard = RequestGuard(inner, settings.max_request_bytes)

        def keys() -> Authenticator:
            ring: KeyRing = api.state.keys
            return ring.authenticate

        exposure = Exposure(settings.auth, settings.allowed_hosts)
        authenticate = Authenticate(self.guard, exposure=exposure, keys=keys, open_paths=open_paths(api))
        clients = ClientAddress(settings.trusted_proxies)
        self._stack = Observability(authenticate, api.state.metrics, api.state.access_log, api.state.tracing, clients)

    @property
    def state(self) -> Any:
        return self.api.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._stack(scope, receive, send)


def create_app(settings: Settings | None = None, *, tracer_provider: Any = None) -> JobqApp:
    """The application. Tracing follows the OTEL_* variables (app/runtime/tracing.py), or goes through
    `tracer_provider` when one is given (an OpenTelemetry SDK TracerProvider: tests, embedding)."""
    settings = settings or Settings()
    api = FastAPI(
        **_fastapi_telemetry_off(),
        title="jobq",
        version="1",
        summary="An HTTP job queue on PostgreSQL.",
        description=(
            "Producers enqueue jobs; workers in any language claim them with a lease, heartbeat, and "
            "complete or fail them with the claim token. Errors are RFC 9457 problem+json."
        ),
        lifespan=_lifespan,
        docs_url=None,  # app/http/apidocs.py serves /docs without a CDN
        redoc_url=None,
    )
    api.router.route_class = JobqRoute
    api.state.settings = settings
    api.state.metrics = Metrics(settings.metrics_max_queues, settings.metrics_queue_idle_seconds)
    api.state.access_log = AccessLog(settings.access_log, fmt=resolve_format(settings.log_format))
    tracing = tracing_with(tracer_provider) if tracer_provider is not None else tracing_from_environment()
    api.state.tracing = tracing
    # The trace context an enqueue stores with its jobs (see app/runtime/tracing.py).
    api.state.job_context = tracing.job_context if tracing is not None else incoming_traceparent
    add_routes(api, build_contract(settings))
    add_operator_routes(api)
    add_history_routes(api)
    add_search_routes(api)
    add_schedule_routes(api)
    add_dashboard_routes(api)
    api.state.docs_paths = add_docs_routes(api)

    @api.get(
        "/readyz",
        operation_id="readyz",
        summary="Database reachable, schema current",
        tags=["health"],
        response_model=Readiness,
        responses=_problems(503),
    )
    async def readyz(request: Request) -> Any:
        if request.app.state.dispatcher.closing:
            return problem_response(ShuttingDown(), "/readyz")  # a load balancer stops sending work here
        try:
            async with request.app.state.db.connection(timeout=READY_TIMEOUT_SECONDS) as conn:
                current = await migrate.schema_is_current(conn)
        except DatabaseUnavailable as exc:
            return problem_response(exc, "/readyz")
        if not current:
            return problem_response(NotReady(), "/readyz")
        return json_response({"status": "ready"})

    install_error_handlers(api)
    customise_openapi(api, settings)
    return JobqApp(api, settings)


def _fastapi_telemetry_off() -> dict[str, Any]:
    """FastAPI's own OpenTelemetry spans and metrics (in versions that have them), off: jobq makes the request
    span itself, in its outermost layer, for both HTTP paths (FastAPI sees only the cold routes), and reports
    metrics to Prometheus."""
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    return {}


def open_paths(api: FastAPI) -> set[str]:
    """Paths served without a key: health checks, the dashboard's page and files, and the API's own
    description."""
    paths = {r.path for r in api.routes if isinstance(r, APIRoute) and r.operation_id in OPEN_OPERATIONS}
    paths.update(p for p in (api.openapi_url, api.docs_url, api.redoc_url, api.swagger_ui_oauth2_redirect_url) if p)
    paths.update(getattr(api.state, "docs_paths", ()))
    return paths


def _log_auth(settings: Settings, live_keys: int) -> None:
    """Say at start who may use this service, with a warning whenever it may run without keys. The address
    it will listen on is not known here (the server binds after the lifespan has started, and may not be
    `jobq serve`): JOBQ_AUTH=auto decides per connection (app/auth/exposure.py). Never logs a key."""
    if settings.auth == "on":
        log.info("authentication on: API keys required on every address (JOBQ_AUTH=on)")
    elif settings.auth == "off":
        log.warning(
            "authentication OFF (JOBQ_AUTH=off): anyone who can reach this service can enqueue, claim and read "
            "every job; proxied, cross-site and foreign-Host requests are refused. Set JOBQ_AUTH=on (or unset it) "
            "to require API keys."
        )
    else:
        log.warning(
            "authentication auto: API keys are required except on connections to a loopback address, which run "
            "open%s. Set JOBQ_AUTH=on to require keys everywhere.",
            f" (JOBQ_HOST={settings.host} is one)" if is_loopback(settings.host) else "",
        )
    keys_needed = settings.auth == "on" or (settings.auth == "auto" and not is_loopback(settings.host))
    if keys_needed and live_keys == 0 and settings.api_key is None:
        log.warning("no API key exists yet: `jobq keys create` one, or set JOBQ_API_KEY")


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


def _drain_on_stop_signal(drain: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """On SIGTERM/SIGINT, start draining the long-polls at once. uvicorn runs the lifespan shutdown only after
    every request in flight has finished, and a waiting long-poll would hold that up for wait_seconds: so
    waiting claims are answered [] now, new ones get [] too, and nothing is handed to a connection about to
    close; requests waiting for a job's result answer with the job as it is. The handler is chained in front
    of the server's own (uvicorn's, installed before the lifespan starts), which it then calls. Signals
    reach only the main thread: in a server on another thread (tests) this does nothing. Returns the
    function that puts the server's handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    draining: list[asyncio.Task[None]] = []

    def start_drain() -> None:
        if not draining:
            log.info("stop signal: answering waiting claims, finishing requests in flight")
            draining.append(loop.create_task(drain()))

    previous: dict[int, Callable[[int, FrameType | None], Any]] = {}

    def on_signal(sig: int, frame: FrameType | None) -> None:
        loop.call_soon_threadsafe(start_drain)
        previous[sig](sig, frame)

    for sig in (signal.SIGTERM, signal.SIGINT):
        handler = signal.getsignal(sig)
        if callable(handler):  # a server that handles stop signals itself; otherwise leave them be
            previous[sig] = handler
            signal.signal(sig, on_signal)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


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
    metrics: Metrics = api.state.metrics

    # The process's parts, each built once: the wake-up seam is shared by the dispatcher (which announces
    # its waiters through it), the services that make jobs claimable, and the listener that feeds it.
    keys = KeyRing(db, settings.auth_cache_seconds, settings.api_key.get_secret_value() if settings.api_key else None)
    wakeups = Wakeups(db, settings.notify_min_interval_ms)
    configs = QueueConfigs(settings, db)
    effects = Effects(wakeups, metrics, configs)  # what every write path's moves set off (app/core/effects.py)
    dispatcher = ClaimDispatcher(settings, db, wakeups, metrics, configs, effects)
    results = ResultWaiters(db, wakeups, dispatcher.cap)  # one waiter cap for claims and result waits
    wakeups.attach(dispatcher, results)
    jobs = JobService(settings, db, dispatcher, effects, results, configs)
    scheduler = Scheduler(settings, db, metrics, effects)
    maintenance = Supervisor(
        [
            WakeupListener(url, wakeups, keys, configs),
            FallbackPoll(dispatcher, results, settings.poll_interval_seconds, metrics),
            LeaseRescuer(settings, db, metrics, effects),
            scheduler,
            Retention(settings, db, metrics, effects),
            Vacuum(settings, db, metrics),
            Gauges(metrics, db, dispatcher, results, settings.gauges_interval_seconds),
            BacklogSampler(db, metrics),
            StatsFlush(metrics, db),
            KeyUse(keys, metrics),
        ]
    )
    api.state.db = db
    api.state.dispatcher = dispatcher
    api.state.results = results
    api.state.wakeups = wakeups
    api.state.maintenance = maintenance
    api.state.jobs = jobs
    api.state.ops = OpsService(settings, db, effects, wakeups, configs)
    api.state.configs = configs
    api.state.history = HistoryService(db)
    api.state.search = SearchService(settings, db, effects)
    api.state.schedules = ScheduleService(settings, db, scheduler.poke)
    api.state.keys = keys
    async with db.connection() as conn:
        _log_auth(settings, await store_keys.api_keys_count_live(conn))

    maintenance.start()

    async def drain() -> None:
        await asyncio.gather(dispatcher.drain(), results.drain())

    restore_signals = _drain_on_stop_signal(drain)
    log.info("jobq ready (fast path %s)", "on" if settings.fast_path else "off")
    try:
        yield
    finally:
        restore_signals()
        await drain()
        await jobs.aclose()
        await maintenance.stop()  # the statistics' and keys' last flush included
        await db.close()
        api.state.access_log.close()
        if api.state.tracing is not None:
            await asyncio.to_thread(api.state.tracing.shutdown)  # the last spans exported
        log.info("jobq stopped")
