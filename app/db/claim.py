"""The claim: the statements that hand ready jobs to waiting workers, for a queue without limits
(JOB_CLAIM) and for a queue with limits (JOB_CLAIM_LIMITED), and how their rows come back to the
dispatcher (app/core/dispatcher.py), one list per request of a shared claim statement.

Both statements end alike, in fragments written once: the slots of the requests (SLOTS), the write that
hands each chosen job to its slot's request under a new token (claim_update), and their rows, ClaimRow
(app/db/rows.py): one per job claimed, and one marker row whose named columns say what the statement
found beside them (ready jobs left behind, the queue's limits, what held jobs back, when to look again).

How limits hold across processes and replicas with no coordinator. Concurrent claim statements cannot
see each other's claims: under READ COMMITTED each statement reads a snapshot taken when it started, so
two statements that count the running jobs of a queue at the same moment both see room for the same
slot. A row lock taken inside the claim statement does not help either: the statement's snapshot was
taken before it waited for the lock, so it still misses what the lock holder claimed. So a limited queue
is claimed by two statements in one short transaction: the first takes the queue's claim lock (a
transaction-scoped advisory lock on the queue's name, FLOW_LOCK), the second (JOB_CLAIM_LIMITED) starts
after it has the lock, and its snapshot therefore holds every claim that an earlier lock holder
committed. Completes, fails, releases and rescues never take the lock: they only make room, and a claim
that misses them sees less room than there is, never more. Only limited queues pay for this; the claim
of a queue without limits (JOB_CLAIM) is unchanged and checks, in the row it reads anyway for `paused`,
that the queue has no limits (`limited`, a generated column).

What counts: running jobs (status `running`, through jobs_running_idx, until completed, failed,
released, cancelled, or their lapsed lease is rescued), and claims inside a rate window (queue_claims,
one row per claim statement and group, written by the same statement, stamped with its clock; pruned
by app/db/flow.py queue_claims_prune)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from app.db.jobs import RUNNING_C, NewJob, as_json, jobs_insert
from app.db.rows import ClaimRow, Inserted, rows_of
from app.db.tokens import queue_suffix

log = logging.getLogger("jobq.claim")

# pg_advisory_xact_lock(FLOW_LOCK_CLASS, hashtext(queue)): the two-key space, apart from the one-key locks
# of migrations and vacuum. Two queues whose names hash alike share a lock: harmless, rarely slower.
FLOW_LOCK_CLASS = 0x6A6F6271


@dataclass(slots=True, frozen=True)
class ClaimSlot:
    """One claim request inside a shared claim statement."""

    worker: str
    lease_seconds: int
    limit: int


def slots_doc(slots: Sequence[ClaimSlot]) -> str:
    return as_json(
        [{"ord": n, "worker": s.worker, "lease": s.lease_seconds, "lim": s.limit} for n, s in enumerate(slots)]
    )


def per_slot(rows: Sequence[ClaimRow], n: int) -> list[list[ClaimRow]]:
    """Claimed jobs' rows (no marker row) by request, best job first."""
    out: list[list[ClaimRow]] = [[] for _ in range(n)]
    for row in sorted(rows, key=lambda r: r.rank):
        out[row.slot].append(row)
    return out


# --- what both claims share --------------------------------------------------------------------------------

# The `slots` CTE, from the requests of a shared claim statement (slots_doc).
SLOTS = """
  -- One slot per job a request may receive, oldest request first: slot k gets the k-th best job.
  SELECT row_number() OVER (ORDER BY r.ord, g) AS rn, r.ord, r.worker, r.lease
  FROM json_to_recordset(%(slots)s::json) AS r(ord int, worker text, lease int, lim int)
  CROSS JOIN LATERAL generate_series(1, r.lim) AS g
"""


