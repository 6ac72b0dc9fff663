"""The scaling signal of a queue (GET /queues/{queue}/scale, the jobq_queue_claimable_jobs gauge): how many
more jobs a claim could take right now under the queue's limits, its jobs in flight and the age of its oldest
ready job, in one statement whose cost does not grow with the backlog.

It reads the limits, the running jobs and the rate window with the claim's own fragments (app/db/claim.py
QUEUE_LIMITS, RUNNING_BY_GROUP, RECENT_CLAIMS), so that it counts what the claim counts. The ready jobs are
counted up to `cap` (a signal for an autoscaler, not an inventory): per priority level, through
jobs_claim_idx, whose order within a level puts due jobs before the others, so each level is one short
index range; the oldest ready job is each level's first. A queue with group limits adds, per group (walked
one index probe each through jobs_group_idx, up to `groups` of them), the due jobs its group room lets
through, as the claim's walk does."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from app.db.claim import QUEUE_LIMITS, RECENT_CLAIMS, RUNNING_BY_GROUP
from app.db.jobs import RUNNING_C
from app.db.rows import rows_of


def _due_in_level(p: str, left: str) -> str:
    """Due jobs of priority level `p`, counted up to `left`: one index range of jobs_claim_idx."""
    return f"""(SELECT count(*) FROM (
      SELECT 1 FROM jobq.jobs
      WHERE queue_name = %(queue)s AND status = 'pending' AND priority = {p} AND run_at <= stamp.now
      -- In the index's order: with stale statistics, a LIMIT alone may look cheapest as a sequential scan.
      ORDER BY priority DESC, run_at, id
      LIMIT greatest({left}, 0)) d)"""


def _let_through(g: str) -> str:
    """Due jobs group `g` lets a claim take now: up to its room, as the claim computes it (its concurrency
    limit less its running jobs, its rate limit less its recent claims, one at a time when ordered), in the
    group's order; an ordered group only when its first pending job is due (a job waiting for its retry holds
    the group back)."""
    return f"""(SELECT count(*) FILTER (WHERE h.run_at <= stamp.now) FROM (
      SELECT run_at FROM jobq.jobs
      WHERE queue_name = %(queue)s AND status = 'pending' AND group_key = {g}
        AND (cfg.ordered OR run_at <= stamp.now)
      ORDER BY priority DESC, id
      LIMIT greatest(0, least(%(cap)s::int,
        cfg.group_concurrency - coalesce((SELECT r.n FROM running r WHERE r.group_key = {g}), 0)::int,
        cfg.group_rate_limit - coalesce((
          SELECT sum(c.n) FROM jobq.queue_claims c
          WHERE c.queue_name = %(queue)s AND c.group_key = {g} AND cfg.group_rate_limit IS NOT NULL
            AND c.claimed_at > stamp.now - make_interval(secs => cfg.group_rate_per_seconds)), 0)::int,
        CASE WHEN cfg.ordered THEN 1 END))) h)"""


QUEUE_SCALE = f"""
WITH RECURSIVE cfg AS ({QUEUE_LIMITS}), stamp AS (
  SELECT clock_timestamp() AS now
), running AS ({RUNNING_BY_GROUP}), recent AS ({RECENT_CLAIMS}), levels(p, first_run, k, acc) AS (
  -- The queue's priority levels with pending jobs, highest first (a loose scan of jobs_claim_idx, one probe
  -- per level, at most %(levels)s), each level's earliest run_at, and the due jobs so far, counted up to
  -- `cap` in all: within a level the due jobs come first in the index, so each count is one short range.
  SELECT f.priority, f.run_at, 1, {_due_in_level("f.priority", "%(cap)s")}
  FROM stamp CROSS JOIN LATERAL (
    SELECT priority, run_at FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending'
    ORDER BY priority DESC, run_at, id LIMIT 1) f
  UNION ALL
  SELECT x.priority, x.run_at, l.k + 1, l.acc + {_due_in_level("x.priority", "%(cap)s - l.acc")}
  FROM levels l CROSS JOIN stamp CROSS JOIN LATERAL (
    SELECT priority, run_at FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending' AND priority < l.p
    ORDER BY priority DESC, run_at, id LIMIT 1) x
  WHERE l.k < %(levels)s
), ready AS (
  SELECT coalesce(max(l.acc), 0)::int AS n,
         coalesce(max(l.acc), 0) >= %(cap)s OR count(*) >= %(levels)s AS capped,
         min(l.first_run) FILTER (WHERE l.first_run <= stamp.now) AS oldest
  FROM levels l CROSS JOIN stamp
  GROUP BY stamp.now
), rooms AS (
  -- What each queue-wide limit alone lets through, as the claim's `room`; `bound`: the least of them.
  SELECT r.n AS ready, r.capped, r.oldest,
         cfg.concurrency - (SELECT coalesce(sum(n), 0) FROM running)::int AS by_concurrency,
         cfg.rate_limit - coalesce((SELECT n FROM recent), 0)::int AS by_rate
  FROM cfg CROSS JOIN (SELECT * FROM ready UNION ALL SELECT 0, false, NULL WHERE NOT EXISTS (SELECT FROM ready)) r
), bound AS (
  SELECT greatest(0, least(ready, by_concurrency, by_rate)) AS n FROM rooms
), lane AS (
  -- Group limits: jobs without a group are held back by none; those among the first `bound` ready jobs.
  SELECT count(*) FILTER (WHERE w.group_key IS NULL)::int AS n FROM stamp CROSS JOIN LATERAL (
    SELECT group_key FROM jobq.jobs
    WHERE queue_name = %(queue)s AND status = 'pending' AND run_at <= stamp.now AND (SELECT grouped FROM cfg)
    ORDER BY priority DESC, run_at, id
    LIMIT (SELECT n FROM bound)) w
), walk(g, k, acc) AS (
  -- Then every group with pending jobs, once, in key order (as the claim's walk), adding what each lets
  -- through, until that covers `bound` (more would change nothing) or %(groups)s groups were seen.
  SELECT f.g, 1, {_let_through("f.g")}
  FROM cfg CROSS JOIN stamp CROSS JOIN LATERAL (
    SELECT group_key AS g FROM jobq.jobs
    WHERE queue_name = %(queue)s AND status = 'pending' AND group_key IS NOT NULL
    ORDER BY group_key LIMIT 1) f
  WHERE cfg.grouped AND (SELECT n FROM bound) > (SELECT n FROM lane)
  UNION ALL
  SELECT x.g, w.k + 1, w.acc + {_let_through("x.g")}
  FROM walk w CROSS JOIN cfg CROSS JOIN stamp CROSS JOIN LATERAL (
    SELECT group_key AS g FROM jobq.jobs
    WHERE queue_name = %(queue)s AND status = 'pending' AND group_key > w.g
    ORDER BY group_key LIMIT 1) x
  WHERE w.k < %(groups)s AND w.acc < (SELECT n FROM bound) - (SELECT n FROM lane)
)
SELECT cfg.paused, rooms.ready, rooms.capped OR (SELECT count(*) >= %(groups)s FROM walk) AS capped,
       extract(epoch FROM stamp.now - rooms.oldest)::float8 AS oldest_ready_age,
       -- Every running job of the queue (jobs_running_idx), whether or not a limit counts them.
       (SELECT count(*) FROM jobq.jobs WHERE queue_name = %(queue)s AND status = {RUNNING_C})::int AS running,
       cfg.concurrency, cfg.rate_limit, cfg.rate_per_seconds,
       rooms.by_concurrency AS room_concurrency, rooms.by_rate AS room_rate,
       CASE WHEN cfg.grouped THEN (SELECT n FROM lane) + coalesce((SELECT max(acc) FROM walk), 0)::int END
         AS room_groups
FROM cfg CROSS JOIN stamp CROSS JOIN rooms
"""

# Priority levels and groups looked at, at most: past them the figures are lower bounds (`capped`).
LEVELS = 100
GROUPS = 1000


@dataclass(slots=True, frozen=True)
class ScaleRow:
    paused: bool
    ready: int  # due jobs, counted up to the cap
    capped: bool  # the count stopped at a bound: there may be more
    oldest_ready_age: float | None
    running: int
    concurrency: int | None
    rate_limit: int | None
    rate_per_seconds: int | None
    room_concurrency: int | None  # what each limit alone would let a claim take now (None: no such limit)
    room_rate: int | None
    room_groups: int | None


async def queue_scale(conn: psycopg.AsyncConnection[Any], names: Sequence[str], cap: int) -> ScaleRow:
    """The signal of the queue kept under `names`: its own name, then a spread queue's other keys (app/db/spread.py),
    each read by its own statement (one shard on Citus) and added up."""
    cur = conn.cursor(row_factory=rows_of(ScaleRow))
    rows = []
    for queue in names:
        await cur.execute(QUEUE_SCALE, {"queue": queue, "cap": cap, "levels": LEVELS, "groups": GROUPS})
        row = await cur.fetchone()
        assert row is not None  # one row always (cfg has one)
        rows.append(row)
    return rows[0] if len(rows) == 1 else _added(rows, cap)


def _added(rows: Sequence[ScaleRow], cap: int) -> ScaleRow:
    """A spread queue's signal from its keys': ready and running jobs summed (the ready up to `cap`), the oldest
    ready job the oldest of any key. A spread queue has no limits (app/core/flow.py check), so the limits and their
    rooms are key 0's, which holds the queue's configuration (as every key does) and its pause."""
    ready = sum(r.ready for r in rows)
    ages = [r.oldest_ready_age for r in rows if r.oldest_ready_age is not None]
    return dataclasses.replace(
        rows[0],
        ready=min(ready, cap),
        capped=ready >= cap or any(r.capped for r in rows),
        oldest_ready_age=max(ages) if ages else None,
        running=sum(r.running for r in rows),
    )


QUEUES_HELD = """
-- Queues whose claims something may hold back (limits, or paused): the others can claim every ready job.
SELECT queue_name FROM jobq.queue_state WHERE limited OR paused
"""


async def queues_held(conn: psycopg.AsyncConnection[Any]) -> set[str]:
    cur = await conn.execute(QUEUES_HELD)
    return {r[0] for r in await cur.fetchall()}
