"""SQL of the quotas an enqueue is held to (app/core/quotas.py): how many jobs of a queue are not yet started,
how many queues are live, and whether one is. Every count stops at the limit it serves, so its cost is that
of min(what there is, the limit) index entries, never of the table."""

from __future__ import annotations

from typing import Any

import psycopg

from app.db import finishing
from app.db.jobs import RUNNING_C
from app.db.operations import NO_SEQSCAN

QUEUE_BACKLOG_COUNT = """
-- Jobs of one queue not yet started, at most %(cap)s of each kind: pending ones (due or delayed) index-only
-- over jobs_claim_idx, those waiting for dependencies over jobs_waiting_idx, each walk stopping at the cap.
SELECT (SELECT count(*) FROM (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending'
                              LIMIT %(cap)s) p)
     + (SELECT count(*) FROM (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'waiting'
                              LIMIT %(cap)s) w)
"""


async def queue_backlog_count(conn: psycopg.AsyncConnection[Any], queue: str, cap: int) -> int:
    """min(jobs not yet started, 2 * cap): enough to tell whether the queue holds `cap` or more."""
    async with conn.transaction():
        await conn.execute(NO_SEQSCAN)
        cur = await conn.execute(QUEUE_BACKLOG_COUNT, {"queue": queue, "cap": cap})
        row = await cur.fetchone()
    return int(row[0]) if row else 0


QUEUE_LIVE = f"""
-- Whether a queue is live: it holds a job not finished yet, or a configuration (paused, limits). One index
-- probe each.
SELECT EXISTS (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending')
    OR EXISTS (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'waiting')
    OR EXISTS (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = {RUNNING_C})
    OR EXISTS (SELECT 1 FROM jobq.queue_state WHERE queue_name = %(queue)s)
"""


async def queue_live(conn: psycopg.AsyncConnection[Any], queue: str) -> bool:
    async with conn.transaction():
        await conn.execute(NO_SEQSCAN)
        cur = await conn.execute(QUEUE_LIVE, {"queue": queue})
        row = await cur.fetchone()
    return bool(row and row[0])


# A spread queue is one queue: its keys (`queue#k`, app/db/spread.py) are walked over, not counted. A walk's `n`:
# the queues it has passed before the name in hand.
_NOT_KEY = "strpos({n}, '#') = 0"
_QUEUE = "(CASE WHEN strpos({n}, '#') = 0 THEN 1 ELSE 0 END)"

QUEUES_LIVE_COUNT = f"""
-- Live queues, at most %(cap)s: the queues with pending, waiting or running jobs by loose scans of
-- jobs_claim_idx, jobs_waiting_idx and jobs_running_idx (one index descent per queue, however long the
-- queue, each walk stopping after %(cap)s queues), and those with a configuration.
WITH RECURSIVE pending(name, n) AS (
  (SELECT queue_name, 0 FROM jobq.jobs WHERE status = 'pending' ORDER BY queue_name LIMIT 1)
  UNION ALL
  SELECT (SELECT queue_name FROM jobq.jobs
          WHERE status = 'pending' AND queue_name > p.name ORDER BY queue_name LIMIT 1),
         p.n + {_QUEUE.format(n="p.name")}
  FROM pending p WHERE p.name IS NOT NULL AND p.n + {_QUEUE.format(n="p.name")} < %(cap)s
), waiting(name, n) AS (
  (SELECT queue_name, 0 FROM jobq.jobs WHERE status = 'waiting' ORDER BY queue_name LIMIT 1)
  UNION ALL
  SELECT (SELECT queue_name FROM jobq.jobs
          WHERE status = 'waiting' AND queue_name > w.name ORDER BY queue_name LIMIT 1),
         w.n + {_QUEUE.format(n="w.name")}
  FROM waiting w WHERE w.name IS NOT NULL AND w.n + {_QUEUE.format(n="w.name")} < %(cap)s
), running(name, n) AS (
  (SELECT queue_name, 0 FROM jobq.jobs WHERE status = {RUNNING_C} ORDER BY queue_name LIMIT 1)
  UNION ALL
  SELECT (SELECT queue_name FROM jobq.jobs WHERE status = {RUNNING_C} AND queue_name > r.name
          ORDER BY queue_name LIMIT 1),
         r.n + {_QUEUE.format(n="r.name")}
  FROM running r WHERE r.name IS NOT NULL AND r.n + {_QUEUE.format(n="r.name")} < %(cap)s
)
SELECT count(*) FROM (
  SELECT name FROM pending WHERE name IS NOT NULL AND {_NOT_KEY.format(n="name")}
  UNION SELECT name FROM waiting WHERE name IS NOT NULL AND {_NOT_KEY.format(n="name")}
  UNION SELECT name FROM running WHERE name IS NOT NULL AND {_NOT_KEY.format(n="name")}
  UNION (SELECT queue_name FROM jobq.queue_state WHERE {_NOT_KEY.format(n="queue_name")}
         ORDER BY queue_name LIMIT %(cap)s)
  LIMIT %(cap)s
) q
"""


# Live queues, at most %(cap)s, where the walk above cannot run: on Citus (a recursive CTE must name one value of
# the distribution column), one read of every shard, each grouping its shard's jobs not yet finished by queue. Not
# on an enqueue's common path: only when a queue this process has not seen live is enqueued to, at most once per
# interval (app/core/quotas.py). It reads every job not yet finished, so PostgreSQL keeps the walk.
QUEUES_LIVE_COUNT_FANOUT = f"""
SELECT count(*) FROM (
  SELECT queue_name FROM (
    SELECT queue_name FROM jobq.jobs WHERE status IN ('pending', 'waiting', 'running') GROUP BY queue_name
    UNION SELECT queue_name FROM jobq.queue_state
  ) u
  WHERE {_NOT_KEY.format(n="queue_name")}
  LIMIT %(cap)s
) q
"""

_walk_refused = False  # the engine refused QUEUES_LIVE_COUNT once (Citus): this process uses the fan-out


async def queues_live_count(conn: psycopg.AsyncConnection[Any], cap: int) -> int:
    """min(live queues, cap)."""
    global _walk_refused
    if not _walk_refused:
        try:
            async with conn.transaction():
                await conn.execute(NO_SEQSCAN)
                cur = await conn.execute(QUEUES_LIVE_COUNT, {"cap": cap})
                row = await cur.fetchone()
            return int(row[0]) if row else 0
        except psycopg.errors.FeatureNotSupported:
            if not finishing.on_citus(conn):  # 0A000 has other causes on plain PostgreSQL: not a refusal
                raise
            _walk_refused = True
    cur = await conn.execute(QUEUES_LIVE_COUNT_FANOUT, {"cap": cap})
    row = await cur.fetchone()
    return int(row[0]) if row else 0
