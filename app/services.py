"""The composition root: every part of the service, built once into one typed object, and how a handler finds it.

Two objects, because the parts come to life at two moments. `Telemetry` (metrics, access log, tracing) is
made by create_app(): the outermost ASGI layer reports every request with it, before and after the
lifespan. `Services` is built by the lifespan (`build_services`), once the database is reachable, and
holds everything a handler, a test or the shutdown reaches: the pool, the dispatcher, the core services,
the background services. Handlers read it through `services(request)`, tests through `JobqApp.services`;
both end in one attribute, `app.state.services`, checked here, so that mypy follows every call from a
handler to a service. (Starlette's lifespan state would hand it to requests only: the ASGI layers around
FastAPI and the tests need it outside one.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from starlette.applications import Starlette
from starlette.requests import Request

from app.auth.exposure import is_loopback
from app.auth.keyring import KeyRing
from app.core.dependencies import DependencyRelease
from app.core.dispatcher import ClaimDispatcher
from app.core.effects import Effects
from app.core.explain import ExplainService
from app.core.flow import QueueConfigs
from app.core.history import HistoryService
from app.core.jobs import JobService
from app.core.operations import OpsService
from app.core.quotas import EnqueueQuotas
from app.core.results import ResultWaiters
from app.core.scale import ScaleService
from app.core.schedules import ScheduleService
from app.core.search import SearchService
from app.core.sqs import SqsService
from app.core.wakeups import Wakeups
from app.core.workers import WorkerActivity, WorkerService
from app.db import keys as store_keys
from app.db import migrate, schema
from app.db.live_counts import trusted_seconds
from app.db.pool import Database
from app.db.replica import Reads
from app.maintenance.base import Supervisor
from app.maintenance.counts import LiveCounts
from app.maintenance.gauges import Gauges
from app.maintenance.keys import KeyUse
from app.maintenance.listener import WakeupListener
from app.maintenance.poll import FallbackPoll
from app.maintenance.releaser import DependencyReleaser
from app.maintenance.replica import ReplicaWatch
from app.maintenance.rescuer import LeaseRescuer
from app.maintenance.retention import Retention
from app.maintenance.samples import BacklogSampler
from app.maintenance.scheduler import Scheduler
from app.maintenance.stats import StatsFlush, TallyApply
from app.maintenance.timeouts import TimeoutSweeper
from app.maintenance.vacuum import Vacuum
from app.maintenance.workers import WorkersFlush
from app.observability.logs import AccessLog, resolve_format
from app.observability.metrics import Metrics
from app.observability.tracing import TraceContext, Tracing, incoming_traceparent
from app.observability.tracing import from_environment as tracing_from_environment
from app.observability.tracing import provided as tracing_with
from app.settings import Settings

log = logging.getLogger("jobq")

STARTUP_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class Telemetry:
    """What the service reports with, made with the application (the ASGI stack needs it at once)."""

    metrics: Metrics
    access_log: AccessLog
    tracing: Tracing | None
    job_context: TraceContext  # the trace context an enqueue stores with its jobs (app/observability/tracing.py)


def build_telemetry(settings: Settings, tracer_provider: Any = None) -> Telemetry:
    """Tracing follows the OTEL_* variables, or goes through `tracer_provider` when one is given."""
    tracing = tracing_with(tracer_provider) if tracer_provider is not None else tracing_from_environment()
    return Telemetry(
        metrics=Metrics(settings.metrics_max_queues, settings.metrics_queue_idle_seconds),
        access_log=AccessLog(settings.access_log, fmt=resolve_format(settings.log_format)),
        tracing=tracing,
        job_context=tracing.job_context if tracing is not None else incoming_traceparent,
    )


@dataclass(frozen=True)
class Services:
    """The process's parts, each built once (by build_services)."""

    settings: Settings
    db: Database
    reads: Reads  # stats, listings, search, history: on the read replica when there is one (app/db/replica.py)
    keys: KeyRing
    wakeups: Wakeups
    configs: QueueConfigs
    dispatcher: ClaimDispatcher
    results: ResultWaiters
    jobs: JobService
    ops: OpsService
    history: HistoryService
    search: SearchService
    schedules: ScheduleService
    release: DependencyRelease  # jobs waiting for finished ones (app/core/dependencies.py)
    workers: WorkerService
    scale: ScaleService
    explain: ExplainService
    sqs: SqsService  # the SQS API's queues and sends (app/sqs/)
    maintenance: Supervisor
    metrics: Metrics
    access_log: AccessLog
    tracing: Tracing | None
    job_context: TraceContext

    def start(self) -> None:
        """Start the background services."""
        self.maintenance.start()

    async def drain(self) -> None:
        """Answer the waiting claims and result waits now, and every later one at once (stopping)."""
        await asyncio.gather(self.dispatcher.drain(), self.results.drain())

    async def aclose(self) -> None:
        """Stop everything, in the reverse order of its making; the telemetry last, so that it reports it."""
        await self.drain()
        await self.jobs.aclose()
        await self.dispatcher.released()  # what a hand-off in the enqueues' last statements could not hand out
        await self.maintenance.stop()  # the statistics' and keys' last flush included
        await self.reads.close()
        await self.db.close()
        self.access_log.close()
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)  # the last spans exported


