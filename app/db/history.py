"""SQL of the statistics' history: the backlog sampled once a minute for the whole cluster, minutes rolled
up into hours after a day, and the series the dashboard draws (per queue, all queues, sparklines).

A series is cut into equal buckets aligned to multiples of their length since the epoch, the last one
holding now. Each bucket adds up the rows that fall in it, minute rows and hour rows alike: an hour that
a roll-up has half moved still counts once. The backlog of a bucket is the average of its sampled
minutes (stats_samples); a bucket with none has no backlog figure rather than a made-up zero."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from app.db.rows import rows_of
from app.db.scope import queue_allowed
from app.db.spread_reads import add_histograms
from app.observability.metrics import DURATION_BOUNDS_MS

MINUTES_KEEP_SECONDS = 86_400  # minute rows older than this (rounded down to the hour) become hour rows
HOURS_KEEP_SECONDS = 8 * 86_400  # hour rows and sampled minutes: a week of charts, and a day to spare

NOW = "coalesce(%(now)s::timestamptz, now())"  # tests move time forward instead of waiting
HISTOGRAM_BUCKETS = len(DURATION_BOUNDS_MS) + 1


def histogram_sum(column: str) -> str:
    """The element-wise sum of a group's histograms, one aggregate per bucket: a single pass over the rows,
    where unnesting them would make a row per bucket of every histogram first. Empty histograms ('{}',
    a minute without completions) add nothing; a group without any gives '{}'."""
    parts = ", ".join(f"coalesce(sum({column}[{i}]), 0)" for i in range(1, HISTOGRAM_BUCKETS + 1))
    return f"CASE WHEN max(cardinality({column})) > 0 THEN ARRAY[{parts}]::bigint[] ELSE '{{}}' END"


# --- the backlog sample ----------------------------------------------------------------------------------

# Two statements in one transaction: the minute claimed, then its samples written. On Citus the claim writes the
# reference table stats_samples (one statement), and the write is one INSERT ... SELECT that each shard runs on
# its own queues (grouped by the distribution column: pushed down whole, nothing through the coordinator). It
# spans queues by design: it is the once-a-minute look at every queue's backlog, taken by one replica.
BACKLOG_MARK = f"""
-- The once-per-minute claim: one replica's INSERT wins; the others wait for it, then insert nothing (and
-- write no sample).
INSERT INTO jobq.stats_samples (minute) VALUES (date_trunc('minute', {NOW}))
ON CONFLICT DO NOTHING
RETURNING minute
"""

BACKLOG_WRITE = f"""
-- Index-only over jobs_claim_idx: each queue's ready jobs and the age of its oldest, filed under the minute
-- just claimed.
INSERT INTO jobq.queue_stats AS s (queue_name, minute, ready, oldest_ready_seconds)
SELECT j.queue_name, %(minute)s::timestamptz, count(*), extract(epoch FROM {NOW} - min(j.run_at))::float8
FROM jobq.jobs j
WHERE j.status = 'pending' AND j.run_at <= {NOW}
GROUP BY j.queue_name
-- Rows in the order the flush takes them (app/db/operations.py STATS_ADD): no deadlock between the two.
ORDER BY j.queue_name COLLATE "C"
ON CONFLICT (queue_name, minute) DO UPDATE
  SET ready = EXCLUDED.ready, oldest_ready_seconds = EXCLUDED.oldest_ready_seconds
