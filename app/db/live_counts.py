"""Counts of live jobs that do not grow with the backlog (issue 22): what GET /queues/{queue}/stats, GET /queues
and the depth gauges read.

A request counts a queue's live jobs itself, through their partial indexes, but only up to JOBQ_STATS_EXACT_MAX
of each kind (pending, running, waiting, on their last attempts): below it the figures are exact and current. A
kind past it is answered from queue_live_counts, which one replica refreshes for every queue every
JOBQ_LIVE_COUNTS_INTERVAL_SECONDS (app/maintenance/counts.py), and the answer says it is estimated. What the
request reads is then bounded by the cap, whatever the backlog, on a freshly loaded table too (an index-only
scan that must visit the heap visits at most the cap's worth); the full count is the background's, once per
interval for the whole cluster, instead of once per request and per process.

An estimated figure is never below what the request itself saw: its capped read is a lower bound (a queue that
grew past the cap since the last refresh shows at least the cap, not the older, smaller count).

The stats' groups (the TOP_GROUPS groups of a queue with the most ready jobs, with their running jobs) follow the
same rule: the request reads up to the cap of the queue's pending jobs that have a group (jobs_group_idx, in group
order) and of those groups' running jobs (jobs_running_idx); past it, the groups it did not see whole come from
queue_live_groups, each queue's top groups as the same count found them (app/db/operations.py QUEUE_GROUPS)."""

from __future__ import annotations

import time
from typing import Any

import psycopg

from app.db.jobs import RUNNING_C

# The live jobs of every queue by kind, each leg over its own partial index (index-only), added up per queue:
# one GROUP BY on the distribution column, which Citus runs on each shard for its own queues.
_LIVE_BY_QUEUE = f"""
SELECT queue_name, sum(ready)::bigint AS ready, sum(scheduled)::bigint AS scheduled, sum(running)::bigint AS running,
       sum(waiting)::bigint AS waiting, sum(on_last)::bigint AS on_last, sum(one_left)::bigint AS one_left,
       min(oldest_ready) AS oldest_ready
FROM (
  SELECT queue_name, count(*) FILTER (WHERE run_at <= now()) AS ready,
         count(*) FILTER (WHERE run_at > now()) AS scheduled, 0 AS running, 0 AS waiting, 0 AS on_last,
         0 AS one_left, min(run_at) FILTER (WHERE run_at <= now()) AS oldest_ready
  FROM jobq.jobs WHERE status = 'pending' GROUP BY queue_name
  UNION ALL
  SELECT queue_name, 0, 0, count(*), 0, 0, 0, NULL FROM jobq.jobs WHERE status = {RUNNING_C} GROUP BY queue_name
  UNION ALL
  SELECT queue_name, 0, 0, 0, count(*), 0, 0, NULL FROM jobq.jobs WHERE status = 'waiting' GROUP BY queue_name
  UNION ALL
  -- jobs_last_attempts_idx holds exactly these rows.
  SELECT queue_name, 0, 0, 0, 0, count(*) FILTER (WHERE attempts >= max_attempts),
         count(*) FILTER (WHERE attempts = max_attempts - 1), NULL
  FROM jobq.jobs WHERE status IN ('pending', 'running') AND attempts >= max_attempts - 1 GROUP BY queue_name
) k
GROUP BY queue_name
"""


# How old the background's count may be and still stand, without a read, for a kind of a queue's live jobs it found
# past the exact maximum (app/db/operations.py: the stats and GET /queues): three of its intervals, and at least two
# minutes (a count of a big backlog comes only every ten times its duration). An older count (no replica counts:
# JOBQ_LIVE_COUNTS_INTERVAL_SECONDS 0 everywhere, or the counting replica is down) is used only past what the
# request reads itself, so that a drained queue's figures are exact again.
def trusted_seconds(interval: float) -> float:
    return max(120.0, 3 * interval)


# One replica counts at a time: a transaction-scoped advisory lock, tried (a replica that finds it held does not
# wait for another's count). Not a row lock with SKIP LOCKED on the clock: on Citus, writes to a reference table
# are serialised by a lock of Citus's own, which would make the others wait for the whole count.
LIVE_COUNTS_LOCK_KEY = 0x6A6F626C  # beside app/maintenance/vacuum.py's and app/db/schedules.py's keys
LIVE_COUNTS_LOCK = f"SELECT pg_try_advisory_xact_lock({LIVE_COUNTS_LOCK_KEY})"

LIVE_COUNTS_DUE = """
-- Whether a count is due: the last one is older than the interval, or than ten times that count's duration
-- (counting takes at most about a tenth of one core, a count that failed included).
SELECT counted_at <= now() - make_interval(secs => greatest(%(interval)s, 10 * took_seconds))
FROM jobq.live_counts_clock WHERE id
"""

# When and how long: written after the count in the same transaction, or after a count that failed (its time
# spent), so that a count past its statement budget is not tried again at once by every replica.
LIVE_COUNTS_CLOCK = "UPDATE jobq.live_counts_clock SET counted_at = now(), took_seconds = %(took)s WHERE id"