async def build_services(settings: Settings, telemetry: Telemetry) -> Services:
    """Wait for the database, migrate it when asked to, open the pool and build every part (the background
    services not started yet: Services.start())."""
    url = settings.database_url
    if not url:
        raise RuntimeError("JOBQ_DATABASE_URL is not set (`jobq serve` sets it for the embedded database)")
    await _wait_for_database(url, STARTUP_TIMEOUT_SECONDS)
    if settings.migrate_on_start:
        applied = await asyncio.to_thread(
            migrate.migrate,
            url,
            schema=settings.db_schema,
            lock_timeout_ms=settings.migration_lock_timeout_ms,
            lock_wait_seconds=settings.migration_lock_wait_seconds,
        )
        if applied:
            log.info("migrations applied: %s", ", ".join(applied))
    location = await _where_the_tables_are(url, settings.db_schema)
    db = Database(settings, url, location=location)
    await db.open(wait_seconds=STARTUP_TIMEOUT_SECONDS)
    try:
        _check_replication(settings, db)
    except RuntimeError:
        await db.close()
        raise
    replica = (
        Database(settings, settings.read_database_url, replica=True, location=location)
        if settings.read_database_url
        else None
    )
    reads = Reads(db, replica, settings.read_max_lag_seconds)
    await reads.open()
    metrics = telemetry.metrics

    # The wake-up seam is shared by the dispatcher (which announces its waiters through it), the services
    # that make jobs claimable, and the listener that feeds it.
    keys = KeyRing(db, settings.auth_cache_seconds, settings.api_key.get_secret_value() if settings.api_key else None)
    wakeups = Wakeups(db, settings.notify_min_interval_ms)
    configs = QueueConfigs(settings, db)
    effects = Effects(wakeups, metrics, configs)  # what every write path's moves set off (app/core/effects.py)
    dispatcher = ClaimDispatcher(settings, db, wakeups, metrics, configs, effects)
    results = ResultWaiters(db, wakeups, dispatcher.cap)  # one waiter cap for claims and result waits
    wakeups.attach(dispatcher, results)
    # The release of jobs waiting for finished ones (app/core/dependencies.py): the write paths run its first
    # step, the background service the rest.
    release = DependencyRelease(settings, db, effects)
    activity = WorkerActivity()  # the worker registry's sightings, flushed by WorkersFlush
    quotas = EnqueueQuotas(settings, db, configs)
    jobs = JobService(settings, db, dispatcher, effects, results, configs, quotas, release, activity)
    ops = OpsService(settings, db, reads, effects, wakeups, configs, release)
    scheduler = Scheduler(settings, db, metrics, effects)
    maintenance = Supervisor(
        [
            TallyApply(metrics),  # first: stopped last, after every other service's last count
            WakeupListener(url, wakeups, keys, configs),
            FallbackPoll(dispatcher, results, settings.poll_interval_seconds, metrics),
            LeaseRescuer(settings, db, metrics, effects, release),
            DependencyReleaser(settings, release, metrics),
            TimeoutSweeper(settings, db, metrics, effects, activity, release),
            scheduler,
            Retention(settings, db, metrics, effects),
            Vacuum(settings, db, metrics),
            Gauges(
                metrics,
                db,
                dispatcher,
                results,
                settings.gauges_interval_seconds,
                settings.stats_exact_max,
                trusted_seconds(settings.live_counts_interval_seconds),
            ),
            BacklogSampler(db, metrics),
            LiveCounts(db, metrics, settings.live_counts_interval_seconds),
            StatsFlush(metrics, db),
            WorkersFlush(settings, activity, db, metrics),
            KeyUse(keys, metrics),
            ReplicaWatch(db, reads, metrics),
        ]
    )
    services = Services(
        settings=settings,
        db=db,
        reads=reads,
        keys=keys,
        wakeups=wakeups,
        configs=configs,
        dispatcher=dispatcher,
        results=results,
        jobs=jobs,
        ops=ops,
        history=HistoryService(reads, configs),
        search=SearchService(settings, db, reads, effects, release, configs),
        schedules=ScheduleService(settings, db, scheduler.poke),
        release=release,
        workers=WorkerService(settings, reads),
        scale=ScaleService(reads, configs),
        explain=ExplainService(db),
        sqs=SqsService(settings, db, jobs, ops, configs, dispatcher, effects),
        maintenance=maintenance,
        metrics=metrics,
        access_log=telemetry.access_log,
        tracing=telemetry.tracing,
        job_context=telemetry.job_context,
    )
    async with db.connection() as conn:
        _log_auth(settings, await store_keys.api_keys_count_live(conn))
        if missing := await migrate.missing_migrations(conn, location):
            # `jobq serve --no-migrate` (or JOBQ_MIGRATE_ON_START=false) on a database not migrated yet.
            log.error(migrate.behind(missing))
    return services