# The token of a claim: 244 random bits from the server's strong RNG, URL-safe (43 characters), then the
# queue's name (%(suffix)s: app/db/tokens.py queue_suffix), so that a worker's writes find the job's shard.
TOKEN = """rtrim(translate(encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()), 'base64'),
                          '+/', '-_'), '=') || %(suffix)s"""

# The `handed` CTE: what each job of CTE `chosen` (id, and rn: its rank in claim order) is handed with: the
# request of its slot (CTE `slots`), the statement's one reading of the clock (CTE `stamp`: `now`) and the
# lease's end, and a new token. Computed in a SELECT rather than in the UPDATE's SET, where Citus refuses
# volatile functions (the clock, the RNG) and stable ones applied to a column (timestamptz + interval);
# only rows actually claimed pay for a token (`chosen` holds no more rows than there are slots).
HANDED = f"""
  SELECT c.id, c.rn, s.ord, s.worker, s.lease, st.now,
         -- One reading of the clock for the claim and its lease, so the lease is exactly what was asked.
         st.now + make_interval(secs => s.lease) AS expires,
         {TOKEN} AS token
  FROM chosen c JOIN slots s USING (rn) CROSS JOIN stamp st
"""


def claim_update(locked: str) -> str:
    """The `claimed` CTE, the claim's one write: the jobs of CTE `handed` to running, each for the request of
    its slot, under its new token. `locked` is the CTE whose ids lead into jobs by primary key (see
    app/db/jobs.py). Every column it sets comes from `handed` as computed there, and it names the queue, so
    that on Citus it is one write on the queue's shard. Returns ClaimRow's job columns."""
    return f"""
  UPDATE jobq.jobs AS j
  SET status = 'running',
      attempts = j.attempts + 1,
      claimed_at = h.now,
      lease_seconds = h.lease,
      lease_expires_at = h.expires,
      locked_by = h.worker,
      progress = NULL,  -- progress belongs to an attempt: a new claim starts without
      claim_token = h.token
  FROM handed h
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM {locked})) AND j.id = h.id
  RETURNING h.ord AS slot, h.rn AS rank, j.id, j.queue_name AS queue, j.payload::text AS payload,
            j.priority, j.attempts, j.max_attempts, j.claim_token, j.lease_expires_at, j.run_at, j.created_at,
            j.traceparent, j.group_key AS "group"
"""


# The claimed jobs' rows: ClaimRow's marker columns are NULL on them.
CLAIMED_ROWS = """SELECT *, NULL::bool AS marker, NULL::bool AS limited, NULL::bool AS ready_left,
       NULL::int AS room_concurrency, NULL::int AS room_rate, NULL::bool AS held_group_concurrency,
       NULL::bool AS held_group_rate, NULL::bool AS held_ordered, NULL::float8 AS wake_in, NULL::text AS last_group,
       NULL::json AS ledger
FROM claimed"""

# The marker row's job columns (ClaimRow's first fourteen): it stands for no job.
NO_JOB = "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL"


# --- a queue without limits ---------------------------------------------------------------------------------

