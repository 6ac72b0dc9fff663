-- Rendered from app/db/claim.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: CLAIMED_ROWS --
SELECT *, NULL::bool AS marker, NULL::bool AS limited, NULL::bool AS ready_left,
       NULL::int AS room_concurrency, NULL::int AS room_rate, NULL::bool AS held_group_concurrency,
       NULL::bool AS held_group_rate, NULL::bool AS held_ordered, NULL::float8 AS wake_in, NULL::text AS last_group,
       NULL::json AS ledger
FROM claimed

-- name: FLOW_LOCK --
SELECT set_config('plan_cache_mode', CASE WHEN current_setting('citus.version', true) IS NULL THEN 'force_generic_plan' ELSE 'auto' END, true), pg_advisory_xact_lock(1785684593, hashtext(%(queue)s))

-- name: GROUP_RECENT_CLAIMS --
SELECT sum(c.n) AS n, min(c.claimed_at) + make_interval(secs => cfg.group_rate_per_seconds) AS frees_at
    FROM jobq.queue_claims c, stamp
    WHERE c.queue_name = %(queue)s AND c.group_key = w.g AND cfg.group_rate_limit IS NOT NULL
      AND c.claimed_at > stamp.now - make_interval(secs => cfg.group_rate_per_seconds)

-- name: HANDED --
SELECT c.id, c.rn, s.ord, s.worker, s.lease, st.now,
         -- One reading of the clock for the claim and its lease, so the lease is exactly what was asked.
         st.now + make_interval(secs => s.lease) AS expires,
         rtrim(translate(encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()), 'base64'),
                          '+/', '-_'), '=') || %(suffix)s AS token
  FROM chosen c JOIN slots s USING (rn) CROSS JOIN stamp st

-- name: JOB_CLAIM --
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
), slots AS (
  -- One slot per job a request may receive, oldest request first: slot k gets the k-th best job.
  SELECT row_number() OVER (ORDER BY r.ord, g) AS rn, r.ord, r.worker, r.lease
  FROM json_to_recordset(%(slots)s::json) AS r(ord int, worker text, lease int, lim int)
  CROSS JOIN LATERAL generate_series(1, r.lim) AS g
), handed AS (
  SELECT c.id, c.rn, s.ord, s.worker, s.lease, st.now,
         -- One reading of the clock for the claim and its lease, so the lease is exactly what was asked.
         st.now + make_interval(secs => s.lease) AS expires,
         rtrim(translate(encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()), 'base64'),
                          '+/', '-_'), '=') || %(suffix)s AS token
  FROM chosen c JOIN slots s USING (rn) CROSS JOIN stamp st
), claimed AS (
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
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM candidates)) AND j.id = h.id
  RETURNING h.ord AS slot, h.rn AS rank, j.id, j.queue_name AS queue, j.payload::text AS payload,
            j.priority, j.attempts, j.max_attempts, j.claim_token, j.lease_expires_at, j.run_at, j.created_at,
            j.traceparent, j.group_key AS "group"
)
SELECT *, NULL::bool AS marker, NULL::bool AS limited, NULL::bool AS ready_left,
       NULL::int AS room_concurrency, NULL::int AS room_rate, NULL::bool AS held_group_concurrency,
       NULL::bool AS held_group_rate, NULL::bool AS held_ordered, NULL::float8 AS wake_in, NULL::text AS last_group,
       NULL::json AS ledger
FROM claimed
UNION ALL
-- Nothing claimed: one marker row telling that ready jobs existed anyway (all locked by other claims, or
-- the queue paused): the "empty claims while ready jobs exist" signal of the article; `limited` when the
-- queue has limits (the caller then claims with JOB_CLAIM_LIMITED). Only evaluated when nothing was
-- claimed. A scalar subquery in claim order, not EXISTS (which would drop the ORDER BY): the first ready
-- row by jobs_claim_idx, never a scan of the table.
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       true AS marker, EXISTS (SELECT FROM jobq.queue_state WHERE queue_name = %(queue)s AND limited) AS limited,
       true AS ready_left,
       NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL  -- the limited claim's figures
WHERE NOT EXISTS (SELECT FROM claimed)
  AND (SELECT id FROM jobq.jobs
       WHERE queue_name = %(queue)s AND status = 'pending' AND run_at <= clock_timestamp()
       ORDER BY priority DESC, run_at, id LIMIT 1) IS NOT NULL