def _check_replication(settings: Settings, db: Database) -> None:
    """At start (the pool's first connections read it: app/db/replication.py): standbys replicating
    asynchronously are a warning, already logged, or a refusal with JOBQ_REQUIRE_SYNCHRONOUS_REPLICATION."""
    replication = db.replication
    if settings.require_synchronous_replication and replication is not None and replication.asynchronous:
        raise RuntimeError(f"refusing to start (JOBQ_REQUIRE_SYNCHRONOUS_REPLICATION is set): {replication.warning}")


def services(request: Request) -> Services:
    """The parts of the service that answers `request` (in a handler, or an ASGI layer's Request)."""
    return services_of(request.app)


def services_of(app: Starlette) -> Services:
    """The parts the lifespan of `app` (the FastAPI application) built."""
    found = getattr(app.state, "services", None)
    if not isinstance(found, Services):
        raise RuntimeError("the service's parts are not built: the application's lifespan has not started")
    return found


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


async def _where_the_tables_are(url: str, configured: str) -> schema.Location:
    """The schema of jobq's tables (app/db/schema.py): the configured one, or public on an installation older
    than 1.2.0 not moved yet. Known before the pool opens: each of its connections is set up for it."""
    location = schema.Location(configured)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=5) as conn:
        location.found(await schema.where(conn, configured))
    if location.current != configured:
        log.warning(
            "jobq's tables are in schema %s (an installation made before 1.2.0); move them into %s with "
            "`jobq migrate --move-into-schema` once no process of an older release is left",
            location.current,
            configured,
        )
    return location


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