JOB_CLAIM = f"""
WITH stamp AS (
  SELECT clock_timestamp() AS now
), candidates AS (
  -- The article's claim: the literal 'pending' matches jobs_claim_idx's predicate and the ORDER BY
  -- its key order, so this is an ordered index scan that stops after `total` rows it could lock.
  -- Locked rows are skipped, not waited for. Pending jobs always have an attempt left (CHECK
  -- jobs_pending_shape), so no attempts filter is needed. A paused queue yields nothing, and so does a
  -- queue with limits (`limited`, read from the same row): those are claimed by JOB_CLAIM_LIMITED
  -- (below), and a process that did not know yet learns it from the marker row below.
  SELECT id, priority, run_at
  FROM jobq.jobs
  WHERE queue_name = %(queue)s
    AND status = 'pending'
    AND run_at <= clock_timestamp()
    AND NOT EXISTS (SELECT FROM jobq.queue_state WHERE queue_name = %(queue)s AND (paused OR limited))
  ORDER BY priority DESC, run_at, id
  LIMIT %(total)s
  FOR UPDATE SKIP LOCKED
), chosen AS (
  SELECT id, row_number() OVER (ORDER BY priority DESC, run_at, id) AS rn FROM candidates
), slots AS ({SLOTS}), handed AS ({HANDED}), claimed AS ({claim_update("candidates")})
{CLAIMED_ROWS}
UNION ALL
-- Nothing claimed: one marker row telling that ready jobs existed anyway (all locked by other claims, or
-- the queue paused): the "empty claims while ready jobs exist" signal of the article; `limited` when the
-- queue has limits (the caller then claims with JOB_CLAIM_LIMITED). Only evaluated when nothing was
-- claimed. A scalar subquery in claim order, not EXISTS (which would drop the ORDER BY): the first ready
-- row by jobs_claim_idx, never a scan of the table.
SELECT {NO_JOB},
       true AS marker, EXISTS (SELECT FROM jobq.queue_state WHERE queue_name = %(queue)s AND limited) AS limited,
       true AS ready_left,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL  -- the limited claim's figures
WHERE NOT EXISTS (SELECT FROM claimed)
  AND (SELECT id FROM jobq.jobs
       WHERE queue_name = %(queue)s AND status = 'pending' AND run_at <= clock_timestamp()
       ORDER BY priority DESC, run_at, id LIMIT 1) IS NOT NULL
"""


@dataclass(slots=True)
class ClaimResult:
    rows: list[list[ClaimRow]]  # per request, best job first
    ready_left_behind: bool  # nothing was claimed although ready jobs existed
    limited: bool = False  # the queue has limits: nothing was claimed, claim with JOB_CLAIM_LIMITED


async def jobs_claim(conn: psycopg.AsyncConnection[Any], queue: str, slots: Sequence[ClaimSlot]) -> ClaimResult:
    """Claim jobs for several requests in one statement; returns each request's rows, best job first."""
    cur = conn.cursor(row_factory=rows_of(ClaimRow))
    params = {
        "queue": queue,
        "total": sum(s.limit for s in slots),
        "slots": slots_doc(slots),
        "suffix": queue_suffix(queue),
    }
    await cur.execute(JOB_CLAIM, params)
    rows = await cur.fetchall()
    if len(rows) == 1 and rows[0].marker:
        marker = rows[0]
        limited = bool(marker.limited)
        return ClaimResult(per_slot([], len(slots)), bool(marker.ready_left) and not limited, limited)
    return ClaimResult(per_slot(rows, len(slots)), ready_left_behind=False)


async def jobs_insert_handing_off(
    conn: psycopg.AsyncConnection[Any],
    jobs: Sequence[NewJob],
    claims: Sequence[tuple[str, Sequence[ClaimSlot]]],
    made: list[ClaimResult],
    *,
    full: bool = True,
) -> list[Inserted]:
    """jobs_insert, and in the same transaction a JOB_CLAIM for each (queue, slots) of `claims`: the direct
    hand-off of an enqueue to claims parked in this process (app/core/dispatcher.py take_parked). One commit
    makes the jobs and their claims, where an enqueue and the claim it wakes would make two, each flushed.

    The claim is the same statement as anywhere else, run after the insert in the same transaction: it sees
    the new jobs, takes the queue's best ready jobs in claim order (an older ready job before the new one),
    skips rows other claims hold, and claims nothing on a paused queue or one with limits (marker row). When
    a claim statement fails, the transaction is rolled back and the jobs are inserted alone: an enqueue never
    fails for a claim's sake. Returns the inserted rows; `made` receives one ClaimResult per claim, in order, as
    each is made, and is left empty when the jobs were inserted without them. When this raises with `made` not
    empty, the commit is in doubt: the caller releases those claims (by their tokens: a no-op if the commit did
    not happen), so that no job is left running under a token nobody holds."""
    failed = False
    async with conn.transaction():
        rows = await jobs_insert(conn, jobs, full=full)
        try:
            for queue, slots in claims:
                made.append(await jobs_claim(conn, queue, slots))
        except Exception:
            if conn.broken:
                raise  # the connection: the enqueue's fate is the connection's, as without a hand-off
            log.warning("a hand-off's claim failed; inserting the jobs without it", exc_info=True)
            failed = True
            made.clear()
            raise psycopg.Rollback() from None
    if failed:
        return await jobs_insert(conn, jobs, full=full)
    return rows


