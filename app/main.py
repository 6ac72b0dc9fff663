"""create_app(): the ASGI application, and the lifespan that builds its parts (app/services.py) and stops them."""

from __future__ import annotations

import gc
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from app import __version__
from app.auth.exposure import Exposure
from app.auth.keyring import KeyRing
from app.auth.middleware import Authenticate, Authenticator
from app.auth.policy import OPEN_OPERATIONS
from app.auth.sigv4 import SqsAuthError, signer_recheck, sqs_authenticator
from app.http.apidocs import add_docs_routes
from app.http.dashboard import add_dashboard_routes
from app.http.fastpath import FastPath, RequestGuard
from app.http.health import add_health_routes
from app.http.history import add_history_routes
from app.http.jobs import JobqRoute, add_routes, install_error_handlers
from app.http.openapi import customise_openapi
from app.http.operations import add_operator_routes
from app.http.quotas import Quotas
from app.http.schedules import add_schedule_routes
from app.http.search import add_search_routes
from app.http.workers import add_worker_routes
from app.models.jobs import build_contract
from app.observability.clients import ClientAddress
from app.observability.logs import Observability
from app.services import Services, Telemetry, build_services, build_telemetry, services_of
from app.settings import Settings
from app.signals import drain_on_stop_signal
from app.sqs.auth import refusing_with_codes
from app.sqs.endpoint import SqsEndpoint, is_sqs_request

log = logging.getLogger("jobq")


class JobqApp:
    """The ASGI stack: Observability -> Authenticate -> Quotas -> SqsEndpoint -> RequestGuard -> FastPath -> FastAPI.
    Quotas (a key's rate, a client's requests in flight) come right after the caller is known. `.api`
    is the FastAPI app (routes), `.services` the parts its lifespan built. Authentication comes before the guard so
    that a caller without a key gets 401 before its body is read; both HTTP paths below it see the same
    principal. Observability is outermost so that refusals are counted and logged like any answer."""

    def __init__(self, api: FastAPI, settings: Settings, telemetry: Telemetry, docs_paths: Iterable[str] = ()) -> None:
        self.api = api
        inner: ASGIApp = FastPath(api) if settings.fast_path else api
        self.guard = RequestGuard(inner, settings.max_request_bytes)

        # SQS requests are answered before the guard (their Content-Types are not JSON: app/sqs/endpoint.py).
        def ring() -> KeyRing:
            return services_of(api).keys

        # With keys on, an SQS request that carries no jobq key is verified by AWS Signature V4 (app/auth/sigv4.py).
        sqs = SqsEndpoint(
            self.guard,
            api,
            settings.max_request_bytes,
            authenticate=refusing_with_codes(sqs_authenticator(ring, settings), SqsAuthError),
            recheck=lambda parts, who: signer_recheck(ring(), parts, who),
        )

        def keys() -> Authenticator:
            return services_of(api).keys.authenticate

        exposure = Exposure(settings.auth, settings.allowed_hosts)
        clients = ClientAddress(settings.trusted_proxies)
        authenticate = Authenticate(
            Quotas(sqs, settings, clients),
            exposure=exposure,
            keys=keys,
            open_paths=open_paths(api, docs_paths),
            authenticates_itself=is_sqs_request,
        )
        self._stack = Observability(authenticate, telemetry.metrics, telemetry.access_log, telemetry.tracing, clients)

    @property
    def services(self) -> Services:
        return services_of(self.api)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._stack(scope, receive, send)