-- name: JOB_CLAIM_LIMITED --
WITH RECURSIVE cfg AS (
  -- The queue's limits as they are now: this statement started after the queue's claim lock was taken.
  -- No row (the configuration was just removed): no limits.
  SELECT coalesce(s.paused, false) AS paused, s.concurrency, s.rate_limit, s.rate_per_seconds,
         coalesce(s.group_concurrency, CASE WHEN s.ordered THEN 1 END) AS group_concurrency,
         s.group_rate_limit, s.group_rate_per_seconds, coalesce(s.fair, false) AS fair,
         coalesce(s.ordered, false) AS ordered, coalesce(s.grouped, false) AS grouped
  FROM (SELECT) one LEFT JOIN jobq.queue_state s ON s.queue_name = %(queue)s
), stamp AS (
  SELECT clock_timestamp() AS now
), running AS (
  -- Running jobs of this queue by group (jobs_running_idx): what the concurrency limits count.
  SELECT group_key, count(*) AS n FROM jobq.jobs
  WHERE queue_name = %(queue)s AND status = 'running' COLLATE "C"
    AND (SELECT concurrency IS NOT NULL OR group_concurrency IS NOT NULL FROM cfg)
  GROUP BY group_key
), recent AS (
  -- Claims of this queue inside its rate window, and when the oldest of them leaves it.
  SELECT coalesce(sum(c.n), 0) AS n, min(c.claimed_at) + make_interval(secs => cfg.rate_per_seconds) AS frees_at
  FROM cfg CROSS JOIN stamp
  JOIN jobq.queue_claims c ON c.queue_name = %(queue)s
   AND c.claimed_at > stamp.now - make_interval(secs => cfg.rate_per_seconds)
  WHERE cfg.rate_limit IS NOT NULL
  GROUP BY cfg.rate_per_seconds
), room AS (
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
  LEFT JOIN LATERAL (
    SELECT sum(c.n) AS n, min(c.claimed_at) + make_interval(secs => cfg.group_rate_per_seconds) AS frees_at
    FROM jobq.queue_claims c, stamp
    WHERE c.queue_name = %(queue)s AND c.group_key = w.g AND cfg.group_rate_limit IS NOT NULL
      AND c.claimed_at > stamp.now - make_interval(secs => cfg.group_rate_per_seconds)
  ) gr ON true
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
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM picked)) AND j.status = (SELECT 'pending'::text)
    AND j.run_at <= clock_timestamp()
  FOR UPDATE SKIP LOCKED
), chosen AS (
  SELECT p.id, row_number() OVER (ORDER BY p.ord) AS rn FROM picked p WHERE p.id IN (SELECT id FROM locked)
), slots AS (
  -- One slot per job a request may receive, oldest request first: slot k gets the k-th best job.
  SELECT row_number() OVER (ORDER BY r.ord, g) AS rn, r.ord, r.worker, r.lease
  FROM json_to_recordset(%(slots)s::json) AS r(ord int, worker text, lease int, lim int)
  CROSS JOIN LATERAL generate_series(1, r.lim) AS g
), handed AS (
  SELECT c.id, c.rn, s.ord, s.worker, s.lease, st.now,
         -- One reading of the clock for the claim and its lease, so the lease is exactly what was asked.
         st.now + make_interval(secs => s.lease) AS expires,
         rtrim(translate(encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()), 'base64'),
                          '+/', '-_'), '=') || %(suffix)s AS token
  FROM chosen c JOIN slots s USING (rn) CROSS JOIN stamp st
), claimed AS (
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
  WHERE j.queue_name = %(queue)s AND j.id = ANY(ARRAY(SELECT id FROM chosen)) AND j.id = h.id
  RETURNING h.ord AS slot, h.rn AS rank, j.id, j.queue_name AS queue, j.payload::text AS payload,
            j.priority, j.attempts, j.max_attempts, j.claim_token, j.lease_expires_at, j.run_at, j.created_at,
            j.traceparent, j.group_key AS "group"
)
SELECT *, NULL::bool AS marker, NULL::bool AS limited, NULL::bool AS ready_left,
       NULL::int AS room_concurrency, NULL::int AS room_rate, NULL::bool AS held_group_concurrency,
       NULL::bool AS held_group_rate, NULL::bool AS held_ordered, NULL::float8 AS wake_in, NULL::text AS last_group,
       NULL::json AS ledger
