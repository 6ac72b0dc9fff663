-- Rendered from app/db/sqs.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: JOBQ_QUEUE_KNOWN --
-- A queue with jobs to hand out (pending, waiting or running), enqueued over jobq's API: GetQueueUrl answers
-- for it, so that they can be received over SQS. A deleted SQS queue has none left (its purge cancelled them).
SELECT EXISTS (SELECT 1 FROM jobq.jobs WHERE queue_name = %(queue)s AND status IN ('pending', 'running', 'waiting'))

-- name: JOBS_PURGE --
WITH stamp AS (
  SELECT clock_timestamp() AS now  -- here, not in the UPDATE: Citus refuses a VOLATILE function there
), target AS (
  -- A batch of the queue's unfinished jobs (ready, delayed, waiting, running); SKIP LOCKED: a job a worker
  -- is completing right now is left to it (it finishes, which is what a purge wants too).
  SELECT id, queue_name AS queue, status AS was FROM jobq.jobs
  WHERE queue_name = %(queue)s AND status IN ('pending', 'running', 'waiting')
  ORDER BY id
  LIMIT %(batch)s
  FOR UPDATE SKIP LOCKED
), purged AS (
  -- Cancelled, as DELETE /jobs/{{id}} would: kept for the dashboard until retention removes them; a running
  -- job keeps its token, so that its worker's heartbeat learns of the cancel and its complete is refused.
  UPDATE jobq.jobs AS j
  SET status = 'cancelled', finished_at = st.now, lease_expires_at = NULL,
      last_error = 'purged (SQS PurgeQueue)'
  FROM target t CROSS JOIN stamp st WHERE j.queue_name = %(queue)s AND j.id = t.id
  RETURNING t.queue, j.status, j.id, t.was, coalesce(j.has_dependants, false) AS has_dependants
)
-- What each job was before (app/core/effects.py: a running or pending job frees its slot or group's turn),
-- and whether jobs depend on it (the release then has work; jobs_purge records them for it and counts the
-- batch, in the same transaction: app/db/admin.py says why not here).
SELECT id, was, has_dependants FROM purged

-- name: SQS_DEAD_LETTER_SOURCES --
-- The queues whose RedrivePolicy names this queue's ARN as their dead-letter target. Its end compared
-- as text, not with LIKE: `_` in a queue name would match any character.
SELECT queue_name FROM jobq.sqs_queues
WHERE redrive_policy IS NOT NULL
  AND right(redrive_policy::jsonb ->> 'deadLetterTargetArn', length(%(queue)s) + 1) = ':' || %(queue)s
ORDER BY queue_name COLLATE "C"

-- name: SQS_DEDUP_BIND --
-- The ids just taken, bound to the jobs this transaction inserted.
UPDATE jobq.sqs_dedup AS d SET job_id = b.job_id
FROM json_to_recordset(%(binds)s::json) AS b(dedup_id text, job_id bigint)
WHERE d.queue_name = %(queue)s AND d.dedup_id = b.dedup_id

-- name: SQS_DEDUP_EXPIRED_QUEUES --
-- The queues with expired deduplication ids (the retention service); on Citus a read of every shard of a small
-- table (ids live five minutes).
SELECT DISTINCT queue_name FROM jobq.sqs_dedup WHERE expires_at <= coalesce(%(now)s::timestamptz, now())

-- name: SQS_DEDUP_FOUND --
-- The jobs the live deduplication ids already name.
SELECT dedup_id, job_id FROM jobq.sqs_dedup WHERE queue_name = %(queue)s AND dedup_id = ANY(%(ids)s::text[])

-- name: SQS_DEDUP_PRUNE --
-- Expired deduplication ids of one queue, a batch at a time (the retention service).
DELETE FROM jobq.sqs_dedup WHERE queue_name = %(queue)s AND ctid = ANY(ARRAY(
  SELECT ctid FROM jobq.sqs_dedup
  WHERE queue_name = %(queue)s AND expires_at <= coalesce(%(now)s::timestamptz, now())
  LIMIT %(batch)s
))

-- name: SQS_DEDUP_TAKE --
-- Take each deduplication id for five minutes (the window), in the sending transaction. A live row (another
-- send's, committed, or in flight: the unique index makes this wait for it) is left alone and not returned:
-- that message is a duplicate. An expired row is taken over in place.
INSERT INTO jobq.sqs_dedup AS d (queue_name, dedup_id, job_id, expires_at)
SELECT %(queue)s, t.id, 0, now() + make_interval(secs => 300)
FROM unnest(%(ids)s::text[]) AS t(id)
ORDER BY t.id COLLATE "C"  -- keys taken in one order: two batches cannot wait on each other in a cycle
ON CONFLICT (queue_name, dedup_id) DO UPDATE SET job_id = 0, expires_at = EXCLUDED.expires_at
  -- Expired: d.expires_at <= now(), said with IMMUTABLE functions and no parameter, as Citus requires here:
  -- EXCLUDED's expiry less the window is now(), and times at a named zone compare exactly as timestamptz do.
  WHERE (d.expires_at AT TIME ZONE 'UTC')
        <= (EXCLUDED.expires_at AT TIME ZONE 'UTC') - make_interval(secs => 300)
RETURNING d.dedup_id

-- name: SQS_MESSAGES_DELETE --
DELETE FROM jobq.sqs_messages WHERE job_id = ANY(%(ids)s::bigint[])

-- name: SQS_MESSAGES_GET --
SELECT job_id, attributes::text, dedup_id FROM jobq.sqs_messages WHERE job_id = ANY(%(ids)s::bigint[])

-- name: SQS_MESSAGES_INSERT --
INSERT INTO jobq.sqs_messages (job_id, attributes, dedup_id)
SELECT job_id, attributes, dedup_id
FROM json_to_recordset(%(rows)s::json) AS t(job_id bigint, attributes jsonb, dedup_id text)

-- name: SQS_MESSAGES_JOBS --
SELECT id FROM jobq.jobs WHERE id = ANY(%(ids)s::bigint[])

-- name: SQS_MESSAGES_PAGE --
SELECT job_id FROM jobq.sqs_messages WHERE job_id > %(after)s ORDER BY job_id LIMIT %(batch)s

-- name: SQS_MOVE_TASK_SET --
UPDATE jobq.sqs_queues SET move_task = %(task)s::jsonb WHERE queue_name = %(queue)s

-- name: SQS_QUEUES_LIST --
-- ListQueues: names in order, from a prefix, a page at a time (`after`: the last name of the page before).
SELECT queue_name FROM jobq.sqs_queues
WHERE queue_name LIKE %(prefix)s || '%%' AND (%(after)s::text IS NULL OR queue_name > %(after)s)
ORDER BY queue_name COLLATE "C"
LIMIT %(limit)s

-- name: SQS_QUEUE_CREATE --
-- CreateQueue of an existing queue answers with it (SQS compares the attributes: app/core/sqs.py does),
-- so a conflict inserts nothing and the row is read back as it is.
WITH made AS (
  INSERT INTO jobq.sqs_queues (queue_name, delay_seconds, receive_wait_seconds, maximum_message_size,
                          retention_seconds, content_based_dedup, redrive_policy, tags)
  VALUES (%(queue)s, %(delay_seconds)s, %(receive_wait_seconds)s, %(maximum_message_size)s,
          %(retention_seconds)s, %(content_based_dedup)s, %(redrive_policy)s, %(tags)s::jsonb)
  ON CONFLICT (queue_name) DO NOTHING
  RETURNING queue_name AS queue, created_at, modified_at, delay_seconds, receive_wait_seconds, maximum_message_size, retention_seconds, content_based_dedup, redrive_policy, tags::text AS tags, move_task::text AS move_task, true AS created
)
SELECT * FROM made
UNION ALL
SELECT queue_name AS queue, created_at, modified_at, delay_seconds, receive_wait_seconds, maximum_message_size, retention_seconds, content_based_dedup, redrive_policy, tags::text AS tags, move_task::text AS move_task, false FROM jobq.sqs_queues WHERE queue_name = %(queue)s AND NOT EXISTS (SELECT 1 FROM made)

-- name: SQS_QUEUE_DELETE --
DELETE FROM jobq.sqs_queues WHERE queue_name = %(queue)s

-- name: SQS_QUEUE_GET --
SELECT queue_name AS queue, created_at, modified_at, delay_seconds, receive_wait_seconds, maximum_message_size, retention_seconds, content_based_dedup, redrive_policy, tags::text AS tags, move_task::text AS move_task FROM jobq.sqs_queues WHERE queue_name = %(queue)s

-- name: SQS_QUEUE_TAG --
-- TagQueue adds and overwrites, UntagQueue removes keys; both keep the other tags.
UPDATE jobq.sqs_queues SET tags = (tags || %(add)s::jsonb) - %(remove)s::text[], modified_at = now()
WHERE queue_name = %(queue)s