"""


@dataclass(slots=True, frozen=True)
class Sampled:
    """sampled: this call took the minute (1) or found it taken (0); queues: samples it wrote."""

    sampled: int
    queues: int


async def backlog_sample(conn: psycopg.AsyncConnection[Any], now: datetime | None = None) -> Sampled:
    async with conn.transaction():
        cur = await conn.execute(BACKLOG_MARK, {"now": now})
        mark = await cur.fetchone()
        if mark is None:
            return Sampled(0, 0)
        # Counts of live jobs read the partial index, never the table (app/db/operations.py NO_SEQSCAN).
        await conn.execute("SET LOCAL enable_seqscan = off")
        cur = await conn.execute(BACKLOG_WRITE, {"now": now, "minute": mark[0]})
        return Sampled(1, max(cur.rowcount, 0))


# --- roll-up and pruning ----------------------------------------------------------------------------------

COUNTERS = (
    "enqueued", "claimed", "completed", "failed", "retried", "lease_expired", "cancelled", "released", "empty_claims",
)  # fmt: skip


def _added(column: str) -> str:
    return f"{column} = h.{column} + EXCLUDED.{column}"


HISTORY_CUTOFFS = f"""
-- Where a retention pass rolls up and deletes, by the database clock, read once per pass: the statements
-- after it take these as parameters (on Citus, a DELETE takes no now() inside a coalesce).
SELECT date_trunc('hour', {NOW} - make_interval(secs => %(minutes_keep)s)) AS minutes_before,
       {NOW} - make_interval(secs => %(hours_keep)s) AS hours_before
