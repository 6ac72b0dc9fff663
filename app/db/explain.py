"""Why a job is not running (GET /jobs/{id}/explain): every rule of the claim that holds it right now, read
in one statement made of the claim's own fragments (app/db/claim.py QUEUE_LIMITS, RUNNING_BY_GROUP,
RECENT_CLAIMS, GROUP_RECENT_CLAIMS), so the explanation counts what the claim counts and cannot drift from
it. app/core/explain.py turns the row into reasons.

One queue per statement: JOB_EXPLAIN names the job's queue (known from the read of the job) in every reference
to a table distributed by queue, so that on Citus it runs on that queue's one shard. A waiting job's parents
may be of other queues: JOB_WAITING_FOR reads them one parent queue at a time, the queues taken from the job's
dependency rows (a reference table on Citus, read where the statement runs)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from app.db.claim import GROUP_RECENT_CLAIMS, QUEUE_LIMITS, RECENT_CLAIMS, RUNNING_BY_GROUP
from app.db.jobs import FINISHED_SQL, RUNNING_C
from app.db.rows import rows_of
from app.db.scope import queue_allowed

HELD_BY_LISTED = 100  # ids of the running jobs that fill a limit, at most

JOB_EXPLAIN = f"""
WITH cfg AS ({QUEUE_LIMITS}), stamp AS (
  SELECT clock_timestamp() AS now
), running AS ({RUNNING_BY_GROUP}), recent AS ({RECENT_CLAIMS}), job AS (
  SELECT j.id, j.run_at, j.group_key, j.depends_on FROM jobq.jobs j WHERE j.id = %(id)s AND j.queue_name = %(queue)s
), w AS (
  -- The job's group, under the name the claim's group fragments read (its walk's `w.g`).
  SELECT job.group_key AS g FROM job
), group_recent AS (
  SELECT gr.n, gr.frees_at FROM w CROSS JOIN cfg LEFT JOIN LATERAL ({GROUP_RECENT_CLAIMS}  ) gr ON true
  WHERE w.g IS NOT NULL
), head AS (
  -- An ordered group's turn: its first pending job in the group's order, due or not (as the claim's heads).
  SELECT h.id, h.run_at FROM w CROSS JOIN cfg CROSS JOIN LATERAL (
    SELECT id, run_at FROM jobq.jobs
    WHERE queue_name = %(queue)s AND status = 'pending' AND group_key = w.g
    ORDER BY priority DESC, id LIMIT 1) h
  WHERE cfg.ordered AND w.g IS NOT NULL
)
SELECT cfg.paused, job.run_at > stamp.now AS not_due,
       cfg.concurrency, (SELECT coalesce(sum(n), 0) FROM running)::int AS running,
       ARRAY(SELECT r.id FROM jobq.jobs r WHERE r.queue_name = %(queue)s AND r.status = {RUNNING_C}
             ORDER BY r.id LIMIT {HELD_BY_LISTED}) AS running_ids,
       cfg.rate_limit, cfg.rate_per_seconds, coalesce((SELECT n FROM recent), 0)::int AS recent,
       (SELECT frees_at FROM recent) AS rate_frees_at,
       cfg.group_concurrency, coalesce((SELECT n FROM running r WHERE r.group_key = job.group_key), 0)::int
         AS group_running,
       ARRAY(SELECT r.id FROM jobq.jobs r WHERE r.queue_name = %(queue)s AND r.status = {RUNNING_C}
               AND r.group_key = job.group_key ORDER BY r.id LIMIT {HELD_BY_LISTED}) AS group_running_ids,
       cfg.group_rate_limit, cfg.group_rate_per_seconds,
       coalesce((SELECT n FROM group_recent), 0)::int AS group_recent,
       (SELECT frees_at FROM group_recent) AS group_rate_frees_at,
       cfg.ordered, (SELECT id FROM head) AS head_id
FROM cfg CROSS JOIN stamp CROSS JOIN job
"""


@dataclass(slots=True, frozen=True)
class ExplainRow:
    paused: bool
    not_due: bool
    concurrency: int | None
    running: int  # running jobs of the queue, as the concurrency limit counts them (0 without a limit)
    running_ids: list[int]
    rate_limit: int | None
    rate_per_seconds: int | None
    recent: int  # claims inside the rate window
    rate_frees_at: datetime | None
    group_concurrency: int | None
    group_running: int
    group_running_ids: list[int]
    group_rate_limit: int | None
    group_rate_per_seconds: int | None
    group_recent: int
    group_rate_frees_at: datetime | None
    ordered: bool
    head_id: int | None  # the ordered group's first pending job


async def job_explain(
    conn: psycopg.AsyncConnection[Any], job_id: int, queue: str, allowed: str | None
) -> ExplainRow | None:
    """The claim's rules as they apply to this job now (None: the job is gone, or moved queue)."""
    cur = conn.cursor(row_factory=rows_of(ExplainRow))
    await cur.execute(JOB_EXPLAIN, {"id": job_id, "queue": queue, "allowed": allowed})
    return await cur.fetchone()


# The queues of a waiting job's parents not released yet: its dependency rows (one per parent not finished when
# it was enqueued, consumed once that parent's finish is released). A parent finished and released has none, and
# is not waited for; one finished but not released yet is read, and found finished. Rows a release before
# 1.1 wrote name no queue (NULL): their parents' queues are looked up by id.
JOB_PARENT_QUEUES = """
SELECT d.parent_id, d.parent_queue FROM jobq.job_dependencies d
WHERE d.parent_id = ANY(%(parents)s::bigint[]) AND d.job_id = %(id)s
"""
PARENT_QUEUES_BY_ID = "SELECT id, queue_name FROM jobq.jobs WHERE id = ANY(%(ids)s::bigint[])"

# The jobs it waits for, of one of their queues: its parents not finished yet (of the caller's queues).
JOB_WAITING_FOR = f"""
SELECT p.id FROM jobq.jobs p
WHERE p.queue_name = %(queue)s AND p.id = ANY(%(ids)s::bigint[])
  AND p.status NOT IN {FINISHED_SQL}
  AND {queue_allowed("p.queue_name", "%(allowed)s::text")}
"""


async def job_waiting_for(
    conn: psycopg.AsyncConnection[Any], job_id: int, parents: list[int], allowed: str | None
) -> list[int]:
    """The parents among `parents` (the job's depends_on) that are not finished yet, in id order: one statement
    per queue of theirs (on Citus each goes to that queue's shard)."""
    if not parents:
        return []
    cur = await conn.execute(JOB_PARENT_QUEUES, {"parents": parents, "id": job_id})
    queues: dict[int, str | None] = {int(i): q for i, q in await cur.fetchall()}
    legacy = [i for i, q in queues.items() if q is None]
    if legacy:
        cur = await conn.execute(PARENT_QUEUES_BY_ID, {"ids": legacy})
        queues.update({int(i): str(q) for i, q in await cur.fetchall()})
    by_queue: dict[str, list[int]] = {}
    for parent, queue in queues.items():
        if queue is not None:
            by_queue.setdefault(queue, []).append(parent)
    out: list[int] = []
    for queue in sorted(by_queue):
        cur = await conn.execute(JOB_WAITING_FOR, {"queue": queue, "ids": by_queue[queue], "allowed": allowed})
        out += [int(r[0]) for r in await cur.fetchall()]
    return sorted(out)