# --- a queue with limits ------------------------------------------------------------------------------------
# The queue's claim lock, and a generic plan for the claim that follows in this transaction: its plan does
# not depend on the parameters, and planning it costs more than running it (measured: 8.8 ms to plan, 6 ms
# to run a 60-job claim), while PostgreSQL keeps re-planning a prepared statement whose generic plan's
# estimate looks worse than its custom plans', as this one's does on fresh statistics (LIMIT $n is planned
# as a tenth of the table). The generic plan reads the same indexes (tests/test_plans.py checks both).
# Not where Citus is loaded (its setting citus.version exists): Citus cannot make a distributed plan of a
# generic plan whose queue is still a parameter ("could not create distributed plan"), and plans the claim
# for the queue's shard each time anyway; a prepared statement there runs with custom plans, as by default.
# On Citus the lock is the coordinator's: a claim's statement reaches the queue's shard after the lock is
# granted, and the lock is let go after the shard's transaction has committed.
FLOW_LOCK = (
    "SELECT set_config('plan_cache_mode', CASE WHEN current_setting('citus.version', true) IS NULL"
    " THEN 'force_generic_plan' ELSE 'auto' END, true),"
    f" pg_advisory_xact_lock({FLOW_LOCK_CLASS}, hashtext(%(queue)s))"
)

# A status the planner cannot see (see app/db/jobs.py): the lock on picked jobs goes by primary key.
PENDING = "(SELECT 'pending'::text)"

# A group `g.g` has a due job: the group's first by jobs_group_idx's order (a scalar subquery with ORDER BY, not
# EXISTS, which the planner may answer with a sequential scan on stale statistics).
DUE_IN_GROUP = """(SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending' AND group_key = g.g
                AND run_at <= clock_timestamp() ORDER BY priority DESC, id LIMIT 1) IS NOT NULL"""

# The fragments below are the claim's reading of a queue's limits, written once: JOB_CLAIM_LIMITED is made of
# them, and so are the explanation of why a job is not claimed (GET /jobs/{id}/explain) and the scaling signal
# (app/db/scale.py), so that what those say cannot drift from what the claim does. Each is the body of a CTE
# of the name it says; RUNNING_BY_GROUP and RECENT_CLAIMS read `cfg` and `stamp`.

# CTE `cfg`: the queue's limits.
QUEUE_LIMITS = """
  -- The queue's limits as they are now: this statement started after the queue's claim lock was taken.
  -- No row (the configuration was just removed): no limits.
  SELECT coalesce(s.paused, false) AS paused, s.concurrency, s.rate_limit, s.rate_per_seconds,
         coalesce(s.group_concurrency, CASE WHEN s.ordered THEN 1 END) AS group_concurrency,
         s.group_rate_limit, s.group_rate_per_seconds, coalesce(s.fair, false) AS fair,
         coalesce(s.ordered, false) AS ordered, coalesce(s.grouped, false) AS grouped
  FROM (SELECT) one LEFT JOIN jobq.queue_state s ON s.queue_name = %(queue)s
"""

