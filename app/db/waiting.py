"""Which of the queues this process waits on have a job ready to claim: one statement for all of them.

The fallback poll and the look after a presence announcement (app/core/dispatcher.py) used to run the
claim statement on every queue with a parked claim; with one queue per tenant that is one statement per
tenant per second, whether or not anybody enqueued. They ask this instead, once for every waited queue,
and claim only on the queues it names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import scalar_row

from app.db.distribute import HAS_CITUS

PROBE_BATCH = 5_000  # queues per statement: a pass over more waited queues than this takes a few


def _first_due(queue: str) -> str:
    """Whether `queue` (an SQL expression) has a due pending job: a loose index scan of jobs_claim_idx
    (queue_name, priority DESC, run_at, id). The first entry of each priority level is that level's earliest
    run_at, so a queue has a due job exactly when one of its levels' first entries is due. The recursion steps
    from level to level, one index descent each, and stops at the first due one. `run_at <= now()` as a plain
    condition instead would read every delayed entry sorted before the first due one. Measured on 1,000 waited
    queues over 500,000 jobs, two of the queues holding 100,000 delayed jobs each (one with a ready
    low-priority job below them): 3-5 ms this way, 64 ms that way. An empty queue is one descent finding
    nothing (3 buffer hits). Yields one row when there is one."""
    return f"""
  WITH RECURSIVE heads AS (
    (SELECT priority, run_at FROM jobq.jobs
     WHERE queue_name = {queue} AND status = 'pending'
     ORDER BY priority DESC, run_at
     LIMIT 1)
    UNION ALL
    SELECT below.priority, below.run_at
    FROM heads AS h
    CROSS JOIN LATERAL (
      SELECT priority, run_at FROM jobq.jobs
      WHERE queue_name = {queue} AND status = 'pending' AND priority < h.priority
      ORDER BY priority DESC, run_at
      LIMIT 1
    ) AS below
    WHERE h.run_at > now()  -- this level's first job is not due: look at the next level down
  )
  SELECT FROM heads WHERE run_at <= now() LIMIT 1
"""


QUEUES_READY = f"""
-- The waited queues that have a claimable job now: pending, due, and the queue not paused (a paused
-- queue with a backlog is not kicked every pass; its resume is a wake-up, and a resume whose wake-up was
-- lost is seen by the next pass, as the queue is then no longer paused). Limits are not looked at: a
-- limited queue with ready jobs is named even when its limit holds them back, bounded by the queues that
-- have ready work. The LATERAL (not EXISTS, which the planner may turn into a hash join reading every
-- pending job) keeps it one index probe per queue whatever the statistics say.
SELECT q.name
FROM unnest(%(queues)s::text[]) AS q(name)
CROSS JOIN LATERAL ({_first_due("q.name")}) AS ready
WHERE NOT EXISTS (SELECT FROM jobq.queue_state s WHERE s.queue_name = q.name AND s.paused)
"""

# The same look at one queue, for Citus: there a statement over many queues cannot hold a recursive CTE (it
# would need the queue as a constant), nor a LATERAL with a LIMIT on a list of queues, so each waited queue
# is looked at by a statement of its own, one task on the queue's shard, all of a pass sent at once.
QUEUE_READY = f"""
SELECT %(queue)s::text AS name
FROM ({_first_due("%(queue)s")}) AS ready
WHERE NOT EXISTS (SELECT FROM jobq.queue_state s WHERE s.queue_name = %(queue)s AND s.paused)
"""


async def _per_queue(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether the database is a Citus coordinator (then QUEUE_READY per queue): asked once per database."""
    key = (conn.info.host, conn.info.port, conn.info.dbname)
    if key not in _PER_QUEUE:
        cur = await conn.execute(HAS_CITUS)
        row = await cur.fetchone()
        _PER_QUEUE[key] = bool(row and row[0])
    return _PER_QUEUE[key]


_PER_QUEUE: dict[tuple[str, int, str], bool] = {}


async def queues_ready(conn: psycopg.AsyncConnection[Any], queues: Sequence[str]) -> list[str]:
    """Those of `queues` with a job ready to claim (not paused), in PROBE_BATCH queues a statement (on Citus
    one statement per queue, pipelined)."""
    ready: list[str] = []
    if await _per_queue(conn):
        cur = conn.cursor(row_factory=scalar_row)
        for start in range(0, len(queues), PROBE_BATCH):
            batch = queues[start : start + PROBE_BATCH]
            await cur.executemany(QUEUE_READY, [{"queue": q} for q in batch], returning=True)
            while True:
                ready += await cur.fetchall()
                if not cur.nextset():
                    break
        return ready
    for start in range(0, len(queues), PROBE_BATCH):
        cur = conn.cursor(row_factory=scalar_row)
        await cur.execute(QUEUES_READY, {"queues": list(queues[start : start + PROBE_BATCH])})
        ready += await cur.fetchall()
    return ready
