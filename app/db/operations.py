"""SQL for operators' reads: the statistics flush, queue statistics, the queue list and job listings
(keyset pagination). Guarded writes are app/db/admin.py, retention and vacuum app/db/retention.py."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from app.db import finishing
from app.db.jobs import JOB_COLUMNS, RUNNING_C, as_json
from app.db.live_counts import TOP_GROUPS
from app.db.pool import Database
from app.db.rows import (
    FINISHED,
    GroupsRow,
    JobRow,
    QueueRow,
    QueueStatsRow,
    Status,
    rows_of,
)
from app.db.scale import LEVELS
from app.db.spread import key_names, logical
from app.db.spread_reads import add_groups, add_queue_rows, add_stats, merge_pages

# --- statistics -------------------------------------------------------------------------------------------

STATS_ADD = """
-- Add one process's counts since its last flush (a second ago) to the current minute; concurrent flushes
-- from replicas add up. The minute is the database's: an API host whose clock is off files nothing under
-- a minute that the windows of /stats, which read now(), would never look at.
INSERT INTO jobq.queue_stats AS s (queue_name, minute, enqueued, claimed, completed, failed, retried, lease_expired,
                              cancelled, released, empty_claims, duration_max_ms, durations_ms, held_concurrency,
                              held_rate, held_group_concurrency, held_group_rate, held_ordered)
SELECT queue_name, date_trunc('minute', now()), enqueued, claimed, completed, failed, retried, lease_expired,
       cancelled, released, empty_claims, duration_max_ms, durations_ms, held_concurrency, held_rate,
       held_group_concurrency, held_group_rate, held_ordered
FROM json_to_recordset(%(rows)s::json) AS t(queue_name text, enqueued bigint, claimed bigint,
     completed bigint, failed bigint, retried bigint, lease_expired bigint, cancelled bigint, released bigint,
     empty_claims bigint, duration_max_ms float8, durations_ms bigint[], held_concurrency bigint,
     held_rate bigint, held_group_concurrency bigint, held_group_rate bigint, held_ordered bigint)
-- Rows in one global order, as the backlog sample (app/db/history.py) takes them: flushes of several
-- replicas, and a flush beside a sample, update the same rows without waiting on each other in a cycle.
-- (One flush files every row under the same minute: the queue name is the whole order.)
ORDER BY queue_name COLLATE "C"
ON CONFLICT (queue_name, minute) DO UPDATE SET
  held_concurrency = s.held_concurrency + EXCLUDED.held_concurrency,
  held_rate = s.held_rate + EXCLUDED.held_rate,
  held_group_concurrency = s.held_group_concurrency + EXCLUDED.held_group_concurrency,
  held_group_rate = s.held_group_rate + EXCLUDED.held_group_rate,
  held_ordered = s.held_ordered + EXCLUDED.held_ordered,
  enqueued = s.enqueued + EXCLUDED.enqueued,
  claimed = s.claimed + EXCLUDED.claimed,
  completed = s.completed + EXCLUDED.completed,
  failed = s.failed + EXCLUDED.failed,
  retried = s.retried + EXCLUDED.retried,
  lease_expired = s.lease_expired + EXCLUDED.lease_expired,
  cancelled = s.cancelled + EXCLUDED.cancelled,
  released = s.released + EXCLUDED.released,
  empty_claims = s.empty_claims + EXCLUDED.empty_claims,
  duration_max_ms = greatest(s.duration_max_ms, EXCLUDED.duration_max_ms),
  durations_ms = (SELECT array_agg(coalesce(a, 0) + coalesce(b, 0) ORDER BY i)
                  FROM unnest(s.durations_ms, EXCLUDED.durations_ms) WITH ORDINALITY AS x(a, b, i))