LIVE_COUNTS_WRITE = f"""
-- Every queue's live jobs, as of this transaction's now().
INSERT INTO jobq.queue_live_counts AS l (queue_name, ready, scheduled, running, waiting, on_last, one_left,
                                         oldest_ready, counted_at)
SELECT queue_name, ready, scheduled, running, waiting, on_last, one_left, oldest_ready, now()
FROM ({_LIVE_BY_QUEUE}) v
ON CONFLICT (queue_name) DO UPDATE SET
  ready = EXCLUDED.ready, scheduled = EXCLUDED.scheduled, running = EXCLUDED.running, waiting = EXCLUDED.waiting,
  on_last = EXCLUDED.on_last, one_left = EXCLUDED.one_left, oldest_ready = EXCLUDED.oldest_ready,
  counted_at = EXCLUDED.counted_at
"""

# The groups the stats show (app/db/operations.py QUEUE_GROUPS), and how many the count keeps of each queue: more
# than shown, so that a group just below the shown ones at the count takes its place in the answer when groups
# the request reads whole have shrunk since (the rows are small).
TOP_GROUPS = 20
KEPT_GROUPS = 3 * TOP_GROUPS

LIVE_GROUPS_WRITE = f"""
-- Every queue's {KEPT_GROUPS} groups with the most ready jobs (index-only over jobs_group_idx), with their running
-- jobs (jobs_running_idx), as of this transaction's now(). Ranked per queue, the distribution column: on Citus
-- each shard ranks its own queues.
INSERT INTO jobq.queue_live_groups AS l (queue_name, group_key, ready, running, counted_at)
SELECT t.queue_name, t.group_key, t.ready, coalesce(r.running, 0), now()
FROM (
  SELECT queue_name, group_key, ready,
         row_number() OVER (PARTITION BY queue_name ORDER BY ready DESC, group_key) AS rank
  FROM (
    SELECT queue_name, group_key, count(*) FILTER (WHERE run_at <= now()) AS ready FROM jobq.jobs
    WHERE status = 'pending' AND group_key IS NOT NULL GROUP BY queue_name, group_key
  ) g
  WHERE ready > 0
) t
LEFT JOIN (
  SELECT queue_name, group_key, count(*) AS running FROM jobq.jobs
  WHERE status = {RUNNING_C} AND group_key IS NOT NULL GROUP BY queue_name, group_key
) r ON r.queue_name = t.queue_name AND r.group_key = t.group_key
WHERE t.rank <= {KEPT_GROUPS}
ON CONFLICT (queue_name, group_key) DO UPDATE SET
  ready = EXCLUDED.ready, running = EXCLUDED.running, counted_at = EXCLUDED.counted_at
"""

LIVE_GROUPS_PRUNE = """
-- Groups that are no longer among their queue's top ones, or have no ready job left.
DELETE FROM jobq.queue_live_groups WHERE counted_at < now()
"""

LIVE_COUNTS_PRUNE = """
-- Queues the count just made found without a live job.
DELETE FROM jobq.queue_live_counts WHERE counted_at < now()
"""

# A full count of a big backlog may take longer than a request's statement budget; it runs once per interval for
# the whole cluster.
REFRESH_TIMEOUT = "SET LOCAL statement_timeout = 60000"
NO_SEQSCAN = "SET LOCAL enable_seqscan = off"  # the legs read the partial indexes, never the table's history


async def refresh(conn: psycopg.AsyncConnection[Any], interval: float) -> int | None:
    """Count every queue's live jobs into queue_live_counts and its top groups into queue_live_groups, unless
    another pass (here or on another replica) did within `interval` seconds (or ten times as long as that count
    took) or is counting now. Returns the queues counted, or None when it was not this pass's turn. A count
    cancelled by its statement budget still moves the clock, by the time it spent, and is raised; the groups are
    counted after the queues, in a savepoint of their own, so that their failure leaves the queues' counts."""
    failed: psycopg.Error | None = None
    async with conn.transaction():
        cur = await conn.execute(LIVE_COUNTS_LOCK)
        locked = await cur.fetchone()
        if not (locked and locked[0]):
            return None  # another replica is counting now
        cur = await conn.execute(LIVE_COUNTS_DUE, {"interval": interval})
        due = await cur.fetchone()
        if not (due and due[0]):
            return None
        started = time.monotonic()
        counted = 0
        try:
            async with conn.transaction():  # a savepoint: a cancelled count leaves the clock's update to commit
                await conn.execute(REFRESH_TIMEOUT)
                await conn.execute(NO_SEQSCAN)
                cur = await conn.execute(LIVE_COUNTS_WRITE)
                counted = cur.rowcount
                await conn.execute(LIVE_COUNTS_PRUNE)
        except psycopg.errors.QueryCanceled as exc:
            failed = exc
        if failed is None:
            # The groups in a savepoint of their own, with a budget of their own: the slower of the two counts on a
            # grouped backlog; cut short or refused, it leaves the queues' counts just made to commit (the stats'
            # groups then say the older time, counted_at being the older of the two tables').
            try:
                async with conn.transaction():
                    await conn.execute(REFRESH_TIMEOUT)
                    await conn.execute(NO_SEQSCAN)
                    await conn.execute(LIVE_GROUPS_WRITE)
                    await conn.execute(LIVE_GROUPS_PRUNE)
            except psycopg.Error as exc:
                failed = exc
        await conn.execute(LIVE_COUNTS_CLOCK, {"took": time.monotonic() - started})
    if failed is not None:
        raise failed
    return counted