# CTE `running`: the running jobs that the concurrency limits count.
RUNNING_BY_GROUP = f"""
  -- Running jobs of this queue by group (jobs_running_idx): what the concurrency limits count.
  SELECT group_key, count(*) AS n FROM jobq.jobs
  WHERE queue_name = %(queue)s AND status = {RUNNING_C}
    AND (SELECT concurrency IS NOT NULL OR group_concurrency IS NOT NULL FROM cfg)
  GROUP BY group_key
"""

# CTE `recent`: the claims that the queue's rate limit counts.
RECENT_CLAIMS = """
  -- Claims of this queue inside its rate window, and when the oldest of them leaves it.
  SELECT coalesce(sum(c.n), 0) AS n, min(c.claimed_at) + make_interval(secs => cfg.rate_per_seconds) AS frees_at
  FROM cfg CROSS JOIN stamp
  JOIN jobq.queue_claims c ON c.queue_name = %(queue)s
   AND c.claimed_at > stamp.now - make_interval(secs => cfg.rate_per_seconds)
  WHERE cfg.rate_limit IS NOT NULL
  GROUP BY cfg.rate_per_seconds
"""

# A LATERAL subquery on group `w.g`: its claims inside the group rate window (reads `cfg`).
GROUP_RECENT_CLAIMS = """
    SELECT sum(c.n) AS n, min(c.claimed_at) + make_interval(secs => cfg.group_rate_per_seconds) AS frees_at
    FROM jobq.queue_claims c, stamp
    WHERE c.queue_name = %(queue)s AND c.group_key = w.g AND cfg.group_rate_limit IS NOT NULL
      AND c.claimed_at > stamp.now - make_interval(secs => cfg.group_rate_per_seconds)
"""

