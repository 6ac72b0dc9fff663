"""What the operator endpoints do: statistics, listings with cursors, and admin actions whose outcome
is decided by the guarded SQL (a worker finishing the job at the same moment wins or loses cleanly)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.core.cursors import QUEUES, BadCursor, decode_cursor, encode_cursor
from app.core.dependencies import DependencyRelease
from app.core.effects import CANCELLED, FAILED, PENDING, Effects, Moves, Path
from app.core.flow import QueueConfigs, changes_of
from app.core.jobs import invalid, sanitise_error
from app.core.wakeups import Wakeups
from app.db import admin as store_admin
from app.db import flow as store_flow
from app.db import operations as store_ops
from app.db import retention as store_retention
from app.db.flow import QueueConfigRow
from app.db.live_counts import trusted_seconds
from app.db.pool import Database
from app.db.replica import Conn, Reads
from app.db.rows import JobRow, QueueRow
from app.db.spread import key_names
from app.errors import InvalidState, JobNotFound
from app.models.flow import QueueConfigPatch
from app.observability.metrics import percentile_ms
from app.settings import Settings

Doc = dict[str, Any]


@dataclass(slots=True, frozen=True)
class Page:
    jobs: list[JobRow]
    next_cursor: str | None


def _counts(ready: int, scheduled: int, running: int, completed: int, failed: int, cancelled: int, waiting: int) -> Doc:
    return {
        "ready": ready,
        "scheduled": scheduled,
        "pending": ready + scheduled,
        "waiting": waiting,
        "running": running,
        "completed": int(completed),
        "failed": int(failed),
        "cancelled": int(cancelled),
    }


def _estimated(estimated: bool, counted_at: datetime | None) -> Doc:
    return {"counts_estimated": estimated, "counts_counted_at": counted_at if estimated else None}


def _queue_document(q: QueueRow) -> Doc:
    """A queue of GET /queues."""
    return {
        "queue": q.queue,
        "paused": q.paused,
        "counts": _counts(q.ready, q.scheduled, q.running, q.completed, q.failed, q.cancelled, q.waiting),
        "oldest_ready_age_seconds": q.oldest_ready_age,
        **_estimated(q.estimated, q.counted_at),
    }


def _moved(path: Path, job: JobRow, was: str | None, to: str) -> Moves:
    assert was is not None  # written: the statement reports the status it found
    moves = Moves(path)
    moves.add_jobs(job.queue, was, to, (job.id,))
    return moves


class OpsService:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        reads: Reads,
        effects: Effects,
        wakeups: Wakeups,
        configs: QueueConfigs,
        release: DependencyRelease,
    ) -> None:
        self.settings = settings
        self.dependants = release  # the jobs waiting for a cancelled one
        self.db = db
        self.reads = reads  # stats and listings may lag a little: the read replica when there is one
        self.effects = effects
        self.wakeups = wakeups  # a queue resumed or reconfigured: not a move of any job
        self.configs = configs
        # How old the background's count may be and still stand for a kind past the exact maximum.
        self._trust = trusted_seconds(settings.live_counts_interval_seconds)

    async def _names(self, queue: str) -> tuple[str, ...]:
        """The names `queue` keeps jobs under: its own, and a spread queue's other keys (app/db/spread.py), as this
        process's configuration cache knows them (a change of spread reaches it by NOTIFY)."""
        return (await self.configs.get(queue)).keys or (queue,)

    async def stats(self, queue: str, window: int | None) -> Doc:
        seconds = window or self.settings.stats_window_seconds

        async def read(conn: Conn) -> tuple[Any, Any, QueueConfigRow | None]:
            # The configuration first: it names the keys of a spread queue (app/db/spread.py), all added up.
            config = await store_flow.queue_config_get(conn, queue)
            names = key_names(queue, config.keys_used) if config is not None else (queue,)
            r, groups = await store_ops.queue_stats(conn, names, seconds, self.settings.stats_exact_max, self._trust)
            return r, groups, config

        r, groups, config = await self.reads.run(read)
        async with self.db.connection() as conn:  # vacuum's state is the primary's own
            health = await store_retention.database_health(conn)
        done = r.w_completed
        max_ms = round(r.w_duration_max_ms, 3) if r.w_duration_max_ms is not None and done else None
        return {
            "queue": queue,
            "paused": r.paused,
            "counts": _counts(r.ready, r.scheduled, r.running, r.completed, r.failed, r.cancelled, r.waiting),
            "oldest_ready_age_seconds": r.oldest_ready_age,
            **_estimated(r.estimated, r.counted_at),
            "jobs_on_last_attempt": r.on_last,
            "jobs_one_attempt_left": r.one_left,
            "window": {
                "seconds": seconds,
                "enqueued": r.w_enqueued,
                "claimed": r.w_claimed,
                "completed": done,
                "completions_per_minute": round(done / (seconds / 60), 3),
                "retries": r.w_retried,
                "failures": r.w_failed,
                "lease_expired": r.w_lease_expired,
                "cancelled": r.w_cancelled,
                "released": r.w_released,
                "empty_claims_with_ready_jobs": r.w_empty_claims,
                "held_back": {
                    "concurrency": r.w_held_concurrency,
                    "rate": r.w_held_rate,
                    "group_concurrency": r.w_held_group_concurrency,
                    "group_rate": r.w_held_group_rate,
                    "ordered": r.w_held_ordered,
                },
                "duration": {
                    "count": done,
                    "p50_ms": percentile_ms(r.w_durations_ms, 0.50, max_ms),
                    "p95_ms": percentile_ms(r.w_durations_ms, 0.95, max_ms),
                    "max_ms": max_ms,
                },
            },
            "database": {
                "jobs_dead_rows": health.jobs_dead_rows,
                "oldest_xmin_age_seconds": round(health.oldest_xmin_age_seconds, 3),
                "oldest_xmin_age_transactions": health.oldest_xmin_age_transactions,
                "replication": self.db.replication.document() if self.db.replication else None,
                "read_replica": self.reads.document(),
            },
            "as_of": r.as_of,
            "config": config,
            "groups": groups.groups,
            "groups_estimated": groups.estimated,
            "groups_counted_at": groups.counted_at if groups.estimated else None,
        }

    async def queues(self, allowed: str | None, limit: int, cursor: str | None) -> tuple[list[Doc], str | None]:
        """A page of the queues matching `allowed` (None: all), by name, and the cursor of the next page."""
        try:
            after = decode_cursor(cursor, QUEUES)[0] if cursor else None
        except BadCursor:
            raise invalid(["query", "cursor"], "not a cursor of this listing; start again without one") from None

        async def read(conn: Conn) -> tuple[Any, Any]:
            return await store_ops.queues_page(conn, allowed, after, limit, self.settings.stats_exact_max, self._trust)

        rows, last = await self.reads.run(read)
        return [_queue_document(q) for q in rows], encode_cursor(QUEUES, [last]) if last is not None else None

    async def list_jobs(self, queue: str, status: str | None, limit: int, cursor: str | None) -> Page:
        try:
            after = decode_cursor(cursor, status) if cursor else None
        except BadCursor:
            raise invalid(["query", "cursor"], "not a cursor of this listing; start again without one") from None

        names = await self._names(queue)

        async def read(conn: Conn) -> tuple[list[JobRow], Any]:
            return await store_ops.jobs_list(conn, names, status, limit, after)

        rows, last = await self.reads.run(read)
        return Page(rows, encode_cursor(status, last) if last else None)

    # -- admin actions ----------------------------------------------------------------------------------

    # `allowed`: the caller's queue regex (None: every queue); a job outside it is not found (app/auth/policy.py).

    async def cancel(self, job_id: int, reason: str | None, allowed: str | None = None) -> JobRow:
        if reason is not None:  # stored as last_error: the same rules as a worker's error text
            reason = sanitise_error(reason, self.settings.max_error_bytes)
        async with self.db.connection() as conn:
            found = await store_admin.job_cancel(conn, job_id, reason, allowed)
        if found is None or found.job is None:
            raise JobNotFound()
        job = found.job
        if not found.written:
            raise InvalidState(f"The job is {job.status}; only pending, waiting and running jobs can be cancelled.")
        self.effects.apply(_moved(Path.CANCEL, job, found.was, CANCELLED))
        await self.dependants.after_finish([job])  # its direct dependants now, the rest in the background
        return job

    async def retry(self, job_id: int, allowed: str | None = None) -> JobRow:
        async with self.db.connection() as conn:
            found = await store_admin.job_retry(conn, job_id, allowed)
        if found is None or found.job is None:
            raise JobNotFound()
        job = found.job
        if not found.written:
            raise InvalidState(f"The job is {job.status}; only failed, cancelled and completed jobs can be retried.")
        self.effects.apply(_moved(Path.RETRY, job, found.was, PENDING))
        return job

    async def redrive(self, queue: str, contains: str | None, dry_run: bool, limit: int | None) -> Doc:
        if contains is not None and "\x00" in contains:
            # Stored errors never hold NUL (PostgreSQL text cannot), so nothing matches.
            return {"queue": queue, "dry_run": dry_run, "jobs": 0}
        moves = Moves(Path.REDRIVE)
        n = 0
        async with self.db.connection() as conn:
            # A spread queue's failed jobs under every key, key after key, `limit` over them all.
            for key in await self._names(queue):
                if limit is not None and n >= limit:
                    break
                left = limit - n if limit is not None else None
                moved = await store_admin.jobs_redrive(
                    conn, key, contains, dry_run, self.settings.sweep_batch_size, left
                )
                if moved and not dry_run:
                    moves.add(key, FAILED, PENDING, n=moved)
                n += moved
        if n and not dry_run:
            self.effects.apply(moves)
        return {"queue": queue, "dry_run": dry_run, "jobs": n}

    async def set_paused(self, queue: str, paused: bool) -> Doc:
        async with self.db.connection() as conn, conn.transaction():
            # Every key of a spread queue (app/db/spread.py), read under the lock a change of its configuration
            # takes too: a spread raised after this commits copies the pause onto the new keys
            # (app/db/flow.py queue_keys_sync), one raised before it is seen here.
            row = await store_flow.queue_config_lock(conn, queue)
            await store_admin.queue_set_paused(conn, key_names(queue, row.keys_used), paused)
        if not paused:
            self.wakeups.jobs_available([queue])  # waiting workers get what piled up
        return {"queue": queue, "paused": paused}

    # -- configuration ----------------------------------------------------------------------------------------

    async def config(self, queue: str) -> QueueConfigRow | None:
        """The stored configuration (None: the queue has none: every setting is the global one)."""
        async with self.db.connection() as conn:
            return await store_flow.queue_config_get(conn, queue)

    async def configure(self, queue: str, patch: QueueConfigPatch) -> QueueConfigRow:
        row = await self.configs.update(queue, changes_of(patch))
        # A limit raised or lifted may let waiting claims take jobs now.
        self.wakeups.jobs_available([queue])
        return row