"""

STATS_OLD_QUEUES = """
-- The queues with minute rows to roll up (queue_stats_minute_idx) or hour rows to delete, other than those in
-- `skip` (done in this pass): among the oldest `scan` of each. A read, no lock; on Citus it goes to every shard,
-- once per look (the retention pass's look over all queues), and each queue is then done on its own shard.
SELECT queue_name FROM (
  SELECT queue_name FROM jobq.queue_stats
  WHERE minute < %(minutes_before)s AND queue_name <> ALL(%(skip)s::text[])
  ORDER BY minute
  LIMIT %(scan)s
) m
UNION
SELECT queue_name FROM (
  SELECT queue_name FROM jobq.queue_stats_hourly
  WHERE hour < %(hours_before)s AND queue_name <> ALL(%(skip)s::text[])
  ORDER BY hour
  LIMIT %(scan)s
) h
"""

# One queue's roll-up, a batch at a time, three statements in one transaction (each on the queue's shard on
# Citus, where a modifying CTE feeding an INSERT would go through the coordinator): the minutes taken, added to
# their hours, deleted.
STATS_MINUTES_TAKE = """
-- The queue's minutes before the hour that began a day ago, oldest first, locked until they are moved. SKIP
-- LOCKED: a row a late flush is adding to is left for the next pass, which also moves any minute a flush adds
-- after its hour was rolled up, so the hours stay exact.
SELECT minute FROM jobq.queue_stats
WHERE queue_name = %(queue)s AND minute < %(before)s
ORDER BY minute
LIMIT %(batch)s
FOR UPDATE SKIP LOCKED
"""

STATS_HOURS_ADD = f"""
INSERT INTO jobq.queue_stats_hourly AS h (queue_name, hour, {", ".join(COUNTERS)}, duration_max_ms, durations_ms,
                                     ready_sum, oldest_ready_seconds)
SELECT s.queue_name, date_trunc('hour', s.minute) AS hour, {", ".join(f"sum(s.{c})::bigint" for c in COUNTERS)},
       max(s.duration_max_ms), {histogram_sum("s.durations_ms")}, sum(coalesce(s.ready, 0))::bigint,
       max(s.oldest_ready_seconds)
FROM jobq.queue_stats s
WHERE s.queue_name = %(queue)s AND s.minute = ANY(%(minutes)s::timestamptz[])
GROUP BY 1, 2
ORDER BY 2
ON CONFLICT (queue_name, hour) DO UPDATE SET
  {", ".join(_added(c) for c in COUNTERS)},
  duration_max_ms = greatest(h.duration_max_ms, EXCLUDED.duration_max_ms),
  durations_ms = coalesce((SELECT array_agg(coalesce(a, 0) + coalesce(b, 0) ORDER BY i)
                           FROM unnest(h.durations_ms, EXCLUDED.durations_ms) WITH ORDINALITY AS x(a, b, i)), '{{}}'),
  ready_sum = h.ready_sum + EXCLUDED.ready_sum,
  oldest_ready_seconds = greatest(h.oldest_ready_seconds, EXCLUDED.oldest_ready_seconds)
"""

STATS_MINUTES_DELETE = """
DELETE FROM jobq.queue_stats WHERE queue_name = %(queue)s AND minute = ANY(%(minutes)s::timestamptz[])
"""

HOURS_DELETE_OLD = "DELETE FROM jobq.queue_stats_hourly WHERE queue_name = %(queue)s AND hour < %(before)s"

# The sampled minutes are one clock for every queue (a reference table on Citus: one statement).
SAMPLES_DELETE_OLD = "DELETE FROM jobq.stats_samples WHERE minute < %(before)s"


@dataclass(slots=True, frozen=True)
class Cutoffs:
    minutes_before: datetime  # minute rows before this are rolled up into hours
    hours_before: datetime  # hour rows and sampled minutes before this are deleted


async def history_cutoffs(conn: psycopg.AsyncConnection[Any], now: datetime | None = None) -> Cutoffs:
    cur = conn.cursor(row_factory=rows_of(Cutoffs))
    params = {"now": now, "minutes_keep": MINUTES_KEEP_SECONDS, "hours_keep": HOURS_KEEP_SECONDS}
    await cur.execute(HISTORY_CUTOFFS, params)
    row = await cur.fetchone()
    assert row is not None
    return row


async def stats_old_queues(
    conn: psycopg.AsyncConnection[Any], cutoffs: Cutoffs, skip: Sequence[str], scan: int
) -> list[str]:
    params = {
        "minutes_before": cutoffs.minutes_before,
        "hours_before": cutoffs.hours_before,
        "skip": list(skip),
        "scan": scan,
    }
    cur = await conn.execute(STATS_OLD_QUEUES, params)
    return sorted(str(r[0]) for r in await cur.fetchall())


async def stats_roll_up(conn: psycopg.AsyncConnection[Any], queue: str, before: datetime, batch: int) -> int:
    """Move one batch of one queue's minute rows before `before` into hour rows; returns the minutes moved."""
    async with conn.transaction():
        cur = await conn.execute(STATS_MINUTES_TAKE, {"queue": queue, "before": before, "batch": batch})
        minutes = [r[0] for r in await cur.fetchall()]
        if minutes:
            await conn.execute(STATS_HOURS_ADD, {"queue": queue, "minutes": minutes})
            await conn.execute(STATS_MINUTES_DELETE, {"queue": queue, "minutes": minutes})
    return len(minutes)


async def history_delete_old(conn: psycopg.AsyncConnection[Any], queue: str, before: datetime) -> None:
    """One queue's hour rows before `before` deleted."""
    await conn.execute(HOURS_DELETE_OLD, {"queue": queue, "before": before})


async def samples_delete_old(conn: psycopg.AsyncConnection[Any], before: datetime) -> None:
    await conn.execute(SAMPLES_DELETE_OLD, {"before": before})


# --- series ---------------------------------------------------------------------------------------------------

# The first bucket's start and the statement's now; %(bucket)s seconds long, %(buckets)s of them.
_BOUNDS = """
bounds AS (
  SELECT to_timestamp((floor(extract(epoch FROM now()) / %(bucket)s) - (%(buckets)s - 1)) * %(bucket)s) AS since,
         now() AS as_of
)"""


def _bucket(column: str) -> str:
    return f"floor(extract(epoch FROM {column} - b.since) / %(bucket)s)::int"


def _series(which: str) -> str:
    """The series of one queue (`which` = "queue": the primary key's range) or of every queue the caller
    may see ("all": queue_stats_minute_idx)."""
    mine = (
        "{t}.queue_name = %(queue)s"
        if which == "queue"
        else queue_allowed("{t}.queue_name", "%(allowed)s::text")  # the caller's queues
    )
    return f"""
WITH {_BOUNDS}, sources AS (
  SELECT s.minute AS at, s.enqueued, s.completed, s.failed, s.duration_max_ms, s.durations_ms,
         coalesce(s.ready, 0) AS ready, s.oldest_ready_seconds
  FROM jobq.queue_stats s, bounds b
  WHERE {mine.format(t="s")} AND s.minute >= b.since
  UNION ALL
  SELECT h.hour, h.enqueued, h.completed, h.failed, h.duration_max_ms, h.durations_ms, h.ready_sum,
         h.oldest_ready_seconds
  FROM jobq.queue_stats_hourly h, bounds b
  WHERE {mine.format(t="h")} AND h.hour >= b.since
), binned AS (
  SELECT {_bucket("r.at")} AS i, r.* FROM sources r, bounds b
), totals AS (
  SELECT i, sum(enqueued)::bigint AS enqueued, sum(completed)::bigint AS completed, sum(failed)::bigint AS failed,
         max(duration_max_ms) FILTER (WHERE completed > 0) AS duration_max_ms,
         {histogram_sum("durations_ms")} AS durations_ms, sum(ready)::bigint AS ready_sum,
         max(oldest_ready_seconds) AS oldest_ready_seconds
  FROM binned GROUP BY i
), sampled AS (
  SELECT {_bucket("m.minute")} AS i, count(*) AS minutes
  FROM jobq.stats_samples m, bounds b WHERE m.minute >= b.since GROUP BY 1
)
SELECT g.i AS bucket, b.since + make_interval(secs => g.i * %(bucket)s) AS at,
       coalesce(t.enqueued, 0) AS enqueued, coalesce(t.completed, 0) AS completed, coalesce(t.failed, 0) AS failed,
       t.duration_max_ms, t.durations_ms, coalesce(s.minutes, 0) AS sampled, coalesce(t.ready_sum, 0) AS ready_sum,
       t.oldest_ready_seconds, b.as_of
FROM bounds b
CROSS JOIN generate_series(0, %(buckets)s - 1) AS g(i)
LEFT JOIN totals t ON t.i = g.i
LEFT JOIN sampled s ON s.i = g.i
ORDER BY g.i
"""


SERIES_QUEUE = _series("queue")
SERIES_ALL = _series("all")


@dataclass(slots=True, frozen=True)
class BucketRow:
    """One bucket of a series: its event counts, its claim-to-completion histogram, and its backlog
    samples (`sampled` minutes whose ready counts add up to `ready_sum`)."""

    bucket: int
    at: datetime
    enqueued: int
    completed: int
    failed: int
    duration_max_ms: float | None
    durations_ms: list[int] | None
    sampled: int
    ready_sum: int
    oldest_ready_seconds: float | None
    as_of: datetime


async def series(
    conn: psycopg.AsyncConnection[Any], names: Sequence[str] | None, allowed: str | None, bucket: int, buckets: int
) -> list[BucketRow]:
    """The buckets of one queue's series (`names`: the names it keeps its statistics under, its own first, then a
    spread queue's other keys, app/db/spread.py), or (None) of every queue matching `allowed` (None: all)."""
    cur = conn.cursor(row_factory=rows_of(BucketRow))
    params = {"queue": None, "allowed": allowed, "bucket": bucket, "buckets": buckets}
    if names is None:
        await cur.execute(SERIES_ALL, params)
        return await cur.fetchall()
    keys: list[list[BucketRow]] = []
    async with conn.transaction():  # one now(): every key's buckets are the same
        for queue in names:
            await cur.execute(SERIES_QUEUE, {**params, "queue": queue})
            keys.append(await cur.fetchall())
    return keys[0] if len(keys) == 1 else [_keys_added(same) for same in zip(*keys, strict=True)]


def _keys_added(rows: Sequence[BucketRow]) -> BucketRow:
    """One bucket of a spread queue from its keys' (app/db/spread_reads.py): events and backlog summed, histograms
    bucket by bucket, the longest duration and the oldest ready job the largest of any key."""
    longest = [r.duration_max_ms for r in rows if r.duration_max_ms is not None]
    oldest = [r.oldest_ready_seconds for r in rows if r.oldest_ready_seconds is not None]
    return dataclasses.replace(
        rows[0],
        enqueued=sum(r.enqueued for r in rows),
        completed=sum(r.completed for r in rows),
        failed=sum(r.failed for r in rows),
        duration_max_ms=max(longest) if longest else None,
        durations_ms=add_histograms(r.durations_ms for r in rows),
        ready_sum=sum(r.ready_sum for r in rows),
        oldest_ready_seconds=max(oldest) if oldest else None,
    )


# The queues a page of sparklines shows: those with statistics in the range that the caller may see, after
# %(after)s by name, among %(queues)s when given (NULL: any), at most %(n)s. A spread queue's keys (`queue#k`,
# app/db/spread.py) are read as the queue: its line adds them up.
_QUEUE_OF = "split_part({t}.queue_name, '#', 1)"
_SPARKLINE_QUEUES = f"""
  (%(queues)s::text[] IS NULL OR {{q}} = ANY(%(queues)s::text[])) AND {{q}} > %(after)s::text
  AND {queue_allowed("{q}", "%(allowed)s::text")}"""

SPARKLINES = f"""
WITH {_BOUNDS}, names AS (
  SELECT queue_name FROM (
    SELECT {_QUEUE_OF.format(t="s")} AS queue_name FROM jobq.queue_stats s, bounds b
    WHERE s.minute >= b.since AND {_SPARKLINE_QUEUES.format(q=_QUEUE_OF.format(t="s"))}
    UNION
    SELECT {_QUEUE_OF.format(t="h")} FROM jobq.queue_stats_hourly h, bounds b
    WHERE h.hour >= b.since AND {_SPARKLINE_QUEUES.format(q=_QUEUE_OF.format(t="h"))}
  ) u
  ORDER BY queue_name
  LIMIT %(n)s
), sources AS (
  SELECT {_QUEUE_OF.format(t="s")} AS queue_name, s.minute AS at, s.enqueued, s.completed, s.failed,
         coalesce(s.ready, 0) AS ready
  FROM jobq.queue_stats s, bounds b
  WHERE s.minute >= b.since AND {_QUEUE_OF.format(t="s")} IN (SELECT queue_name FROM names)
  UNION ALL
  SELECT {_QUEUE_OF.format(t="h")}, h.hour, h.enqueued, h.completed, h.failed, h.ready_sum
  FROM jobq.queue_stats_hourly h, bounds b
  WHERE h.hour >= b.since AND {_QUEUE_OF.format(t="h")} IN (SELECT queue_name FROM names)
)
SELECT r.queue_name AS queue, {_bucket("r.at")} AS bucket, sum(r.enqueued)::bigint AS enqueued,
       sum(r.completed)::bigint AS completed, sum(r.failed)::bigint AS failed, sum(r.ready)::bigint AS ready_sum
FROM sources r, bounds b
GROUP BY 1, 2
ORDER BY 1, 2
"""

SAMPLED_MINUTES = f"""
WITH {_BOUNDS}
SELECT {_bucket("m.minute")} AS bucket, count(m.minute) AS minutes, min(b.since) AS since, min(b.as_of) AS as_of
FROM bounds b LEFT JOIN jobq.stats_samples m ON m.minute >= b.since
GROUP BY 1
"""


@dataclass(slots=True, frozen=True)
class QueueBucketRow:
    queue: str
    bucket: int
    enqueued: int
    completed: int
    failed: int
    ready_sum: int


@dataclass(slots=True, frozen=True)
class SampledRow:
    """Sampled minutes per bucket (bucket None: the window has none), and the window's frame."""

    bucket: int | None
    minutes: int
    since: datetime
    as_of: datetime


async def sparklines(
    conn: psycopg.AsyncConnection[Any],
    allowed: str | None,
    bucket: int,
    buckets: int,
    queues: list[str] | None = None,
    after: str | None = None,
    limit: int = 1000,
) -> tuple[list[SampledRow], list[QueueBucketRow]]:
    """Per queue and bucket, the non-empty buckets of at most `limit` queues (among `queues` when given,
    after `after` by name); and the sampled minutes per bucket. One transaction, so both statements see the
    same now()."""
    params = {
        "allowed": allowed,
        "bucket": bucket,
        "buckets": buckets,
        "queues": queues,
        "after": after or "",
        "n": limit,
    }
    frame = conn.cursor(row_factory=rows_of(SampledRow))
    per_queue = conn.cursor(row_factory=rows_of(QueueBucketRow))
    async with conn.transaction():
        await frame.execute(SAMPLED_MINUTES, params)
        await per_queue.execute(SPARKLINES, params)
        return await frame.fetchall(), await per_queue.fetchall()