JOB_CLAIM_LIMITED = f"""
WITH RECURSIVE cfg AS ({QUEUE_LIMITS}), stamp AS (
  SELECT clock_timestamp() AS now
), running AS ({RUNNING_BY_GROUP}), recent AS ({RECENT_CLAIMS}), room AS (
  -- How many jobs this statement may claim, and what each queue-wide limit alone would allow.
  SELECT CASE WHEN cfg.paused THEN 0 ELSE greatest(0, least(%(total)s::int, by_concurrency, by_rate)) END AS n,
         by_concurrency, by_rate
  FROM cfg, LATERAL (
    SELECT cfg.concurrency - (SELECT coalesce(sum(n), 0) FROM running)::int AS by_concurrency,
           cfg.rate_limit - coalesce((SELECT n FROM recent), 0)::int AS by_rate
  ) l
), plain AS (
  -- No group limits: the queue's first ready jobs in claim order, of which `room` are taken below. The
  -- LIMIT is the request's total, a parameter as in JOB_CLAIM, rather than `room` (a subquery, which the
  -- planner can only guess at). Read without locking; `locked` locks what is taken.
  SELECT id, priority, run_at, group_key, 1::bigint AS k
  FROM jobq.jobs
  WHERE queue_name = %(queue)s AND status = 'pending' AND run_at <= clock_timestamp()
    AND NOT (SELECT grouped FROM cfg) AND (SELECT n FROM room) > 0
  ORDER BY priority DESC, run_at, id
  LIMIT %(total)s
), walk(g) AS (
  -- Group limits, fairness, order: every group with pending jobs, once, in key order: a skip scan of
  -- jobs_group_idx, one index probe per group. ORDER BY ... LIMIT 1, not min(): with stale statistics
  -- the planner would compute min() by a sequential scan, while the only other way to an ordered LIMIT
  -- is a sort of the whole table, which never looks cheap.
  SELECT (SELECT group_key FROM jobq.jobs
          WHERE queue_name = %(queue)s AND status = 'pending' AND group_key IS NOT NULL
          ORDER BY group_key LIMIT 1)
  WHERE (SELECT grouped FROM cfg) AND (SELECT n FROM room) > 0
  UNION ALL
  SELECT (SELECT group_key FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending' AND group_key > w.g
          ORDER BY group_key LIMIT 1)
  FROM walk w WHERE w.g IS NOT NULL
), groups AS (
  -- Each group's room: its concurrency limit less its running jobs, its rate limit less its recent claims.
  SELECT w.g, greatest(0, least(%(total)s::int, cfg.group_concurrency - coalesce(r.n, 0)::int,
                                cfg.group_rate_limit - coalesce(gr.n, 0)::int)) AS room,
         cfg.group_concurrency - coalesce(r.n, 0) <= 0 AS full_running,
         cfg.group_rate_limit - coalesce(gr.n, 0) <= 0 AS full_rate, gr.frees_at,
         cfg.group_rate_limit - coalesce(gr.n, 0) AS rate_room,
         count(*) OVER () AS ngroups
  FROM walk w CROSS JOIN cfg
  LEFT JOIN running r ON r.group_key = w.g
  LEFT JOIN LATERAL ({GROUP_RECENT_CLAIMS}  ) gr ON true
  WHERE w.g IS NOT NULL
), heads AS (
  -- Each group's next jobs, up to its room: in the group's order (priority, then enqueue order), due ones.
  -- An ordered group offers its first pending job only, and only once it is due: a job waiting for its
  -- retry holds the group back, and one running fills the group's single slot. A fair queue hands out one
  -- job per group per round, so a group offers no more than its share of this statement's room (plus
  -- one): with 100 groups and room for 300, 4 each instead of 300 each (30,000 rows read to hand out 300).
  -- When a few groups hold nearly all ready jobs, a statement may then hand out fewer than it could; the
  -- next claim takes the rest.
  SELECT g.g AS group_key, h.id, h.priority, h.run_at, h.k
  FROM groups g CROSS JOIN cfg
  CROSS JOIN LATERAL (
    SELECT q.id, q.priority, q.run_at, row_number() OVER (ORDER BY q.priority DESC, q.id) AS k
    FROM (
      SELECT id, priority, run_at FROM jobq.jobs
      WHERE queue_name = %(queue)s AND status = 'pending' AND group_key = g.g
        AND (cfg.ordered OR run_at <= clock_timestamp())
      ORDER BY priority DESC, id
      LIMIT CASE WHEN cfg.ordered THEN least(g.room, 1)
                 WHEN cfg.fair THEN least(g.room, (SELECT n FROM room) / g.ngroups + 1)
                 ELSE g.room END
    ) q
    WHERE q.run_at <= clock_timestamp()
  ) h
  WHERE g.room > 0
), lane AS (
  -- Jobs without a group in such a queue: no group limit holds them back, and a fair queue gives them one
  -- turn per round, like a group. They are looked for among the queue's first ready jobs in claim order.
  SELECT id, priority, run_at, NULL::text AS group_key, row_number() OVER (ORDER BY priority DESC, run_at, id) AS k
  FROM (
    SELECT id, priority, run_at, group_key FROM jobq.jobs
    WHERE queue_name = %(queue)s AND status = 'pending' AND run_at <= clock_timestamp()
      AND (SELECT grouped FROM cfg) AND (SELECT n FROM room) > 0
    ORDER BY priority DESC, run_at, id
    LIMIT %(window)s
  ) w
  WHERE group_key IS NULL
), offered AS (
  SELECT id, priority, run_at, group_key, k,
         -- Round-robin position: the groups after the last one served (the caller's `after`), then the rest.
         CASE WHEN coalesce(group_key, '') > coalesce(%(after)s::text, '') THEN '0' ELSE '1' END
         || coalesce(group_key, '') AS pos
  FROM (SELECT group_key, id, priority, run_at, k FROM heads
        UNION ALL SELECT group_key, id, priority, run_at, k FROM lane
        UNION ALL SELECT group_key, id, priority, run_at, k FROM plain) o
), picked AS (
  -- Fair: the first job of every group, then the second of every group, ...; otherwise claim order.
  SELECT o.id, o.group_key,
         row_number() OVER (ORDER BY CASE WHEN cfg.fair THEN o.k END, CASE WHEN cfg.fair THEN o.pos END,
                                     o.priority DESC, o.run_at, o.id) AS ord
  FROM offered o CROSS JOIN cfg
  ORDER BY ord
  LIMIT (SELECT n FROM room)
), locked AS (
  -- Picked jobs, locked; one an admin action holds right now is left out (SKIP LOCKED), and one that is
  -- no longer pending, or no longer due, when its lock is granted is dropped (READ COMMITTED re-checks the
  -- locked row): a debounce that committed after this statement's snapshot moved its run time later.
  SELECT j.id FROM jobq.jobs j
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM picked)) AND j.status = {PENDING}
    AND j.run_at <= clock_timestamp()
  FOR UPDATE SKIP LOCKED
), chosen AS (
  SELECT p.id, row_number() OVER (ORDER BY p.ord) AS rn FROM picked p WHERE p.id IN (SELECT id FROM locked)
), slots AS ({SLOTS}), handed AS ({HANDED}), claimed AS ({claim_update("chosen")})
{CLAIMED_ROWS}
UNION ALL
-- The marker row: which limits held jobs back (a limit "holds back" when ready jobs were left because of
-- it), when the earliest rate-window slot frees up, and the last group served (the next statement's
-- `after`).
SELECT {NO_JOB},
       true AS marker, (SELECT limited FROM jobq.queue_state WHERE queue_name = %(queue)s) AS limited,
       CASE WHEN room.n > 0
            THEN (SELECT count(*) FROM offered) > (SELECT count(*) FROM chosen)
            ELSE EXISTS (
              SELECT FROM (SELECT 1 FROM jobq.jobs
                           WHERE queue_name = %(queue)s AND status = 'pending' AND run_at <= clock_timestamp()
                           ORDER BY priority DESC, run_at, id
                           OFFSET (SELECT count(*) FROM chosen) LIMIT 1) x) END AS ready_left,
       room.by_concurrency AS room_concurrency, room.by_rate AS room_rate,
       EXISTS (SELECT FROM groups g WHERE g.full_running AND {DUE_IN_GROUP}) AS held_group_concurrency,
       EXISTS (SELECT FROM groups g WHERE g.full_rate AND NOT g.full_running AND {DUE_IN_GROUP}) AS held_group_rate,
       cfg.ordered AND EXISTS (SELECT FROM groups g WHERE g.room > 0
           AND NOT EXISTS (SELECT FROM heads h WHERE h.group_key = g.g) AND {DUE_IN_GROUP}) AS held_ordered,
       -- A window this statement filled counts too (its own claims may be the window's oldest): a claim
       -- it left waiting is woken when the window lets the next one through.
       extract(epoch FROM least(
           CASE WHEN room.by_rate - (SELECT count(*) FROM claimed) <= 0
                THEN coalesce((SELECT frees_at FROM recent), stamp.now + make_interval(secs => cfg.rate_per_seconds))
           END,
           (SELECT min(coalesce(g.frees_at, stamp.now + make_interval(secs => cfg.group_rate_per_seconds)))
            FROM groups g WHERE g.rate_room - (SELECT count(*) FROM claimed c WHERE c."group" = g.g) <= 0))
         - stamp.now)::float8 AS wake_in,
       -- '' when the last job had no group: those jobs take their turn where the empty key sorts, and the
       -- next round goes on after them (NULL: nothing was claimed, the round stays where it was).
       (SELECT coalesce(c."group", '') FROM claimed c ORDER BY c.rank DESC LIMIT 1) AS last_group,
       -- What the rate limits are to count of this claim (NULL: nothing): one ledger row per group claimed
       -- from, stamped with this claim's time, written by jobs_claim_limited (QUEUE_CLAIMS_LOG) before the
       -- claim lock is let go. Not an INSERT in this statement: on Citus a statement with one is no longer
       -- planned for one shard.
       (SELECT json_build_object('at', stamp.now, 'rows', json_agg(json_build_array(l."group", l.n)))
        FROM (SELECT c."group", count(*) AS n FROM claimed c
              WHERE cfg.rate_limit IS NOT NULL OR (cfg.group_rate_limit IS NOT NULL AND c."group" IS NOT NULL)
              GROUP BY c."group") l
        HAVING count(*) > 0) AS ledger
FROM cfg, room, stamp
"""