def create_app(settings: Settings | None = None, *, tracer_provider: Any = None) -> JobqApp:
    """The application. Tracing follows the OTEL_* variables (app/observability/tracing.py), or goes through
    `tracer_provider` when one is given (an OpenTelemetry SDK TracerProvider: tests, embedding)."""
    settings = settings or Settings()
    telemetry = build_telemetry(settings, tracer_provider)
    api = FastAPI(
        **_fastapi_telemetry_off(),
        title="jobq",
        version=__version__,
        summary="An HTTP job queue on PostgreSQL.",
        description=(
            "Producers enqueue jobs; workers in any language claim them with a lease, heartbeat, and "
            "complete or fail them with the claim token. Errors are RFC 9457 problem+json."
        ),
        lifespan=_lifespan(settings, telemetry),
        docs_url=None,  # app/http/apidocs.py serves /docs without a CDN
        redoc_url=None,
    )
    api.router.route_class = JobqRoute
    add_routes(api, build_contract(settings))
    add_health_routes(api)
    add_operator_routes(api)
    add_history_routes(api)
    add_search_routes(api)
    add_worker_routes(api)
    add_schedule_routes(api)
    add_dashboard_routes(api)
    docs_paths = add_docs_routes(api)
    install_error_handlers(api)
    customise_openapi(api, settings)
    return JobqApp(api, settings, telemetry, docs_paths)


def published_document() -> dict[str, Any]:
    """The contract committed as openapi/openapi.json: the default configuration's document. Here, not in
    app/http/openapi.py, because it builds the whole application (and http/ must not import main)."""
    return create_app(Settings.defaults(database_url="postgresql://unused")).api.openapi()


def _fastapi_telemetry_off() -> dict[str, Any]:
    """FastAPI's own OpenTelemetry spans and metrics (in versions that have them), off: jobq makes the request
    span itself, in its outermost layer, for both HTTP paths (FastAPI sees only the cold routes), and reports
    metrics to Prometheus."""
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    return {}


def open_paths(api: FastAPI, docs_paths: Iterable[str] = ()) -> set[str]:
    """Paths served without a key: health checks, the dashboard's page and files, and the API's own
    description (with `docs_paths`, /docs and its files)."""
    paths = {r.path for r in api.routes if isinstance(r, APIRoute) and r.operation_id in OPEN_OPERATIONS}
    paths.update(p for p in (api.openapi_url, api.docs_url, api.redoc_url, api.swagger_ui_oauth2_redirect_url) if p)
    paths.update(docs_paths)
    return paths


# The youngest generation of the cyclic garbage collector is collected once this many more container objects are
# alive than at its last collection (CPython's default is 700; see _collector_for_serving).
GC_THRESHOLD0 = 10_000


@contextmanager
def _collector_for_serving() -> Iterator[None]:
    """The garbage collector set for serving while the service runs, as measured (BENCHMARKS.md, "The garbage
    collector"). Every object alive once the service has started (modules, routes, pydantic's schemas: about 80,000)
    is frozen: a full collection no longer walks them each time (it took about 70 ms, every few hundred requests:
    about a fifth of an API process's time under load). And the youngest generation is collected after 10,000 new
    container objects instead of 700: a request's objects are freed by their reference counts, not by the collector,
    and a batch of 1,000 jobs has more than 700 alive at once, so each collection only promoted them to be walked
    again.
    A threshold already above ours (an embedding application's) is kept. At shutdown both are undone, so that an
    application started again in the same process (tests) leaves nothing frozen behind, and the threshold is given
    back unless someone changed it meanwhile. A frozen object that becomes cyclic garbage while the service runs
    is freed only at shutdown: what start-up makes and later drops in cycles is little (RSS did not move)."""
    before = gc.get_threshold()
    ours = (GC_THRESHOLD0, *before[1:]) if before[0] < GC_THRESHOLD0 else None
    # No collection first: a started service holds about ten objects of cyclic garbage (measured), and a full
    # collection of a test process's heap at each server start cost the suite minutes.
    gc.freeze()
    if ours is not None:
        gc.set_threshold(*ours)
    try:
        yield
    finally:
        gc.unfreeze()
        if ours is not None and gc.get_threshold() == ours:
            gc.set_threshold(*before)


def _lifespan(settings: Settings, telemetry: Telemetry) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    @asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        services = await build_services(settings, telemetry)
        api.state.services = services  # the one attribute: app/services.py reads it, typed
        services.start()
        restore_signals = drain_on_stop_signal(services.drain)
        log.info("jobq ready (fast path %s)", "on" if settings.fast_path else "off")
        try:
            with _collector_for_serving():
                yield
        finally:
            restore_signals()
            await services.aclose()
            log.info("jobq stopped")

    return lifespan