FROM claimed
UNION ALL
-- The marker row: which limits held jobs back (a limit "holds back" when ready jobs were left because of
-- it), when the earliest rate-window slot frees up, and the last group served (the next statement's
-- `after`).
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       true AS marker, (SELECT limited FROM jobq.queue_state WHERE queue_name = %(queue)s) AS limited,
       CASE WHEN room.n > 0
            THEN (SELECT count(*) FROM offered) > (SELECT count(*) FROM chosen)
            ELSE EXISTS (
              SELECT FROM (SELECT 1 FROM jobq.jobs
                           WHERE queue_name = %(queue)s AND status = 'pending' AND run_at <= clock_timestamp()
                           ORDER BY priority DESC, run_at, id
                           OFFSET (SELECT count(*) FROM chosen) LIMIT 1) x) END AS ready_left,
       room.by_concurrency AS room_concurrency, room.by_rate AS room_rate,
       EXISTS (SELECT FROM groups g WHERE g.full_running AND (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending' AND group_key = g.g
                AND run_at <= clock_timestamp() ORDER BY priority DESC, id LIMIT 1) IS NOT NULL) AS held_group_concurrency,
       EXISTS (SELECT FROM groups g WHERE g.full_rate AND NOT g.full_running AND (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending' AND group_key = g.g
                AND run_at <= clock_timestamp() ORDER BY priority DESC, id LIMIT 1) IS NOT NULL) AS held_group_rate,
       cfg.ordered AND EXISTS (SELECT FROM groups g WHERE g.room > 0
           AND NOT EXISTS (SELECT FROM heads h WHERE h.group_key = g.g) AND (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status = 'pending' AND group_key = g.g
                AND run_at <= clock_timestamp() ORDER BY priority DESC, id LIMIT 1) IS NOT NULL) AS held_ordered,
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

-- name: QUEUE_CLAIMS_LOG --
INSERT INTO jobq.queue_claims (queue_name, group_key, claimed_at, n) VALUES

-- name: QUEUE_LIMITS --
-- The queue's limits as they are now: this statement started after the queue's claim lock was taken.
  -- No row (the configuration was just removed): no limits.
  SELECT coalesce(s.paused, false) AS paused, s.concurrency, s.rate_limit, s.rate_per_seconds,
         coalesce(s.group_concurrency, CASE WHEN s.ordered THEN 1 END) AS group_concurrency,
         s.group_rate_limit, s.group_rate_per_seconds, coalesce(s.fair, false) AS fair,
         coalesce(s.ordered, false) AS ordered, coalesce(s.grouped, false) AS grouped
  FROM (SELECT) one LEFT JOIN jobq.queue_state s ON s.queue_name = %(queue)s

-- name: RECENT_CLAIMS --
-- Claims of this queue inside its rate window, and when the oldest of them leaves it.
  SELECT coalesce(sum(c.n), 0) AS n, min(c.claimed_at) + make_interval(secs => cfg.rate_per_seconds) AS frees_at
  FROM cfg CROSS JOIN stamp
  JOIN jobq.queue_claims c ON c.queue_name = %(queue)s
   AND c.claimed_at > stamp.now - make_interval(secs => cfg.rate_per_seconds)
  WHERE cfg.rate_limit IS NOT NULL
  GROUP BY cfg.rate_per_seconds

-- name: RUNNING_BY_GROUP --
-- Running jobs of this queue by group (jobs_running_idx): what the concurrency limits count.
  SELECT group_key, count(*) AS n FROM jobq.jobs
  WHERE queue_name = %(queue)s AND status = 'running' COLLATE "C"
    AND (SELECT concurrency IS NOT NULL OR group_concurrency IS NOT NULL FROM cfg)
  GROUP BY group_key

-- name: SLOTS --
-- One slot per job a request may receive, oldest request first: slot k gets the k-th best job.
  SELECT row_number() OVER (ORDER BY r.ord, g) AS rn, r.ord, r.worker, r.lease
  FROM json_to_recordset(%(slots)s::json) AS r(ord int, worker text, lease int, lim int)
  CROSS JOIN LATERAL generate_series(1, r.lim) AS g