# The limited claim's ledger rows (its marker row's `ledger`), one a group, in the claim's transaction: one
# multi-row INSERT, a single-shard write on Citus (an INSERT ... SELECT from the JSON would be collected on
# the coordinator first).
QUEUE_CLAIMS_LOG = "INSERT INTO jobq.queue_claims (queue_name, group_key, claimed_at, n) VALUES "
QUEUE_CLAIMS_LOG_ROW = "(%s, %s, %s::timestamptz, %s)"


def queue_claims_log(queue: str, ledger: dict[str, Any]) -> tuple[str, list[Any]]:
    """The statement and parameters that write a limited claim's ledger rows."""
    rows: list[list[Any]] = ledger["rows"]
    params: list[Any] = []
    for group, n in rows:
        params += [queue, group, ledger["at"], n]
    return QUEUE_CLAIMS_LOG + ", ".join([QUEUE_CLAIMS_LOG_ROW] * len(rows)), params


# How deep a grouped queue's claim looks for jobs without a group, in claim order.
LANE_WINDOW = 100


@dataclass(slots=True)
class LimitedClaim:
    rows: list[list[ClaimRow]]  # per request, best job first
    held: list[str]  # the limits that held ready jobs back: concurrency, rate, group_concurrency, ...
    wake_in: float | None  # seconds until a rate-window slot frees up (None: no rate limit is full)
    last_group: str | None  # of the last job handed out ("": it had none), where a fair queue's next round starts
    limited: bool  # the queue still has limits