"""


async def stats_add(conn: psycopg.AsyncConnection[Any], rows: list[dict[str, Any]]) -> None:
    await conn.execute(STATS_ADD, {"rows": as_json(rows)})


def stats_writer(db: Database) -> Callable[[list[dict[str, Any]]], Awaitable[None]]:
    """What Metrics.flush writes its rows with: one connection and one statement per flush."""

    async def write(rows: list[dict[str, Any]]) -> None:
        async with db.connection() as conn:
            await stats_add(conn, rows)

    return write


# The live counts of one queue, each read up to %(over)s rows (JOBQ_STATS_EXACT_MAX + 1), so that what a request
# reads does not grow with the backlog (app/db/live_counts.py): a kind that reaches it is answered from the
# background's count, never below what was seen. The oldest ready job is exact whatever the backlog: the first
# job of each priority level (a loose scan of jobs_claim_idx, one probe per level) is that level's earliest.
_LIVE_ONE_QUEUE = f"""
estimate AS (
  -- The background's count (one row or none: max() makes it one row of nulls). A kind it found past the exact
  -- maximum is not read again here (the read would stop at the maximum anyway: GET /queues does the same); the
  -- others are counted up to it.
  SELECT max(ready) AS ready, max(scheduled) AS scheduled, max(running) AS running, max(waiting) AS waiting,
         max(on_last) AS on_last, max(one_left) AS one_left, max(oldest_ready) AS oldest_ready,
         max(counted_at) AS counted_at
  FROM jobq.queue_live_counts WHERE queue_name = %(queue)s
), trusted AS (
  -- The count when it is recent enough to stand for a kind without a read (live_counts.trusted_seconds); none
  -- otherwise.
  SELECT * FROM estimate WHERE counted_at > now() - make_interval(secs => %(trust)s::float8)
), pending AS (
  -- Index-only over jobs_claim_idx, in its order: ready vs scheduled among the first %(over)s pending jobs.
  SELECT count(*) AS n, count(*) FILTER (WHERE run_at <= now()) AS ready,
         count(*) FILTER (WHERE run_at > now()) AS scheduled,
         coalesce((SELECT ready + scheduled FROM trusted) > %(over)s - 1, false) AS big
  FROM (SELECT run_at FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending'
          AND coalesce((SELECT ready + scheduled FROM trusted) <= %(over)s - 1, true)
        ORDER BY priority DESC, run_at, id LIMIT %(over)s) s
), levels(p, first_run, k) AS (
  SELECT f.priority, f.run_at, 1 FROM (
    SELECT priority, run_at FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending'
    ORDER BY priority DESC, run_at, id LIMIT 1) f
  UNION ALL
  SELECT x.priority, x.run_at, l.k + 1 FROM levels l CROSS JOIN LATERAL (
    SELECT priority, run_at FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending' AND priority < l.p
    ORDER BY priority DESC, run_at, id LIMIT 1) x
  WHERE l.k <= {LEVELS}
), oldest AS (
  -- Past {LEVELS} levels (the walk looks at one more to know), the background's figure may be older still.
  SELECT min(first_run) FILTER (WHERE first_run <= now()) AS ready_at, count(*) > {LEVELS} AS partial FROM levels
), running AS (
  SELECT count(*) AS n, coalesce((SELECT running FROM trusted) > %(over)s - 1, false) AS big
  FROM (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = {RUNNING_C}
          AND coalesce((SELECT running FROM trusted) <= %(over)s - 1, true)
        LIMIT %(over)s) s
), waiting AS (
  -- Index-only over jobs_waiting_idx: jobs waiting for their dependencies.
  SELECT count(*) AS n, coalesce((SELECT waiting FROM trusted) > %(over)s - 1, false) AS big
  FROM (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'waiting'
          AND coalesce((SELECT waiting FROM trusted) <= %(over)s - 1, true)
        ORDER BY id LIMIT %(over)s) s
), last_attempts AS (
  -- jobs_last_attempts_idx holds exactly these rows.
  SELECT count(*) AS n, count(*) FILTER (WHERE attempts >= max_attempts) AS on_last,
         count(*) FILTER (WHERE attempts = max_attempts - 1) AS one_left,
         coalesce((SELECT on_last + one_left FROM trusted) > %(over)s - 1, false) AS big
  FROM (SELECT attempts, max_attempts FROM jobq.jobs
        WHERE queue_name = %(queue)s AND status IN ('pending', 'running') AND attempts >= max_attempts - 1
          AND coalesce((SELECT on_last + one_left FROM trusted) <= %(over)s - 1, true)
        LIMIT %(over)s) s
), live AS (
  SELECT CASE WHEN p.big THEN e.ready WHEN p.n < %(over)s THEN p.ready ELSE greatest(e.ready, p.ready) END AS ready,
         CASE WHEN p.big THEN e.scheduled WHEN p.n < %(over)s THEN p.scheduled
              ELSE greatest(e.scheduled, p.scheduled) END AS scheduled,
         CASE WHEN o.partial THEN least(o.ready_at, e.oldest_ready) ELSE o.ready_at END AS oldest_ready,
         CASE WHEN r.big THEN e.running WHEN r.n < %(over)s THEN r.n ELSE greatest(e.running, r.n) END AS running,
         CASE WHEN w.big THEN e.waiting WHEN w.n < %(over)s THEN w.n ELSE greatest(e.waiting, w.n) END AS waiting,
         CASE WHEN l.big THEN e.on_last WHEN l.n < %(over)s THEN l.on_last ELSE greatest(e.on_last, l.on_last)
         END AS on_last,
         CASE WHEN l.big THEN e.one_left WHEN l.n < %(over)s THEN l.one_left ELSE greatest(e.one_left, l.one_left)
         END AS one_left,
         p.big OR r.big OR w.big OR l.big OR greatest(p.n, r.n, w.n, l.n) >= %(over)s OR o.partial AS estimated,
         e.counted_at
  FROM estimate e, pending p, oldest o, running r, waiting w, last_attempts l
)"""

QUEUE_STATS = f"""
WITH RECURSIVE {_LIVE_ONE_QUEUE}, finished AS (
  -- Kept exact by the statements that finish jobs (see app/db/jobs.py count_finished): no scan of history.
  SELECT coalesce(sum(n) FILTER (WHERE status = 'completed'), 0) AS completed,
         coalesce(sum(n) FILTER (WHERE status = 'failed'), 0) AS failed,
         coalesce(sum(n) FILTER (WHERE status = 'cancelled'), 0) AS cancelled
  FROM jobq.queue_counts WHERE queue_name = %(queue)s
), window_ AS (
  SELECT coalesce(sum(enqueued), 0) AS enqueued, coalesce(sum(claimed), 0) AS claimed,
         coalesce(sum(completed), 0) AS completed, coalesce(sum(failed), 0) AS failed,
         coalesce(sum(retried), 0) AS retried, coalesce(sum(lease_expired), 0) AS lease_expired,
         coalesce(sum(cancelled), 0) AS cancelled, coalesce(sum(released), 0) AS released,
         coalesce(sum(empty_claims), 0) AS empty_claims,
         coalesce(sum(held_concurrency), 0) AS held_concurrency, coalesce(sum(held_rate), 0) AS held_rate,
         coalesce(sum(held_group_concurrency), 0) AS held_group_concurrency,
         coalesce(sum(held_group_rate), 0) AS held_group_rate, coalesce(sum(held_ordered), 0) AS held_ordered,
         max(duration_max_ms) AS duration_max_ms,
         (SELECT array_agg(total ORDER BY i) FROM (
            SELECT i, sum(v)::bigint AS total
            FROM jobq.queue_stats q2, unnest(q2.durations_ms) WITH ORDINALITY AS u(v, i)
            WHERE q2.queue_name = %(queue)s AND q2.minute > now() - make_interval(secs => %(window)s)
            GROUP BY i) h) AS durations_ms
  FROM jobq.queue_stats
  WHERE queue_name = %(queue)s AND minute > now() - make_interval(secs => %(window)s)
)
SELECT v.ready, v.scheduled, extract(epoch FROM now() - v.oldest_ready)::float8 AS oldest_ready_age,
       v.running, f.completed::bigint, f.failed::bigint, f.cancelled::bigint, v.on_last, v.one_left,
       w.enqueued::bigint AS w_enqueued, w.claimed::bigint AS w_claimed, w.completed::bigint AS w_completed,
       w.failed::bigint AS w_failed, w.retried::bigint AS w_retried, w.lease_expired::bigint AS w_lease_expired,
       w.cancelled::bigint AS w_cancelled, w.released::bigint AS w_released,
       w.empty_claims::bigint AS w_empty_claims, w.duration_max_ms AS w_duration_max_ms,
       w.durations_ms AS w_durations_ms,
       coalesce((SELECT paused FROM jobq.queue_state WHERE queue_name = %(queue)s), false) AS paused,
       now() AS as_of,
       w.held_concurrency::bigint AS w_held_concurrency, w.held_rate::bigint AS w_held_rate,
       w.held_group_concurrency::bigint AS w_held_group_concurrency,
       w.held_group_rate::bigint AS w_held_group_rate, w.held_ordered::bigint AS w_held_ordered,
       v.waiting, v.estimated, v.counted_at
