-- Rendered from app/db/flow.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: FLOW_LOCK --
SELECT set_config('plan_cache_mode', 'force_generic_plan', true), pg_advisory_xact_lock(1785684593, hashtext(%(queue)s))

-- name: JOB_CLAIM_LIMITED --
WITH RECURSIVE cfg AS (
  -- The queue's limits as they are now: this statement started after the queue's claim lock was taken.
  -- No row (the configuration was just removed): no limits.
  SELECT coalesce(s.paused, false) AS paused, s.concurrency, s.rate_limit, s.rate_per_seconds,
         coalesce(s.group_concurrency, CASE WHEN s.ordered THEN 1 END) AS group_concurrency,
         s.group_rate_limit, s.group_rate_per_seconds, coalesce(s.fair, false) AS fair,
         coalesce(s.ordered, false) AS ordered, coalesce(s.grouped, false) AS grouped
  FROM (SELECT) one LEFT JOIN queue_state s ON s.queue_name = %(queue)s
), stamp AS (
  SELECT clock_timestamp() AS now
), running AS (
  -- Running jobs of this queue by group (jobs_running_idx): what the concurrency limits count.
  SELECT group_key, count(*) AS n FROM jobs
  WHERE queue_name = %(queue)s AND status = 'running' COLLATE "C"
    AND (SELECT concurrency IS NOT NULL OR group_concurrency IS NOT NULL FROM cfg)
  GROUP BY group_key
), recent AS (
  -- Claims of this queue inside its rate window, and when the oldest of them leaves it.
  SELECT coalesce(sum(c.n), 0) AS n, min(c.claimed_at) + make_interval(secs => cfg.rate_per_seconds) AS frees_at
  FROM cfg CROSS JOIN stamp
  JOIN queue_claims c ON c.queue_name = %(queue)s
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
  FROM jobs
  WHERE queue_name = %(queue)s AND status = 'pending' AND run_at <= clock_timestamp()
    AND NOT (SELECT grouped FROM cfg) AND (SELECT n FROM room) > 0
  ORDER BY priority DESC, run_at, id
  LIMIT %(total)s
), walk(g) AS (
  -- Group limits, fairness, order: every group with pending jobs, once, in key order: a skip scan of
  -- jobs_group_idx, one index probe per group. ORDER BY ... LIMIT 1, not min(): with stale statistics
  -- the planner would compute min() by a sequential scan, while the only other way to an ordered LIMIT
  -- is a sort of the whole table, which never looks cheap.
  SELECT (SELECT group_key FROM jobs
          WHERE queue_name = %(queue)s AND status = 'pending' AND group_key IS NOT NULL
          ORDER BY group_key LIMIT 1)
  WHERE (SELECT grouped FROM cfg) AND (SELECT n FROM room) > 0
  UNION ALL
  SELECT (SELECT group_key FROM jobs WHERE queue_name = %(queue)s AND status = 'pending' AND group_key > w.g
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
    FROM queue_claims c, stamp
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
      SELECT id, priority, run_at FROM jobs
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
    SELECT id, priority, run_at, group_key FROM jobs
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
  -- no longer pending when its lock is granted is dropped (READ COMMITTED re-checks the locked row).
  SELECT j.id FROM jobs j
  WHERE j.id = ANY(ARRAY(SELECT id FROM picked)) AND j.status = (SELECT 'pending'::text)
  FOR UPDATE SKIP LOCKED
), chosen AS (
  SELECT p.id, row_number() OVER (ORDER BY p.ord) AS rn FROM picked p WHERE p.id IN (SELECT id FROM locked)
), slots AS (
  SELECT row_number() OVER (ORDER BY r.ord, g) AS rn, r.ord, r.worker, r.lease
  FROM json_to_recordset(%(slots)s::json) AS r(ord int, worker text, lease int, lim int)
  CROSS JOIN LATERAL generate_series(1, r.lim) AS g
), claimed AS (
  UPDATE jobs AS j
  SET status = 'running',
      attempts = j.attempts + 1,
      claimed_at = stamp.now,
      lease_seconds = s.lease,
      lease_expires_at = stamp.now + make_interval(secs => s.lease),
      locked_by = s.worker,
      progress = NULL,
      claim_token = rtrim(translate(encode(uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()),
                                           'base64'), '+/', '-_'), '=')
  FROM chosen
  JOIN slots s USING (rn)
  CROSS JOIN stamp
  WHERE j.id = ANY(ARRAY(SELECT id FROM chosen)) AND j.id = chosen.id
  RETURNING s.ord AS slot, chosen.rn AS rank, j.id, j.queue_name AS queue, j.payload::text AS payload,
            j.priority, j.attempts, j.max_attempts, j.claim_token, j.lease_expires_at, j.run_at, j.created_at,
            j.traceparent, j.group_key AS "group"
), logged AS (
  -- The ledger that rate limits count: one row per group claimed from, stamped with this claim's time.
  INSERT INTO queue_claims (queue_name, group_key, claimed_at, n)
  SELECT %(queue)s, c."group", stamp.now, count(*)
  FROM claimed c CROSS JOIN stamp CROSS JOIN cfg
  WHERE cfg.rate_limit IS NOT NULL OR (cfg.group_rate_limit IS NOT NULL AND c."group" IS NOT NULL)
  GROUP BY c."group", stamp.now
)
SELECT *, NULL::text AS info FROM claimed
UNION ALL
-- One summary row (slot -1): which limits held jobs back (a limit "holds back" when ready jobs were left
-- because of it), when the earliest rate-window slot frees up, and the last group served (the next
-- statement's `after`).
SELECT -1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       json_build_object(
         'claimed', (SELECT count(*) FROM claimed),
         'ready_beyond', CASE WHEN room.n > 0
                              THEN (SELECT count(*) FROM offered) > (SELECT count(*) FROM chosen)
                              ELSE EXISTS (
               SELECT FROM (SELECT 1 FROM jobs
                            WHERE queue_name = %(queue)s AND status = 'pending' AND run_at <= clock_timestamp()
                            ORDER BY priority DESC, run_at, id
                            OFFSET (SELECT count(*) FROM chosen) LIMIT 1) x) END,
         'by_concurrency', room.by_concurrency, 'by_rate', room.by_rate,
         'group_running', EXISTS (SELECT FROM groups g WHERE g.full_running AND (SELECT 1 FROM jobs WHERE queue_name = %(queue)s AND status = 'pending' AND group_key = g.g
                AND run_at <= clock_timestamp() ORDER BY priority DESC, id LIMIT 1) IS NOT NULL),
         'group_rate', EXISTS (SELECT FROM groups g WHERE g.full_rate AND NOT g.full_running AND (SELECT 1 FROM jobs WHERE queue_name = %(queue)s AND status = 'pending' AND group_key = g.g
                AND run_at <= clock_timestamp() ORDER BY priority DESC, id LIMIT 1) IS NOT NULL),
         'ordered', cfg.ordered AND EXISTS (SELECT FROM groups g WHERE g.room > 0
             AND NOT EXISTS (SELECT FROM heads h WHERE h.group_key = g.g) AND (SELECT 1 FROM jobs WHERE queue_name = %(queue)s AND status = 'pending' AND group_key = g.g
                AND run_at <= clock_timestamp() ORDER BY priority DESC, id LIMIT 1) IS NOT NULL),
         -- A window this statement filled counts too (its own claims may be the window's oldest): a claim
         -- it left waiting is woken when the window lets the next one through.
         'wake_in', extract(epoch FROM least(
             CASE WHEN room.by_rate - (SELECT count(*) FROM claimed) <= 0
                  THEN coalesce((SELECT frees_at FROM recent), stamp.now + make_interval(secs => cfg.rate_per_seconds))
             END,
             (SELECT min(coalesce(g.frees_at, stamp.now + make_interval(secs => cfg.group_rate_per_seconds)))
              FROM groups g WHERE g.rate_room - (SELECT count(*) FROM claimed c WHERE c."group" = g.g) <= 0))
           - stamp.now),
         -- '' when the last job had no group: those jobs take their turn where the empty key sorts, and the
         -- next round goes on after them (NULL: nothing was claimed, the round stays where it was).
         'last_group', (SELECT coalesce(c."group", '') FROM claimed c ORDER BY c.rank DESC LIMIT 1),
         'limited', (SELECT limited FROM queue_state WHERE queue_name = %(queue)s)
       )::text
FROM cfg, room, stamp

-- name: QUEUE_CLAIMS_PRUNE --
-- Ledger rows older than every rate window of their queue (a day when the queue has none any more).
DELETE FROM queue_claims c
WHERE c.claimed_at < now() - make_interval(secs => coalesce(
  (SELECT greatest(coalesce(s.rate_per_seconds, 0), coalesce(s.group_rate_per_seconds, 0))
   FROM queue_state s WHERE s.queue_name = c.queue_name), 86400))

-- name: QUEUE_CONFIGS_RETENTION --
-- Queues whose retention differs from the global setting in some status.
SELECT queue_name, retention_completed_seconds, retention_failed_seconds, retention_cancelled_seconds
FROM queue_state
WHERE retention_completed_seconds IS NOT NULL OR retention_failed_seconds IS NOT NULL
   OR retention_cancelled_seconds IS NOT NULL

-- name: QUEUE_CONFIG_GET --
SELECT queue_name AS queue, max_attempts, backoff_base_seconds, backoff_max_seconds, lease_seconds, default_priority, retention_completed_seconds, retention_failed_seconds, retention_cancelled_seconds, concurrency, rate_limit, rate_per_seconds, group_concurrency, group_rate_limit, group_rate_per_seconds, fair, ordered, limited, grouped, changed_at FROM queue_state WHERE queue_name = %(queue)s

-- name: QUEUE_CONFIG_LOCK --
-- The row to change, created when the queue has none, and locked until the change commits (DO UPDATE
-- locks the row it finds): two changes of one queue apply one after the other, each to what the other left.
INSERT INTO queue_state AS s (queue_name) VALUES (%(queue)s)
ON CONFLICT (queue_name) DO UPDATE SET queue_name = s.queue_name
RETURNING queue_name AS queue, max_attempts, backoff_base_seconds, backoff_max_seconds, lease_seconds, default_priority, retention_completed_seconds, retention_failed_seconds, retention_cancelled_seconds, concurrency, rate_limit, rate_per_seconds, group_concurrency, group_rate_limit, group_rate_per_seconds, fair, ordered, limited, grouped, changed_at

-- name: QUEUE_CONFIG_SET --
-- Delivered at commit: every process drops its cached configuration of this queue as soon as the change
-- is durable (app/maintenance/listener.py).
WITH changed AS (
  UPDATE queue_state SET max_attempts = %(max_attempts)s, backoff_base_seconds = %(backoff_base_seconds)s, backoff_max_seconds = %(backoff_max_seconds)s, lease_seconds = %(lease_seconds)s, default_priority = %(default_priority)s, retention_completed_seconds = %(retention_completed_seconds)s, retention_failed_seconds = %(retention_failed_seconds)s, retention_cancelled_seconds = %(retention_cancelled_seconds)s, concurrency = %(concurrency)s, rate_limit = %(rate_limit)s, rate_per_seconds = %(rate_per_seconds)s, group_concurrency = %(group_concurrency)s, group_rate_limit = %(group_rate_limit)s, group_rate_per_seconds = %(group_rate_per_seconds)s, fair = %(fair)s, ordered = %(ordered)s, changed_at = now()
  WHERE queue_name = %(queue)s
  RETURNING queue_name AS queue, max_attempts, backoff_base_seconds, backoff_max_seconds, lease_seconds, default_priority, retention_completed_seconds, retention_failed_seconds, retention_cancelled_seconds, concurrency, rate_limit, rate_per_seconds, group_concurrency, group_rate_limit, group_rate_per_seconds, fair, ordered, limited, grouped, changed_at
)
SELECT c.*, pg_notify('jobq_wakeup', 'config ' || c.queue) IS NULL AS notified FROM changed c