async def jobs_claim_limited(
    conn: psycopg.AsyncConnection[Any], queue: str, slots: Sequence[ClaimSlot], after: str | None
) -> LimitedClaim:
    """Claim from a queue with limits: take the queue's claim lock, then claim within them, in one short
    transaction (see the module docstring). `after`: the group this process served last (fair queues)."""
    total = sum(s.limit for s in slots)
    params = {
        "queue": queue,
        "total": total,
        "slots": slots_doc(slots),
        "suffix": queue_suffix(queue),
        "after": after,
        "window": LANE_WINDOW,
    }
    cur = conn.cursor(row_factory=rows_of(ClaimRow))
    # Pipelined: the lock, the claim and BEGIN go out together, the ledger's rows and COMMIT together.
    async with conn.pipeline(), conn.transaction():
        await conn.execute(FLOW_LOCK, {"queue": queue})
        await cur.execute(JOB_CLAIM_LIMITED, params)
        rows = await cur.fetchall()
        marker = next(r for r in rows if r.marker)
        if marker.ledger is not None:
            await conn.execute(*queue_claims_log(queue, marker.ledger))
    held: list[str] = []
    if marker.ready_left:
        bound = [v for v in (marker.room_concurrency, marker.room_rate) if v is not None]
        if bound and min(bound) < total:
            if marker.room_concurrency == min(bound):
                held.append("concurrency")
            if marker.room_rate == min(bound):
                held.append("rate")
    for holding, limit in (
        (marker.held_group_concurrency, "group_concurrency"),
        (marker.held_group_rate, "group_rate"),
        (marker.held_ordered, "ordered"),
    ):
        if holding:
            held.append(limit)
    claimed = [r for r in rows if not r.marker]
    return LimitedClaim(per_slot(claimed, len(slots)), held, marker.wake_in, marker.last_group, bool(marker.limited))