FROM live v, finished f, window_ w
"""

# A queue's groups with the most ready jobs, with their running jobs: like the counts above, read up to %(over)s
# jobs (JOBQ_STATS_EXACT_MAX + 1) of each kind, and past it answered from the background's top groups
# (app/db/live_counts.py LIVE_GROUPS_WRITE), marked estimated. The pending jobs that have a group are read in
# jobs_group_idx's order, group after group: when the read stops at the maximum, every group before the last one
# it reached was seen whole, and its figure is exact and current; the others are the background's, never below
# what the read saw. (The maximum counts pending jobs, due or not: run_at is the index's last key, so a read of
# due jobs only could not stop at a number of entries.)
QUEUE_GROUPS = f"""
-- The queue's %(top)s groups with the most ready jobs and their running jobs, each kind read up to %(over)s jobs.
WITH seen AS (
  -- Index-only over jobs_group_idx, in its order: the first %(over)s pending jobs that have a group.
  SELECT group_key, run_at FROM jobq.jobs
  WHERE queue_name = %(queue)s AND status = 'pending' AND group_key IS NOT NULL
  ORDER BY group_key
  LIMIT %(over)s
), span AS (
  -- whole: every such job was read; else the groups before `last` were.
  SELECT count(*) < %(over)s AS whole, max(group_key) AS last FROM seen
), counted AS (
  SELECT group_key, count(*) FILTER (WHERE run_at <= now()) AS ready FROM seen GROUP BY group_key
), estimate AS (
  -- The background's top groups of the queue, from its last count.
  SELECT group_key, ready, running, counted_at FROM jobq.queue_live_groups WHERE queue_name = %(queue)s
), top AS (
  SELECT m.group_key, m.ready, m.estimated_running FROM (
    SELECT coalesce(c.group_key, e.group_key) AS group_key, e.running AS estimated_running,
           CASE WHEN s.whole OR coalesce(c.group_key, e.group_key) < s.last THEN coalesce(c.ready, 0)
                ELSE greatest(c.ready, e.ready) END AS ready
    FROM counted c FULL JOIN estimate e ON e.group_key = c.group_key CROSS JOIN span s
  ) m
  WHERE m.ready > 0
  ORDER BY m.ready DESC, m.group_key
  LIMIT %(top)s
), running AS (
  -- Index-only over jobs_running_idx: the running jobs of those groups, up to %(over)s in all.
  SELECT group_key FROM jobq.jobs
  WHERE queue_name = %(queue)s AND status = {RUNNING_C}
    AND group_key = ANY (ARRAY(SELECT group_key FROM top))
  LIMIT %(over)s
), listed AS (
  SELECT t.group_key, t.ready,
         CASE WHEN (SELECT count(*) FROM running) < %(over)s THEN coalesce(r.n, 0)
              ELSE greatest(coalesce(r.n, 0), t.estimated_running) END AS running
  FROM top t LEFT JOIN (SELECT group_key, count(*) AS n FROM running GROUP BY group_key) r
    ON r.group_key = t.group_key
)
SELECT coalesce((SELECT json_agg(json_build_object('group', group_key, 'ready', ready, 'running', running)
                                 ORDER BY ready DESC, group_key) FROM listed), '[]') AS groups,
       NOT s.whole OR (SELECT count(*) FROM running) >= %(over)s AS estimated,
       -- The background's count that wrote the estimate: queue_live_counts is written in the same transaction, and
       -- tells when a queue without a ready group was counted; the older one if they differ (the groups' part of
       -- a count failed, leaving the groups as they were).
       least((SELECT min(counted_at) FROM estimate),
             (SELECT counted_at FROM jobq.queue_live_counts WHERE queue_name = %(queue)s)) AS counted_at
