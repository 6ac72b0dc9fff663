"""Reads that may lag a little (stats, listings, search, history, the dashboard): sent to the read replica
(JOBQ_READ_DATABASE_URL) while it is up and within JOBQ_READ_MAX_LAG_SECONDS of the primary, else to the
primary; and which of the two served a request, for its `JOBQ-Served-By` header.

Claims, writes, waits for a result and every read that must see the caller's own write (GET /jobs/{id}
after an enqueue) never come here: they use the primary's pool (app/db/pool.py).

The lag is measured in time, not bytes: once a second the primary's WAL position is sampled and the
replica's replayed position is looked up among the samples, so the lag is how long ago the primary was
where the replica is now (0 when the replica has replayed everything the primary had written a moment
before; a replica whose connection to the primary broke falls behind however quiet it looks)."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import psycopg

from app.db.pool import Database
from app.errors import DatabaseUnavailable, StatementTimeout

log = logging.getLogger("jobq.replica")

T = TypeVar("T")
Server = Literal["primary", "replica"]
Conn = psycopg.AsyncConnection[Any]

SERVED_BY_HEADER = "JOBQ-Served-By"
REPLICA_WAIT_SECONDS = 1.0  # longest wait for a replica connection; then the read goes to the primary

PRIMARY_WAL = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
# On a server that is not a standby (promoted, or not one at all) the replayed position is NULL.
REPLICA_WAL = "SELECT pg_is_in_recovery(), pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0')::bigint"


@dataclass(slots=True)
class Served:
    """Which server the reads of one request went to (None: it made none through Reads)."""

    by: Server | None = None


_served: ContextVar[Served | None] = ContextVar("jobq_served_by", default=None)


@contextmanager
def recording_served() -> Iterator[Served]:
    """Around one request (app/http/served.py): what its reads through Reads were served by."""
    served = Served()
    token = _served.set(served)
    try:
        yield served
    finally:
        _served.reset(token)


def mark_served(by: Server) -> None:
    """Tell the request being recorded that (part of) its answer was read from `by` (a cached answer says
    where it was read)."""
    _mark(by)


def _mark(by: Server) -> None:
    served = _served.get()
    if served is not None and served.by != "primary":  # a request served partly by the primary says so
        served.by = by


def _why(exc: DatabaseUnavailable) -> str:
    """The first line of what psycopg said, else the API error's text."""
    cause = str(exc.__cause__ or "").strip()
    return cause.splitlines()[0] if cause else exc.detail


async def _one(conn: Conn, statement: str) -> tuple[Any, ...]:
    cur = await conn.execute(statement)
    row = await cur.fetchone()
    assert row is not None
    return tuple(row)


def lag_seconds(samples: deque[tuple[float, int]], replayed: int, now: float) -> float:
    """How long ago the primary was at `replayed`, from (monotonic time, WAL position) samples, oldest first:
    interpolated between the last sample the replica has reached and the next one; at least the age of the
    oldest sample when it has reached none."""
    if not samples or replayed >= samples[-1][1]:
        return 0.0
    later = samples[-1]
    for sample in reversed(samples):
        if sample[1] <= replayed:
            (t0, p0), (t1, p1) = sample, later
            at = t0 if p1 == p0 else t0 + (t1 - t0) * (replayed - p0) / (p1 - p0)
            return max(0.0, now - at)
        later = sample
    return max(0.0, now - samples[0][0])


@dataclass(slots=True)
class ReplicaState:
    serving: bool = False  # reads go to the replica now
    lag_seconds: float | None = None  # None: unknown (never checked, or the replica is down)
    reason: str | None = "not checked yet"  # why reads go to the primary, when they do


class Reads:
    """Runs reads on the replica when it may, else on the primary. Without a replica, on the primary."""

    def __init__(self, primary: Database, replica: Database | None, max_lag: float) -> None:
        self.primary = primary
        self.replica = replica
        self.max_lag = max_lag
        self.state = ReplicaState()
        self._samples: deque[tuple[float, int]] = deque()
        self._keep = max(2 * max_lag, 10.0)

    async def open(self) -> None:
        if self.replica is not None:
            await self.replica.pool.open(wait=False)  # a replica down at start must not hold the service back

    async def close(self) -> None:
        if self.replica is not None:
            await self.replica.close()

    async def run(self, read: Callable[[Conn], Awaitable[T]]) -> T:
        """`read` on the replica when it serves; on the primary when it does not, or when it fails there
        (read again from the start: a read changes nothing)."""
        if self.replica is not None and self.state.serving:
            try:
                async with self.replica.connection(timeout=REPLICA_WAIT_SECONDS) as conn:
                    result = await read(conn)
                _mark("replica")
                return result
            except StatementTimeout:
                raise  # slow, not down: the primary would be as slow, and busier
            except DatabaseUnavailable as exc:
                self._down("the replica is unavailable (a read failed there)", _why(exc))
        async with self.primary.connection() as conn:
            result = await read(conn)
        _mark("primary")
        return result

    async def check(self) -> None:
        """Measure the replica's lag and decide whether it serves (app/maintenance/replica.py, every second)."""
        if self.replica is None:
            return
        now = time.monotonic()
        try:
            async with self.primary.connection() as conn:
                written = await _one(conn, PRIMARY_WAL)
        except DatabaseUnavailable:
            self._down("the primary is unavailable: the replica's lag is unknown")
            return
        self._samples.append((now, int(written[0])))
        while self._samples and self._samples[0][0] < now - self._keep:
            self._samples.popleft()
        try:
            async with self.replica.connection(timeout=REPLICA_WAIT_SECONDS) as conn:
                in_recovery, replayed = await _one(conn, REPLICA_WAL)
        except DatabaseUnavailable as exc:
            self._down("the replica is unavailable", _why(exc))
            return
        if not in_recovery or replayed is None:
            self._down("the read replica is not a standby (promoted?): reads stay on the primary")
            return
        lag = lag_seconds(self._samples, int(replayed), time.monotonic())
        self.state.lag_seconds = round(lag, 3)
        serving = lag <= self.max_lag
        if serving != self.state.serving:
            log.info("reads go to the %s (replica lag %.1fs)", "replica" if serving else "primary", lag)
        self.state.serving = serving
        self.state.reason = None if serving else f"the replica is {lag:.1f}s behind (most: {self.max_lag:g}s)"

    def _down(self, reason: str, detail: str | None = None) -> None:
        """`reason` is shown (/readyz is open to anyone: no host names there), `detail` only logged."""
        if self.state.serving or self.state.reason != reason:
            log.warning("reads go to the primary: %s%s", reason, f" ({detail})" if detail else "")
        self.state.serving, self.state.lag_seconds, self.state.reason = False, None, reason

    def document(self) -> dict[str, Any] | None:
        """What the stats show (None without a replica)."""
        if self.replica is None:
            return None
        return {
            "serving": self.state.serving,
            "lag_seconds": self.state.lag_seconds,
            "max_lag_seconds": self.max_lag,
            "reason": self.state.reason,
        }
