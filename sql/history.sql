-- Rendered from app/db/history.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: BACKLOG_MARK --
-- The once-per-minute claim: one replica's INSERT wins; the others wait for it, then insert nothing (and
-- write no sample).
INSERT INTO jobq.stats_samples (minute) VALUES (date_trunc('minute', coalesce(%(now)s::timestamptz, now())))
ON CONFLICT DO NOTHING
RETURNING minute

-- name: BACKLOG_WRITE --
-- Index-only over jobs_claim_idx: each queue's ready jobs and the age of its oldest, filed under the minute
-- just claimed.
INSERT INTO jobq.queue_stats AS s (queue_name, minute, ready, oldest_ready_seconds)
SELECT j.queue_name, %(minute)s::timestamptz, count(*), extract(epoch FROM coalesce(%(now)s::timestamptz, now()) - min(j.run_at))::float8
FROM jobq.jobs j
WHERE j.status = 'pending' AND j.run_at <= coalesce(%(now)s::timestamptz, now())
GROUP BY j.queue_name
-- Rows in the order the flush takes them (app/db/operations.py STATS_ADD): no deadlock between the two.
ORDER BY j.queue_name COLLATE "C"
ON CONFLICT (queue_name, minute) DO UPDATE
  SET ready = EXCLUDED.ready, oldest_ready_seconds = EXCLUDED.oldest_ready_seconds

-- name: HISTORY_CUTOFFS --
-- Where a retention pass rolls up and deletes, by the database clock, read once per pass: the statements
-- after it take these as parameters (on Citus, a DELETE takes no now() inside a coalesce).
SELECT date_trunc('hour', coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(minutes_keep)s)) AS minutes_before,
       coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(hours_keep)s) AS hours_before

-- name: HOURS_DELETE_OLD --
DELETE FROM jobq.queue_stats_hourly WHERE queue_name = %(queue)s AND hour < %(before)s

-- name: SAMPLED_MINUTES --
WITH 
bounds AS (
  SELECT to_timestamp((floor(extract(epoch FROM now()) / %(bucket)s) - (%(buckets)s - 1)) * %(bucket)s) AS since,
         now() AS as_of
)
SELECT floor(extract(epoch FROM m.minute - b.since) / %(bucket)s)::int AS bucket, count(m.minute) AS minutes, min(b.since) AS since, min(b.as_of) AS as_of
FROM bounds b LEFT JOIN jobq.stats_samples m ON m.minute >= b.since
GROUP BY 1

-- name: SAMPLES_DELETE_OLD --
DELETE FROM jobq.stats_samples WHERE minute < %(before)s