FROM span s
"""


# Counts of live jobs read the partial indexes, whose size is the backlog, never the table with all its
# history: with statistics older than the rows, the planner can take a table of finished jobs for a
# table of pending ones and prefer a sequential scan. These statements run with sequential scans off.
NO_SEQSCAN = "SET LOCAL enable_seqscan = off"


async def queue_stats(
    conn: psycopg.AsyncConnection[Any], names: Sequence[str], window_seconds: int, exact_max: int, trust: float
) -> tuple[QueueStatsRow, GroupsRow]:
    """A queue's stats; its live jobs counted up to `exact_max` of each kind, and its top groups read up to as
    many (past it: the background's count). `names`: the names it keeps jobs under, the queue's own first (a
    spread queue's keys, app/db/spread.py), each read on its own (one shard on Citus) in one transaction, and
    added up (app/db/spread_reads.py)."""
    cur = conn.cursor(row_factory=rows_of(QueueStatsRow))
    groups = conn.cursor(row_factory=rows_of(GroupsRow))
    rows: list[QueueStatsRow] = []
    tops: list[GroupsRow] = []
    async with conn.transaction():
        await conn.execute(NO_SEQSCAN)
        for queue in names:
            await cur.execute(
                QUEUE_STATS, {"queue": queue, "window": window_seconds, "over": exact_max + 1, "trust": trust}
            )
            row = await cur.fetchone()
            await groups.execute(QUEUE_GROUPS, {"queue": queue, "top": TOP_GROUPS, "over": exact_max + 1})
            top = await groups.fetchone()
            assert row is not None and top is not None
            rows.append(row)
            tops.append(top)
    if len(rows) == 1:
        return rows[0], tops[0]
    return add_stats(rows), add_groups(tops, TOP_GROUPS)


# A stored name that is a queue, not key 1 or later of a spread queue (`queue#k`, app/db/spread.py): the queue
# listings show a spread queue once, under its own name, its keys' counts added to it (queues_page).
_NOT_KEY = "strpos({n}, '#') = 0"


# A row of a queue listing (QueueRow) from the CTEs pending, running, waiting, finished, queue_state s and the
# names n, every count exact (QUEUES_PAGE_FANOUT).
def _queue_row(name: str) -> str:
    return f"""SELECT n.{name} AS queue, coalesce(p.ready, 0) AS ready, coalesce(p.scheduled, 0) AS scheduled,
       coalesce(r.running, 0) AS running, coalesce(f.completed, 0)::bigint AS completed,
       coalesce(f.failed, 0)::bigint AS failed, coalesce(f.cancelled, 0)::bigint AS cancelled,
       extract(epoch FROM now() - p.oldest_ready)::float8 AS oldest_ready_age,
       coalesce(s.paused, false) AS paused, coalesce(w.waiting, 0) AS waiting,
       false AS estimated, NULL::timestamptz AS counted_at, coalesce(s.keys_used, 1)::int AS keys_used"""


def _names(walk: str, source: str, where: str, column: str = "queue_name") -> str:
    """A loose index scan of `source` (one index descent per queue name, however many rows it has): the
    names after %(after)s in order, walked until %(n)s of them are queues the caller may see (a spread queue's
    keys are walked over, not counted)."""
    step = f"SELECT {column} FROM {source} WHERE {where} AND {column} > {{prev}} ORDER BY {column} LIMIT 1"
    return f"""(
  SELECT ({step.format(prev="%(after)s::text")}), 0
  UNION ALL
  SELECT ({step.format(prev="w.name")}),
         w.seen + (CASE WHEN {_NOT_KEY.format(n="w.name")} AND (%(allowed)s::text IS NULL OR w.name ~ %(allowed)s::text)
                        THEN 1 ELSE 0 END)
  FROM {walk} w WHERE w.name IS NOT NULL AND w.seen < %(n)s
)"""


# A row of GET /queues (QueueRow) for each name of a CTE `names` (QUEUES_PAGE, QUEUES_NAMED).
_QUEUES_ROWS = f"""
SELECT n.name AS queue,
       CASE WHEN p.big THEN e.ready WHEN p.n < x.over THEN p.ready ELSE greatest(e.ready, p.ready) END AS ready,
       CASE WHEN p.big THEN e.scheduled WHEN p.n < x.over THEN p.scheduled ELSE greatest(e.scheduled, p.scheduled)
       END AS scheduled,
       CASE WHEN r.big THEN e.running WHEN r.n < x.over THEN r.n ELSE greatest(e.running, r.n) END AS running,
       coalesce(f.completed, 0)::bigint AS completed, coalesce(f.failed, 0)::bigint AS failed,
       coalesce(f.cancelled, 0)::bigint AS cancelled,
       extract(epoch FROM now() - CASE WHEN p.big OR p.n >= x.over THEN least(e.oldest_ready, p.oldest_ready)
                                       ELSE p.oldest_ready END)::float8 AS oldest_ready_age,
       coalesce((SELECT s.paused FROM jobq.queue_state s WHERE s.queue_name = n.name), false) AS paused,
       CASE WHEN w.big THEN e.waiting WHEN w.n < x.over THEN w.n ELSE greatest(e.waiting, w.n) END AS waiting,
       p.big OR r.big OR w.big OR greatest(p.n, r.n, w.n) >= x.over AS estimated,
       CASE WHEN p.big OR r.big OR w.big OR greatest(p.n, r.n, w.n) >= x.over THEN e.counted_at END AS counted_at,
       coalesce((SELECT s.keys_used FROM jobq.queue_state s WHERE s.queue_name = n.name), 1)::int AS keys_used
FROM names n
-- The background's count of the queue (app/db/live_counts.py): a kind it found past the exact maximum is not
-- read again here (each such read would stop at the maximum anyway); the others are counted up to it.
LEFT JOIN jobq.queue_live_counts e ON e.queue_name = n.name
-- A queue the background has not counted (new, or empty at its last count) is read up to the whole maximum: such
-- queues are few, and a small share of it could take a few high-priority jobs due later for all there is.
CROSS JOIN LATERAL (SELECT CASE WHEN e.queue_name IS NULL THEN %(over_new)s::int ELSE %(over)s::int END AS over,
                           -- recent enough to stand for a kind without a read (live_counts.trusted_seconds)
                           coalesce(e.counted_at > now() - make_interval(secs => %(trust)s::float8), false) AS fresh) x
CROSS JOIN LATERAL (
  -- Index-only over jobs_claim_idx, in its order: ready vs scheduled among the first x.over pending jobs.
  SELECT count(*) AS n, count(*) FILTER (WHERE j.run_at <= now()) AS ready,
         count(*) FILTER (WHERE j.run_at > now()) AS scheduled,
         min(j.run_at) FILTER (WHERE j.run_at <= now()) AS oldest_ready,
         coalesce(x.fresh AND e.ready + e.scheduled > x.over - 1, false) AS big
  FROM (SELECT j.run_at FROM jobq.jobs j WHERE j.queue_name = n.name AND j.status = 'pending'
          AND coalesce(NOT x.fresh OR e.ready + e.scheduled <= x.over - 1, true)
        ORDER BY j.priority DESC, j.run_at, j.id LIMIT x.over) j
) p
CROSS JOIN LATERAL (
  SELECT count(*) AS n, coalesce(x.fresh AND e.running > x.over - 1, false) AS big
  FROM (SELECT 1 FROM jobq.jobs j WHERE j.queue_name = n.name AND j.status = {RUNNING_C}
          AND coalesce(NOT x.fresh OR e.running <= x.over - 1, true) LIMIT x.over) j
) r
CROSS JOIN LATERAL (
  SELECT count(*) AS n, coalesce(x.fresh AND e.waiting > x.over - 1, false) AS big
  FROM (SELECT 1 FROM jobq.jobs j WHERE j.queue_name = n.name AND j.status = 'waiting'
          AND coalesce(NOT x.fresh OR e.waiting <= x.over - 1, true) ORDER BY j.id LIMIT x.over) j
) w
LEFT JOIN LATERAL (
  SELECT sum(c.n) FILTER (WHERE c.status = 'completed') AS completed,
         sum(c.n) FILTER (WHERE c.status = 'failed') AS failed,
         sum(c.n) FILTER (WHERE c.status = 'cancelled') AS cancelled
  FROM jobq.queue_counts c WHERE c.queue_name = n.name
) f ON true
ORDER BY n.name
"""


# A page of GET /queues: the names (every queue with a job not finished, a finished-job counter or a
# configuration), then the counts of those only. Each source is walked by its own index, stopping once it
# has given a page of names the caller may see; a key's queues are chosen here, not after, so that every
# page is full and its cursor is a name the key may see.
QUEUES_PAGE = f"""
WITH RECURSIVE
  pending_walk(name, seen) AS {_names("pending_walk", "jobq.jobs", "status = 'pending'")},
  waiting_walk(name, seen) AS {_names("waiting_walk", "jobq.jobs", "status = 'waiting'")},
  running_walk(name, seen) AS {_names("running_walk", "jobq.jobs", f"status = {RUNNING_C}")},
  finished_walk(name, seen) AS {_names("finished_walk", "jobq.queue_counts", "true")},
  names AS (
    SELECT name FROM (
      SELECT name FROM pending_walk UNION SELECT name FROM waiting_walk UNION SELECT name FROM running_walk
      UNION SELECT name FROM finished_walk
      UNION (SELECT queue_name FROM jobq.queue_state
             WHERE queue_name > %(after)s::text AND (%(allowed)s::text IS NULL OR queue_name ~ %(allowed)s::text)
               AND {_NOT_KEY.format(n="queue_name")}
             ORDER BY queue_name LIMIT %(n)s)
    ) u
    WHERE name IS NOT NULL AND (%(allowed)s::text IS NULL OR name ~ %(allowed)s::text) AND {_NOT_KEY.format(n="name")}
    ORDER BY name
    LIMIT %(n)s
  )
{_QUEUES_ROWS}"""

# The rows of GET /queues for the names %(names)s: the keys of the spread queues of a page (queues_page).
QUEUES_NAMED = f"""
WITH names AS (SELECT unnest(%(names)s::text[]) AS name)
{_QUEUES_ROWS}"""


# The exact counts of the names of a CTE `names`, as rows of GET /queues (QueueRow): QUEUES_PAGE_FANOUT,
# QUEUES_NAMED_FANOUT.
_QUEUES_COUNTED = f"""pending AS (
  SELECT queue_name, count(*) FILTER (WHERE run_at <= now()) AS ready,
         count(*) FILTER (WHERE run_at > now()) AS scheduled,
         min(run_at) FILTER (WHERE run_at <= now()) AS oldest_ready
  FROM jobq.jobs WHERE status = 'pending' AND queue_name IN (SELECT name FROM names) GROUP BY queue_name
), running AS (
  SELECT queue_name, count(*) AS running FROM jobq.jobs
  WHERE status = {RUNNING_C} AND queue_name IN (SELECT name FROM names) GROUP BY queue_name
), waiting AS (
  SELECT queue_name, count(*) AS waiting FROM jobq.jobs
  WHERE status = 'waiting' AND queue_name IN (SELECT name FROM names) GROUP BY queue_name
), finished AS (
  SELECT queue_name, sum(n) FILTER (WHERE status = 'completed') AS completed,
         sum(n) FILTER (WHERE status = 'failed') AS failed,
         sum(n) FILTER (WHERE status = 'cancelled') AS cancelled
  FROM jobq.queue_counts WHERE queue_name IN (SELECT name FROM names) GROUP BY queue_name
)
{_queue_row("name")}
FROM names n
LEFT JOIN pending p ON p.queue_name = n.name
LEFT JOIN running r ON r.queue_name = n.name
LEFT JOIN waiting w ON w.queue_name = n.name
LEFT JOIN finished f ON f.queue_name = n.name
LEFT JOIN jobq.queue_state s ON s.queue_name = n.name
ORDER BY n.name
"""

# A page of GET /queues where the walks above cannot run: on Citus (a recursive CTE must name one value of the
# distribution column), the page's names by one read of every shard, each grouping its jobs not yet finished and
# its finished-job counters by queue, then QUEUES_LIST's counts for those names only. It reads every job not yet
# finished, so PostgreSQL keeps the walks.
QUEUES_PAGE_FANOUT = f"""
WITH names AS (
  SELECT name FROM (
    SELECT queue_name AS name FROM jobq.jobs
    WHERE status IN ('pending', 'waiting', 'running') AND queue_name > %(after)s::text GROUP BY queue_name
    UNION SELECT queue_name FROM jobq.queue_counts WHERE queue_name > %(after)s::text GROUP BY queue_name
    UNION SELECT queue_name FROM jobq.queue_state WHERE queue_name > %(after)s::text
  ) u
  WHERE (%(allowed)s::text IS NULL OR name ~ %(allowed)s::text) AND {_NOT_KEY.format(n="name")}
  ORDER BY name
  LIMIT %(n)s
), {_QUEUES_COUNTED}"""

# QUEUES_NAMED where QUEUES_PAGE_FANOUT serves the pages (Citus).
QUEUES_NAMED_FANOUT = f"""
WITH names AS (SELECT unnest(%(names)s::text[]) AS name), {_QUEUES_COUNTED}"""


_walks_refused = False  # the engine refused QUEUES_PAGE once (Citus): this process uses the fan-out


def page_exact_max(exact_max: int, limit: int) -> int:
    """Live jobs of a kind a page of `limit` queues counts per queue: `exact_max` shared among the page's queues, so
    that a page reads about `exact_max` of each kind in all however many queues it holds (1,000 queues of 3,000
    jobs are 3,000,000 otherwise), and at least 10 per queue unless `exact_max` is less."""
    return min(exact_max, max(10, exact_max // max(limit, 1)))


async def queues_page(
    conn: psycopg.AsyncConnection[Any], allowed: str | None, after: str | None, limit: int, exact_max: int, trust: float
) -> tuple[list[QueueRow], str | None]:
    """At most `limit` queues the caller may see, by name, after `after`; and the last name when there are
    more. Each queue's live jobs are counted up to page_exact_max() of each kind (past it: the background's
    count)."""
    global _walks_refused
    cur = conn.cursor(row_factory=rows_of(QueueRow))
    params = {
        "after": after or "",
        "allowed": allowed,
        "n": limit + 1,
        "over": page_exact_max(exact_max, limit) + 1,
        "over_new": exact_max + 1,
        "trust": trust,
    }
    rows: list[QueueRow] | None = None
    if not _walks_refused:
        try:
            async with conn.transaction():
                await conn.execute(NO_SEQSCAN)
                await cur.execute(QUEUES_PAGE, params)
                rows = await cur.fetchall()
        except psycopg.errors.FeatureNotSupported:
            if not finishing.on_citus(conn):  # 0A000 has other causes on plain PostgreSQL: not a refusal
                raise
            _walks_refused = True
    if rows is None:
        await cur.execute(QUEUES_PAGE_FANOUT, params)
        rows = await cur.fetchall()
    last = rows[limit - 1].queue if len(rows) > limit else None
    rows = rows[:limit]
    if any(r.keys_used > 1 for r in rows):
        rows = await _with_keys(conn, rows, params)
    return rows, last


async def _with_keys(
    conn: psycopg.AsyncConnection[Any], rows: list[QueueRow], params: dict[str, Any]
) -> list[QueueRow]:
    """The page's spread queues with their keys' counts added (the page names a spread queue once, by its own name:
    its keys are read here, by one more statement for the whole page)."""
    keys = [k for r in rows if r.keys_used > 1 for k in key_names(r.queue, r.keys_used)[1:]]
    cur = conn.cursor(row_factory=rows_of(QueueRow))
    if finishing.on_citus(conn):
        await cur.execute(QUEUES_NAMED_FANOUT, {**params, "names": keys})
    else:
        async with conn.transaction():
            await conn.execute(NO_SEQSCAN)
            await cur.execute(QUEUES_NAMED, {**params, "names": keys})
    by_queue: dict[str, list[QueueRow]] = {}
    for k in await cur.fetchall():
        by_queue.setdefault(logical(k.queue), []).append(k)
    return [add_queue_rows(r, by_queue[r.queue]) if r.queue in by_queue else r for r in rows]


async def all_queues(
    conn: psycopg.AsyncConnection[Any], exact_max: int, trust: float, page: int = 1000
) -> list[QueueRow]:
    """Every queue, as GET /queues's pages give them (the depth gauges)."""
    rows: list[QueueRow] = []
    after: str | None = None
    if finishing.on_citus(conn):
        page = 1_000_000  # each page there reads every shard's live jobs (QUEUES_PAGE_FANOUT): one page, one read
    while True:
        got, last = await queues_page(conn, None, after, page, exact_max, trust)
        rows.extend(got)
        if last is None:
            return rows
        after = last


# --- listing (keyset pagination: a cursor, never an offset) ------------------------------------------------

# Each status is listed in the order its own index keeps, so every page is an index range scan and a
# page never shifts when jobs are inserted or change state elsewhere in the list. A listing is its WHERE
# (the cursor's keyset condition included) and its ORDER BY; search (app/db/search.py) walks the same.


@dataclass(frozen=True, slots=True)
class Listing:
    where: str
    order: str
    keys: tuple[str, ...]  # the sort key, in order: a page's cursor holds the last row's (JobRow fields)


LISTINGS: dict[str | None, Listing] = {
    Status.pending: Listing(
        """j.queue_name = %(queue)s AND j.status = 'pending'
  AND (%(after)s::boolean IS NOT TRUE
       OR j.priority < %(k1)s::int
       OR (j.priority = %(k1)s::int AND (j.run_at, j.id) > (%(k2)s::timestamptz, %(k3)s::bigint)))""",
        "j.priority DESC, j.run_at, j.id",
        ("priority", "run_at", "id"),
    ),
    # Waiting for dependencies: oldest first, through jobs_waiting_idx.
    Status.waiting: Listing(
        """j.queue_name = %(queue)s AND j.status = 'waiting'
  AND (%(after)s::boolean IS NOT TRUE OR j.id > %(k1)s::bigint)""",
        "j.id",
        ("id",),
    ),
    Status.running: Listing(
        """j.queue_name = %(queue)s AND j.status = 'running'
  AND (%(after)s::boolean IS NOT TRUE OR (j.lease_expires_at, j.id) > (%(k1)s::timestamptz, %(k2)s::bigint))""",
        "j.lease_expires_at, j.id",
        ("lease_expires_at", "id"),
    ),
    **{
        status: Listing(
            """j.queue_name = %(queue)s AND j.status = %(status)s AND j.finished_at IS NOT NULL
  AND (%(after)s::boolean IS NOT TRUE OR (j.finished_at, j.id) < (%(k1)s::timestamptz, %(k2)s::bigint))""",
            "j.finished_at DESC, j.id DESC",
            ("finished_at", "id"),
        )
        for status in FINISHED
    },
    None: Listing(
        "j.queue_name = %(queue)s AND (%(after)s::boolean IS NOT TRUE OR j.id < %(k1)s::bigint)",
        "j.id DESC",
        ("id",),
    ),
}


JOBS_LIST = {
    status: f"""
SELECT {JOB_COLUMNS} FROM jobq.jobs j
WHERE {listing.where}
ORDER BY {listing.order}
LIMIT %(limit)s
"""
    for status, listing in LISTINGS.items()
}


def list_statement(status: str | None) -> str:
    """The listing SQL for a status filter (None: every status)."""
    return JOBS_LIST[status]


async def jobs_list(
    conn: psycopg.AsyncConnection[Any],
    queues: Sequence[str],
    status: str | None,
    limit: int,
    after: Sequence[Any] | None,
) -> tuple[list[JobRow], list[Any] | None]:
    """One page; returns the rows and the sort key of the last one (None on the last page). `queues`: the names the
    queue keeps jobs under (a spread queue's keys, app/db/spread.py): each key's page is read on its own (one shard
    on Citus) after the same sort key, and the pages merged in the listing's order, so a page of the queue is the
    first `limit` jobs of all its keys after the cursor."""
    listing = LISTINGS[status]
    names = listing.keys
    keys = list(after or [None] * len(names))
    params = {"status": status, "limit": limit + 1, "after": after is not None}
    params.update({f"k{i + 1}": v for i, v in enumerate(keys)})
    cur = conn.cursor(row_factory=rows_of(JobRow))
    pages = []
    for queue in queues:
        await cur.execute(list_statement(status), {**params, "queue": queue})
        pages.append(await cur.fetchall())
    if len(pages) == 1:
        rows = pages[0]
    else:
        rows = merge_pages(pages, listing.order, lambda job: [getattr(job, name) for name in names])[: limit + 1]
    more = len(rows) > limit
    rows = rows[:limit]
    last = [getattr(rows[-1], name) for name in names] if more and rows else None
    return rows, last
