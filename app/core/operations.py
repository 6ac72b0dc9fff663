"""What the operator endpoints do: statistics, listings with cursors, and admin actions whose outcome
is decided by the guarded SQL (a worker finishing the job at the same moment wins or loses cleanly)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import orjson

from app.core.jobs import Doc, invalid, sanitise_error
from app.db import jobs as store
from app.db import operations as store_ops
from app.db.pool import Database
from app.errors import InvalidState, JobNotFound
from app.runtime.metrics import DURATION_BOUNDS_MS, Metrics
from app.settings import Settings

FINISHED = ("completed", "failed", "cancelled")


def percentile_ms(histogram: list[int] | None, q: float, max_ms: float | None) -> float | None:
    """The q-quantile of a DURATION_BOUNDS_MS histogram, interpolated linearly inside its bucket and
    never above the exact maximum. Its error is bounded by the width of one bucket."""
    if not histogram or not sum(histogram):
        return None
    rank = q * sum(histogram)
    seen = 0
    for i, n in enumerate(histogram):
        if n and seen + n >= rank:
            low = DURATION_BOUNDS_MS[i - 1] if i > 0 else 0.0
            high = DURATION_BOUNDS_MS[i] if i < len(DURATION_BOUNDS_MS) else (max_ms or low)
            value = low + (high - low) * (rank - seen) / n
            return round(min(value, max_ms) if max_ms is not None else value, 3)
        seen += n
    return max_ms


def encode_cursor(status: str | None, keys: list[Any]) -> str:
    raw = orjson.dumps({"s": status, "k": keys})
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# The sort keys a cursor carries, per listing (store_ops.list_statement): smallint priority, bigint id,
# timestamps as RFC 3339 text.
_SMALLINT, _BIGINT, _TIME = (-(2**15), 2**15 - 1), (-(2**63), 2**63 - 1), "time"
_CURSOR_KEYS: dict[str | None, tuple[Any, ...]] = {
    "pending": (_SMALLINT, _TIME, _BIGINT),
    "running": (_TIME, _BIGINT),
    **{status: (_TIME, _BIGINT) for status in FINISHED},
    None: (_BIGINT,),
}


def _cursor_key(kind: Any, value: Any) -> Any:
    """One sort key of a cursor, checked against its column's type: a cursor is client input, and a key
    of the wrong type must not reach SQL (psycopg cannot adapt a JSON object; a list becomes an array)."""
    if kind == _TIME:
        if not isinstance(value, str):
            raise TypeError(value)
        stamp = datetime.fromisoformat(value)
        if stamp.tzinfo is None:
            raise ValueError(value)
        return stamp
    low, high = kind
    if type(value) is not int or not low <= value <= high:
        raise TypeError(value)
    return value


def decode_cursor(cursor: str, status: str | None, width: int) -> list[Any]:
    kinds = _CURSOR_KEYS.get(status, ())
    try:
        doc = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        keys = doc["k"]
        ok = doc["s"] == status and isinstance(keys, list) and len(keys) == width == len(kinds)
        if ok:
            keys = [_cursor_key(kind, key) for kind, key in zip(kinds, keys, strict=True)]
    except (binascii.Error, ValueError, KeyError, TypeError, OverflowError):
        ok = False
    if not ok:
        raise invalid(["query", "cursor"], "not a cursor of this listing; start again without one")
    return list(keys)


def _counts(ready: int, scheduled: int, running: int, completed: int, failed: int, cancelled: int) -> Doc:
    return {
        "ready": ready,
        "scheduled": scheduled,
        "pending": ready + scheduled,
        "running": running,
        "completed": int(completed),
        "failed": int(failed),
        "cancelled": int(cancelled),
    }


class OpsService:
    def __init__(
        self, settings: Settings, db: Database, metrics: Metrics, wake: Callable[[Iterable[str]], None]
    ) -> None:
        self.settings = settings
        self.db = db
        self.metrics = metrics
        self.wake = wake

    async def stats(self, queue: str, window: int | None) -> Doc:
        seconds = window or self.settings.stats_window_seconds
        async with self.db.connection() as conn:
            r = await store_ops.queue_stats(conn, queue, seconds)
        (ready, scheduled, oldest, running, completed, failed, cancelled, on_last, one_left,
         w_enq, w_claimed, w_done, w_failed, w_retried, w_expired, w_cancelled, w_released, w_empty,
         w_max, w_hist, paused, as_of) = r  # fmt: skip
        max_ms = round(float(w_max), 3) if w_max is not None and w_done else None
        return {
            "queue": queue,
            "paused": paused,
            "counts": _counts(ready, scheduled, running, completed, failed, cancelled),
            "oldest_ready_age_seconds": float(oldest) if oldest is not None else None,
            "jobs_on_last_attempt": on_last,
            "jobs_one_attempt_left": one_left,
            "window": {
                "seconds": seconds,
                "enqueued": int(w_enq),
                "claimed": int(w_claimed),
                "completed": int(w_done),
                "completions_per_minute": round(int(w_done) / (seconds / 60), 3),
                "retries": int(w_retried),
                "failures": int(w_failed),
                "lease_expired": int(w_expired),
                "cancelled": int(w_cancelled),
                "released": int(w_released),
                "empty_claims_with_ready_jobs": int(w_empty),
                "duration": {
                    "count": int(w_done),
                    "p50_ms": percentile_ms(w_hist, 0.50, max_ms),
                    "p95_ms": percentile_ms(w_hist, 0.95, max_ms),
                    "max_ms": max_ms,
                },
            },
            "as_of": as_of,
        }

    async def queues(self) -> list[Doc]:
        async with self.db.connection() as conn:
            rows = await store_ops.queues_list(conn)
        return [
            {
                "queue": name,
                "paused": paused,
                "counts": _counts(ready, scheduled, running, completed, failed, cancelled),
                "oldest_ready_age_seconds": float(oldest) if oldest is not None else None,
            }
            for name, ready, scheduled, running, completed, failed, cancelled, oldest, paused in rows
        ]

    async def list_jobs(self, queue: str, status: str | None, limit: int, cursor: str | None) -> Doc:
        _, width = store_ops.list_statement(status)
        after = decode_cursor(cursor, status, width) if cursor else None
        async with self.db.connection() as conn:
            rows, last = await store_ops.jobs_list(conn, queue, status, limit, after)
        return {
            "jobs": [store.job_doc(r) for r in rows],
            "next_cursor": encode_cursor(status, [k.isoformat() if hasattr(k, "isoformat") else k for k in last])
            if last
            else None,
        }

    # -- admin actions ----------------------------------------------------------------------------------

    # `allowed`: the caller's queue regex (None: every queue); a job outside it is not found (app/auth/policy.py).

    async def cancel(self, job_id: int, reason: str | None, allowed: str | None = None) -> Doc:
        if reason is not None:  # stored as last_error: the same rules as a worker's error text
            reason = sanitise_error(reason, self.settings.max_error_bytes)
        async with self.db.connection() as conn:
            found = await store_ops.job_cancel(conn, job_id, reason, allowed)
        if found is None:
            raise JobNotFound()
        changed, row = found
        if not changed:
            raise InvalidState(f"The job is {row[2]}; only pending and running jobs can be cancelled.")
        self.metrics.count("cancelled", row[1])
        return store.job_doc(row)

    async def retry(self, job_id: int, allowed: str | None = None) -> Doc:
        async with self.db.connection() as conn:
            found = await store_ops.job_retry(conn, job_id, allowed)
        if found is None:
            raise JobNotFound()
        changed, row = found
        if not changed:
            raise InvalidState(f"The job is {row[2]}; only failed and cancelled jobs can be retried.")
        self.wake([row[1]])
        return store.job_doc(row)

    async def redrive(self, queue: str, contains: str | None, dry_run: bool, limit: int | None) -> Doc:
        if contains is not None and "\x00" in contains:
            # Stored errors never hold NUL (PostgreSQL text cannot), so nothing matches.
            return {"queue": queue, "dry_run": dry_run, "jobs": 0}
        async with self.db.connection() as conn:
            n = await store_ops.jobs_redrive(conn, queue, contains, dry_run, self.settings.sweep_batch_size, limit)
        if n and not dry_run:
            self.wake([queue])
        return {"queue": queue, "dry_run": dry_run, "jobs": n}

    async def set_paused(self, queue: str, paused: bool) -> Doc:
        async with self.db.connection() as conn:
            await store_ops.queue_set_paused(conn, queue, paused)
        if not paused:
            self.wake([queue])  # waiting workers get what piled up
        return {"queue": queue, "paused": paused}