-- name: SERIES_ALL --
WITH 
bounds AS (
  SELECT to_timestamp((floor(extract(epoch FROM now()) / %(bucket)s) - (%(buckets)s - 1)) * %(bucket)s) AS since,
         now() AS as_of
), sources AS (
  SELECT s.minute AS at, s.enqueued, s.completed, s.failed, s.duration_max_ms, s.durations_ms,
         coalesce(s.ready, 0) AS ready, s.oldest_ready_seconds
  FROM jobq.queue_stats s, bounds b
  WHERE (%(allowed)s::text IS NULL OR split_part(s.queue_name, '#', 1) ~ %(allowed)s::text) AND s.minute >= b.since
  UNION ALL
  SELECT h.hour, h.enqueued, h.completed, h.failed, h.duration_max_ms, h.durations_ms, h.ready_sum,
         h.oldest_ready_seconds
  FROM jobq.queue_stats_hourly h, bounds b
  WHERE (%(allowed)s::text IS NULL OR split_part(h.queue_name, '#', 1) ~ %(allowed)s::text) AND h.hour >= b.since
), binned AS (
  SELECT floor(extract(epoch FROM r.at - b.since) / %(bucket)s)::int AS i, r.* FROM sources r, bounds b
), totals AS (
  SELECT i, sum(enqueued)::bigint AS enqueued, sum(completed)::bigint AS completed, sum(failed)::bigint AS failed,
         max(duration_max_ms) FILTER (WHERE completed > 0) AS duration_max_ms,
         CASE WHEN max(cardinality(durations_ms)) > 0 THEN ARRAY[coalesce(sum(durations_ms[1]), 0), coalesce(sum(durations_ms[2]), 0), coalesce(sum(durations_ms[3]), 0), coalesce(sum(durations_ms[4]), 0), coalesce(sum(durations_ms[5]), 0), coalesce(sum(durations_ms[6]), 0), coalesce(sum(durations_ms[7]), 0), coalesce(sum(durations_ms[8]), 0), coalesce(sum(durations_ms[9]), 0), coalesce(sum(durations_ms[10]), 0), coalesce(sum(durations_ms[11]), 0), coalesce(sum(durations_ms[12]), 0), coalesce(sum(durations_ms[13]), 0), coalesce(sum(durations_ms[14]), 0), coalesce(sum(durations_ms[15]), 0), coalesce(sum(durations_ms[16]), 0), coalesce(sum(durations_ms[17]), 0), coalesce(sum(durations_ms[18]), 0), coalesce(sum(durations_ms[19]), 0)]::bigint[] ELSE '{}' END AS durations_ms, sum(ready)::bigint AS ready_sum,
         max(oldest_ready_seconds) AS oldest_ready_seconds
  FROM binned GROUP BY i
), sampled AS (
  SELECT floor(extract(epoch FROM m.minute - b.since) / %(bucket)s)::int AS i, count(*) AS minutes
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

-- name: SERIES_QUEUE --
WITH 
bounds AS (
  SELECT to_timestamp((floor(extract(epoch FROM now()) / %(bucket)s) - (%(buckets)s - 1)) * %(bucket)s) AS since,
         now() AS as_of
), sources AS (
  SELECT s.minute AS at, s.enqueued, s.completed, s.failed, s.duration_max_ms, s.durations_ms,
         coalesce(s.ready, 0) AS ready, s.oldest_ready_seconds
  FROM jobq.queue_stats s, bounds b
  WHERE s.queue_name = %(queue)s AND s.minute >= b.since
  UNION ALL
  SELECT h.hour, h.enqueued, h.completed, h.failed, h.duration_max_ms, h.durations_ms, h.ready_sum,
         h.oldest_ready_seconds
  FROM jobq.queue_stats_hourly h, bounds b
  WHERE h.queue_name = %(queue)s AND h.hour >= b.since
), binned AS (
  SELECT floor(extract(epoch FROM r.at - b.since) / %(bucket)s)::int AS i, r.* FROM sources r, bounds b
), totals AS (
  SELECT i, sum(enqueued)::bigint AS enqueued, sum(completed)::bigint AS completed, sum(failed)::bigint AS failed,
         max(duration_max_ms) FILTER (WHERE completed > 0) AS duration_max_ms,
         CASE WHEN max(cardinality(durations_ms)) > 0 THEN ARRAY[coalesce(sum(durations_ms[1]), 0), coalesce(sum(durations_ms[2]), 0), coalesce(sum(durations_ms[3]), 0), coalesce(sum(durations_ms[4]), 0), coalesce(sum(durations_ms[5]), 0), coalesce(sum(durations_ms[6]), 0), coalesce(sum(durations_ms[7]), 0), coalesce(sum(durations_ms[8]), 0), coalesce(sum(durations_ms[9]), 0), coalesce(sum(durations_ms[10]), 0), coalesce(sum(durations_ms[11]), 0), coalesce(sum(durations_ms[12]), 0), coalesce(sum(durations_ms[13]), 0), coalesce(sum(durations_ms[14]), 0), coalesce(sum(durations_ms[15]), 0), coalesce(sum(durations_ms[16]), 0), coalesce(sum(durations_ms[17]), 0), coalesce(sum(durations_ms[18]), 0), coalesce(sum(durations_ms[19]), 0)]::bigint[] ELSE '{}' END AS durations_ms, sum(ready)::bigint AS ready_sum,
         max(oldest_ready_seconds) AS oldest_ready_seconds
  FROM binned GROUP BY i
), sampled AS (
  SELECT floor(extract(epoch FROM m.minute - b.since) / %(bucket)s)::int AS i, count(*) AS minutes
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

-- name: SPARKLINES --
WITH 
bounds AS (
  SELECT to_timestamp((floor(extract(epoch FROM now()) / %(bucket)s) - (%(buckets)s - 1)) * %(bucket)s) AS since,
         now() AS as_of
), names AS (
  SELECT queue_name FROM (
    SELECT split_part(s.queue_name, '#', 1) AS queue_name FROM jobq.queue_stats s, bounds b
    WHERE s.minute >= b.since AND 
  (%(queues)s::text[] IS NULL OR split_part(s.queue_name, '#', 1) = ANY(%(queues)s::text[])) AND split_part(s.queue_name, '#', 1) > %(after)s::text
  AND (%(allowed)s::text IS NULL OR split_part(split_part(s.queue_name, '#', 1), '#', 1) ~ %(allowed)s::text)
    UNION
    SELECT split_part(h.queue_name, '#', 1) FROM jobq.queue_stats_hourly h, bounds b
    WHERE h.hour >= b.since AND 
  (%(queues)s::text[] IS NULL OR split_part(h.queue_name, '#', 1) = ANY(%(queues)s::text[])) AND split_part(h.queue_name, '#', 1) > %(after)s::text
  AND (%(allowed)s::text IS NULL OR split_part(split_part(h.queue_name, '#', 1), '#', 1) ~ %(allowed)s::text)
  ) u
  ORDER BY queue_name
  LIMIT %(n)s
), sources AS (
  SELECT split_part(s.queue_name, '#', 1) AS queue_name, s.minute AS at, s.enqueued, s.completed, s.failed,
         coalesce(s.ready, 0) AS ready
  FROM jobq.queue_stats s, bounds b
  WHERE s.minute >= b.since AND split_part(s.queue_name, '#', 1) IN (SELECT queue_name FROM names)
  UNION ALL
  SELECT split_part(h.queue_name, '#', 1), h.hour, h.enqueued, h.completed, h.failed, h.ready_sum
  FROM jobq.queue_stats_hourly h, bounds b
  WHERE h.hour >= b.since AND split_part(h.queue_name, '#', 1) IN (SELECT queue_name FROM names)
)
SELECT r.queue_name AS queue, floor(extract(epoch FROM r.at - b.since) / %(bucket)s)::int AS bucket, sum(r.enqueued)::bigint AS enqueued,
       sum(r.completed)::bigint AS completed, sum(r.failed)::bigint AS failed, sum(r.ready)::bigint AS ready_sum
FROM sources r, bounds b
GROUP BY 1, 2
ORDER BY 1, 2

-- name: STATS_HOURS_ADD --
INSERT INTO jobq.queue_stats_hourly AS h (queue_name, hour, enqueued, claimed, completed, failed, retried, lease_expired, cancelled, released, empty_claims, duration_max_ms, durations_ms,
                                     ready_sum, oldest_ready_seconds)
SELECT s.queue_name, date_trunc('hour', s.minute) AS hour, sum(s.enqueued)::bigint, sum(s.claimed)::bigint, sum(s.completed)::bigint, sum(s.failed)::bigint, sum(s.retried)::bigint, sum(s.lease_expired)::bigint, sum(s.cancelled)::bigint, sum(s.released)::bigint, sum(s.empty_claims)::bigint,
       max(s.duration_max_ms), CASE WHEN max(cardinality(s.durations_ms)) > 0 THEN ARRAY[coalesce(sum(s.durations_ms[1]), 0), coalesce(sum(s.durations_ms[2]), 0), coalesce(sum(s.durations_ms[3]), 0), coalesce(sum(s.durations_ms[4]), 0), coalesce(sum(s.durations_ms[5]), 0), coalesce(sum(s.durations_ms[6]), 0), coalesce(sum(s.durations_ms[7]), 0), coalesce(sum(s.durations_ms[8]), 0), coalesce(sum(s.durations_ms[9]), 0), coalesce(sum(s.durations_ms[10]), 0), coalesce(sum(s.durations_ms[11]), 0), coalesce(sum(s.durations_ms[12]), 0), coalesce(sum(s.durations_ms[13]), 0), coalesce(sum(s.durations_ms[14]), 0), coalesce(sum(s.durations_ms[15]), 0), coalesce(sum(s.durations_ms[16]), 0), coalesce(sum(s.durations_ms[17]), 0), coalesce(sum(s.durations_ms[18]), 0), coalesce(sum(s.durations_ms[19]), 0)]::bigint[] ELSE '{}' END, sum(coalesce(s.ready, 0))::bigint,
       max(s.oldest_ready_seconds)
FROM jobq.queue_stats s
WHERE s.queue_name = %(queue)s AND s.minute = ANY(%(minutes)s::timestamptz[])
GROUP BY 1, 2
ORDER BY 2
ON CONFLICT (queue_name, hour) DO UPDATE SET
  enqueued = h.enqueued + EXCLUDED.enqueued, claimed = h.claimed + EXCLUDED.claimed, completed = h.completed + EXCLUDED.completed, failed = h.failed + EXCLUDED.failed, retried = h.retried + EXCLUDED.retried, lease_expired = h.lease_expired + EXCLUDED.lease_expired, cancelled = h.cancelled + EXCLUDED.cancelled, released = h.released + EXCLUDED.released, empty_claims = h.empty_claims + EXCLUDED.empty_claims,
  duration_max_ms = greatest(h.duration_max_ms, EXCLUDED.duration_max_ms),
  durations_ms = coalesce((SELECT array_agg(coalesce(a, 0) + coalesce(b, 0) ORDER BY i)
                           FROM unnest(h.durations_ms, EXCLUDED.durations_ms) WITH ORDINALITY AS x(a, b, i)), '{}'),
  ready_sum = h.ready_sum + EXCLUDED.ready_sum,
  oldest_ready_seconds = greatest(h.oldest_ready_seconds, EXCLUDED.oldest_ready_seconds)

-- name: STATS_MINUTES_DELETE --
DELETE FROM jobq.queue_stats WHERE queue_name = %(queue)s AND minute = ANY(%(minutes)s::timestamptz[])

-- name: STATS_MINUTES_TAKE --
-- The queue's minutes before the hour that began a day ago, oldest first, locked until they are moved. SKIP
-- LOCKED: a row a late flush is adding to is left for the next pass, which also moves any minute a flush adds
-- after its hour was rolled up, so the hours stay exact.
SELECT minute FROM jobq.queue_stats
WHERE queue_name = %(queue)s AND minute < %(before)s
ORDER BY minute
LIMIT %(batch)s
FOR UPDATE SKIP LOCKED

-- name: STATS_OLD_QUEUES --
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
