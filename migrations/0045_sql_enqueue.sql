-- jobq: own-schema
-- Enqueue from SQL, in the caller's own transaction (issue 24 item 1; docs/producers.md "Enqueue from SQL, in
-- your own transaction"): enqueue() and enqueue_batch() make a job, or a batch of them, with every option of
-- the HTTP enqueue, and the job commits or rolls back with the caller's transaction (River's InsertTx,
-- graphile-worker's add_job). Names are unqualified: the runner creates them in jobq's own schema (never in public:
-- the header above; an installation still in public gets them when its tables move), and each function pins
-- search_path = pg_catalog, <that schema>, pg_temp (never its caller's; see "who may call them" below).
--
-- Same rules as POST /queues/{queue}/jobs (app/models/jobs.py, app/core/jobs.py), the same statements' effects
-- (app/db/jobs.py, app/db/debounce.py, app/db/dependencies.py): the same indexes decide unique and debounce, the
-- same advisory lock key serialises a debounce key between HTTP and SQL, dependency rows are written as the HTTP
-- path writes them (the parents are marked by the service after the commit instead: enqueue() says how). A refusal is an exception (SQLSTATE 22023, JQ409, JQ429, 0A000: enqueue_refuse and the
-- docs), which aborts the caller's transaction: never a half-made job.
--
-- What the service learns: a job due now is announced by a NOTIFY on jobq_wakeup (app/db/channels.py) in the
-- message grammar of app/core/wakeups.py ("<sender> w <queue>", sender "sql"), and jobs that wait for others by
-- "sql d <queue> <id> ..." (their parents are marked by the service after the commit: no parent row is written
-- or locked beyond FOR KEY SHARE in the caller's transaction); PostgreSQL delivers both at commit, never on
-- rollback. A job due later is found by each process's fallback poll, as an HTTP one is.
-- GET /queues and the stats read the jobs themselves: a queue needs no registration.
--
-- Only functions and grants: no table is touched, nothing here locks what enqueues or claims use.

-- --- an application's own functions are never replaced ---------------------------------------------------------
-- CREATE OR REPLACE below would silently replace a function of the same name and arguments in this schema; one
-- that is not jobq's (its comment, set at the end of this file, starts 'jobq:') stops the migration instead.
DO $$
DECLARE
  sig text;
  f regprocedure;
BEGIN
  FOREACH sig IN ARRAY ARRAY[
    'enqueue(text, jsonb, integer, timestamptz, double precision, integer, text, text, integer, bigint[], text,
             boolean, text, integer, text[], text, double precision, double precision, text)',
    'enqueue_batch(text, jsonb, text)',
    'enqueue_job(text, jsonb, integer, timestamptz, double precision, integer, text, text, integer, bigint[], text,
                 boolean, text, integer, text[], text, double precision, double precision, text, text, integer,
                 integer)',
    'enqueue_queue(text)',
    'enqueue_item_field(jsonb, text, text, text)',
    'enqueue_check_quotas(text, boolean)',
    'enqueue_queue_live(text)',
    'enqueue_deeper_than(jsonb, integer)',
    'enqueue_check_label(text, text, bigint)',
    'enqueue_refuse(text, text, text)',
    'enqueue_limit(text)'
  ]
  LOOP
    f := to_regprocedure(format('%I.%s', current_schema(), sig));
    IF f IS NOT NULL AND coalesce(obj_description(f, 'pg_proc'), '') NOT LIKE 'jobq:%' THEN
      RAISE EXCEPTION USING ERRCODE = '42723',
        MESSAGE = format('jobq migration 0045: function %s already exists in schema %s and is not jobq''s', f,
                         current_schema()),
        HINT = 'jobq makes enqueue() and its helpers in its own schema. Rename or move that function, or give '
               'jobq a schema of its own (JOBQ_DB_SCHEMA), then migrate again.';
    END IF;
  END LOOP;
END
$$;

-- --- limits ----------------------------------------------------------------------------------------------------
-- The settings' defaults (app/settings.py): a process's JOBQ_* environment is not visible from SQL, and a GUC
-- would be the caller's to change. A queue's own configuration (queue_state) is read as HTTP reads it.
CREATE OR REPLACE FUNCTION enqueue_limit(name text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path FROM CURRENT
AS $$
  SELECT CASE name
    WHEN 'max_payload_bytes' THEN 1048576          -- JOBQ_MAX_PAYLOAD_BYTES
    WHEN 'max_json_depth' THEN 32                  -- JOBQ_MAX_JSON_DEPTH
    WHEN 'max_key_length' THEN 255                 -- JOBQ_MAX_IDEMPOTENCY_KEY_LENGTH (idempotency_key, group)
    WHEN 'max_delay_seconds' THEN 31536000         -- JOBQ_MAX_DELAY_SECONDS
    WHEN 'default_max_attempts' THEN 5             -- JOBQ_DEFAULT_MAX_ATTEMPTS
    WHEN 'max_dependencies' THEN 100               -- JOBQ_MAX_DEPENDENCIES
    WHEN 'max_dependency_depth' THEN 1000          -- JOBQ_MAX_DEPENDENCY_DEPTH
    WHEN 'max_batch_jobs' THEN 1000                -- JOBQ_MAX_BATCH_JOBS
    WHEN 'max_pending_jobs' THEN 1000000           -- JOBQ_MAX_PENDING_JOBS (a queue's max_pending wins)
    WHEN 'max_queues' THEN 10000                   -- JOBQ_MAX_QUEUES
  END
$$;

-- --- refusals --------------------------------------------------------------------------------------------------
-- A bad argument: SQLSTATE 22023 (invalid_parameter_value), the message naming the field (also in the error's
-- column_name, for programs), what HTTP answers 422 for.
CREATE OR REPLACE FUNCTION enqueue_refuse(field text, message text, hint text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  RAISE EXCEPTION USING ERRCODE = '22023', COLUMN = field, MESSAGE = format('jobq enqueue: %s: %s', field, message),
    HINT = coalesce(hint, 'Nothing was enqueued, and the transaction is aborted: fix the argument and run it again.');
END
$$;

-- A label (idempotency key, group, unique and debounce keys, batch refs): printable text without control
-- characters, 1 to max_length characters (app/models/fields.py LABEL_PATTERN).
CREATE OR REPLACE FUNCTION enqueue_check_label(value text, field text, max_length bigint) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  IF value IS NOT NULL AND (length(value) NOT BETWEEN 1 AND max_length OR value !~ '^[^\x01-\x1f\x7f]+$') THEN
    PERFORM enqueue_refuse(field, format('must be 1 to %s characters without control characters', max_length));
  END IF;
END
$$;

-- Whether a JSON value nests containers deeper than `depth` (the outermost container is level 1, as
-- app/models/json_values.py counts). Walked only when the text holds enough brackets to be that deep.
CREATE OR REPLACE FUNCTION enqueue_deeper_than(value jsonb, depth integer) RETURNS boolean
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
  WITH RECURSIVE text_form AS (SELECT value::text AS t),
  walk(v, d) AS (
    SELECT value, 1 WHERE jsonb_typeof(value) IN ('object', 'array')
    UNION ALL
    SELECT e.v, w.d + 1
    FROM walk w
    CROSS JOIN LATERAL (
      SELECT a AS v FROM jsonb_array_elements(CASE WHEN jsonb_typeof(w.v) = 'array' THEN w.v END) a
      UNION ALL
      SELECT o.value FROM jsonb_each(CASE WHEN jsonb_typeof(w.v) = 'object' THEN w.v END) o
    ) e
    WHERE w.d <= depth AND jsonb_typeof(e.v) IN ('object', 'array')
  )
  SELECT CASE
    WHEN (SELECT length(t) - length(translate(t, '{[', '')) FROM text_form) <= depth THEN false
    ELSE EXISTS (SELECT FROM walk WHERE d > depth)
  END
$$;

-- --- a queue's quotas ------------------------------------------------------------------------------------------
-- Whether a queue is live: a job not finished yet, or a configuration (app/db/quotas.py QUEUE_LIVE).
CREATE OR REPLACE FUNCTION enqueue_queue_live(queue text) RETURNS boolean
LANGUAGE sql STABLE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
  SELECT EXISTS (SELECT 1 FROM jobs WHERE queue_name = queue AND status = 'pending')
      OR EXISTS (SELECT 1 FROM jobs WHERE queue_name = queue AND status = 'waiting')
      OR EXISTS (SELECT 1 FROM jobs WHERE queue_name = queue AND status = 'running' COLLATE "C")
      OR EXISTS (SELECT 1 FROM queue_state WHERE queue_name = queue)
$$;

-- After the call's jobs are written: refuse (and so abort everything) when the queue now holds more jobs not yet
-- started than its max_pending (JQ429, HTTP's 429 queue-full), or when it was not live before and the service
-- now holds more live queues than JOBQ_MAX_QUEUES (JQ409, HTTP's 409 too-many-queues). Counted exactly, each
-- count stopping past its limit (app/db/quotas.py): min(backlog, limit) index entries. Counted after the write,
-- so a unique hit or a debounce that only replaced a job adds nothing and is never refused for a full queue.
CREATE OR REPLACE FUNCTION enqueue_check_quotas(queue text, was_live boolean) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
DECLARE
  v_limit bigint;
  v_count bigint;
  v_cap bigint := enqueue_limit('max_queues');
BEGIN
  SELECT coalesce((SELECT s.max_pending FROM queue_state s WHERE s.queue_name = queue),
                  enqueue_limit('max_pending_jobs')) INTO v_limit;
  SELECT (SELECT count(*) FROM (SELECT 1 FROM jobs j WHERE j.queue_name = queue AND j.status = 'pending'
                                LIMIT v_limit + 1) p)
       + (SELECT count(*) FROM (SELECT 1 FROM jobs j WHERE j.queue_name = queue AND j.status = 'waiting'
                                LIMIT v_limit + 1) w)
  INTO v_count;
  IF v_count > v_limit THEN
    RAISE EXCEPTION USING ERRCODE = 'JQ429',
      MESSAGE = format('jobq enqueue: queue %s would hold %s jobs not yet started; its limit is %s', queue, v_count, v_limit),
      HINT = 'Its max_pending (PATCH /queues/{queue}/config), else JOBQ_MAX_PENDING_JOBS''s default. Nothing was '
             'enqueued and the transaction is aborted: retry once workers have taken some.';
  END IF;
  IF was_live THEN
    RETURN;
  END IF;
  -- Live queues, at most v_cap + 1: loose scans of the pending, waiting and running jobs' indexes, and the
  -- configured queues (app/db/quotas.py QUEUES_LIVE_COUNT).
  WITH RECURSIVE pending(name, n) AS (
    (SELECT j.queue_name, 1 FROM jobs j WHERE j.status = 'pending' ORDER BY j.queue_name LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue_name FROM jobs j WHERE j.status = 'pending' AND j.queue_name > p.name
            ORDER BY j.queue_name LIMIT 1), p.n + 1
    FROM pending p WHERE p.name IS NOT NULL AND p.n <= v_cap
  ), waiting(name, n) AS (
    (SELECT j.queue_name, 1 FROM jobs j WHERE j.status = 'waiting' ORDER BY j.queue_name LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue_name FROM jobs j WHERE j.status = 'waiting' AND j.queue_name > w.name
            ORDER BY j.queue_name LIMIT 1), w.n + 1
    FROM waiting w WHERE w.name IS NOT NULL AND w.n <= v_cap
  ), running(name, n) AS (
    (SELECT j.queue_name, 1 FROM jobs j WHERE j.status = 'running' COLLATE "C" ORDER BY j.queue_name LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue_name FROM jobs j WHERE j.status = 'running' COLLATE "C" AND j.queue_name > r.name
            ORDER BY j.queue_name LIMIT 1), r.n + 1
    FROM running r WHERE r.name IS NOT NULL AND r.n <= v_cap
  )
  SELECT count(*) INTO v_count FROM (
    SELECT name FROM pending WHERE name IS NOT NULL
    UNION SELECT name FROM waiting WHERE name IS NOT NULL
    UNION SELECT name FROM running WHERE name IS NOT NULL
    UNION (SELECT s.queue_name FROM queue_state s ORDER BY s.queue_name LIMIT v_cap + 1)
    LIMIT v_cap + 1
  ) q;
  IF v_count > v_cap THEN
    RAISE EXCEPTION USING ERRCODE = 'JQ409',
      MESSAGE = format('jobq enqueue: queue %s would be one more than the %s live queues the service may hold', queue, v_cap),
      HINT = 'Live queues hold jobs not yet finished or a configuration (JOBQ_MAX_QUEUES''s default). Nothing was '
             'enqueued and the transaction is aborted.';
  END IF;
END
$$;

-- --- one job ---------------------------------------------------------------------------------------------------
-- Checks and writes one job; returns its id (a new job's, or the job an idempotency key, a unique key or a
-- debounce key named) and whether it is pending and due now (a claim should be woken at commit). `at` names the
-- fields in refusals: NULL for enqueue() (its parameter names), 'jobs[n]' for an item of enqueue_batch() (the
-- HTTP body's names). `priority_default`, `max_attempts_default`: the queue's configuration, else the defaults.
CREATE OR REPLACE FUNCTION enqueue_job(
  p_queue text, p_payload jsonb, p_priority integer, p_run_at timestamptz, p_delay double precision,
  p_max_attempts integer, p_idem text, p_group text, p_timeout integer, p_depends_on bigint[], p_policy text,
  p_unique boolean, p_ukey text, p_ufor integer, p_uwhile text[], p_dkey text, p_dsec double precision,
  p_dwait double precision, p_traceparent text, p_at text, p_priority_default integer,
  p_max_attempts_default integer,
  OUT job_id bigint, OUT due boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v_batch boolean := p_at IS NOT NULL;
  v_is_unique boolean := coalesce(p_unique, false) OR p_ukey IS NOT NULL OR p_ufor IS NOT NULL OR p_uwhile IS NOT NULL;
  v_states text[];
  v_ukey text;
  v_ufrom timestamptz;
  v_ids bigint[];
  v_found_ids bigint[];
  v_found_status text[];
  v_found_queue text[];
  v_found_depth integer[];
  v_status text := 'pending';
  v_pending integer := 0;
  v_depth integer := 0;
  v_bad text;
  v_unfinished bigint[] := '{}';
  v_unfinished_queue text[] := '{}';
  v_finished_at timestamptz;
  v_tp text[];
  v_created boolean;
  v_run_at timestamptz;
  i integer;
  k integer;
BEGIN
  -- -- the checks (app/models/jobs.py EnqueueRequest, app/core/jobs.py) ------------------------------------------
  IF p_payload IS NULL THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, 'payload'), 'is required (JSON null is ''null''::jsonb)');
  END IF;
  IF octet_length(p_payload::text) > enqueue_limit('max_payload_bytes') THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, 'payload'),
      format('larger than %s bytes of JSON', enqueue_limit('max_payload_bytes')));
  END IF;
  IF enqueue_deeper_than(p_payload, enqueue_limit('max_json_depth')::integer) THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, 'payload'),
      format('nesting deeper than %s levels', enqueue_limit('max_json_depth')));
  END IF;
  IF p_priority IS NOT NULL AND p_priority NOT BETWEEN -32768 AND 32767 THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, 'priority'), 'must be between -32768 and 32767');
  END IF;
  IF p_run_at IS NOT NULL AND NOT isfinite(p_run_at) THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, 'run_at'), 'must be a finite time');
  END IF;
  IF p_delay IS NOT NULL AND NOT (p_delay >= 0 AND p_delay <= enqueue_limit('max_delay_seconds')) THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, 'delay_seconds'),
      format('must be between 0 and %s', enqueue_limit('max_delay_seconds')));
  END IF;
  IF p_run_at IS NOT NULL AND p_delay IS NOT NULL THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, 'run_at'), 'give run_at or delay_seconds, not both');
  END IF;
  IF p_max_attempts IS NOT NULL AND p_max_attempts NOT BETWEEN 1 AND 1000 THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, 'max_attempts'), 'must be between 1 and 1000');
  END IF;
  PERFORM enqueue_check_label(p_idem, concat_ws('.', p_at, 'idempotency_key'), enqueue_limit('max_key_length'));
  PERFORM enqueue_check_label(p_group, concat_ws('.', p_at, CASE WHEN v_batch THEN 'group' ELSE 'group_key' END),
                              enqueue_limit('max_key_length'));
  IF p_timeout IS NOT NULL AND p_timeout NOT BETWEEN 1 AND 604800 THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, 'timeout_seconds'), 'must be between 1 and 604800');
  END IF;
  IF p_depends_on IS NOT NULL THEN
    IF cardinality(p_depends_on) > enqueue_limit('max_dependencies') THEN
      PERFORM enqueue_refuse(concat_ws('.', p_at, 'depends_on'),
        format('at most %s entries', enqueue_limit('max_dependencies')));
    END IF;
    IF EXISTS (SELECT FROM unnest(p_depends_on) d WHERE d IS NULL OR d < 1) THEN
      PERFORM enqueue_refuse(concat_ws('.', p_at, 'depends_on'), 'job ids are positive integers');
    END IF;
  END IF;
  IF p_policy IS NOT NULL AND p_policy NOT IN ('cancel', 'run') THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, 'on_dependency_failure'), 'must be cancel or run');
  END IF;
  IF p_policy IS NOT NULL AND coalesce(cardinality(p_depends_on), 0) = 0 THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, 'on_dependency_failure'), 'applies to a job with depends_on');
  END IF;
  -- unique
  IF p_unique IS FALSE AND v_is_unique THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, 'unique_job'), 'false, yet unique_key, unique_for_seconds or unique_while given');
  END IF;
  PERFORM enqueue_check_label(p_ukey, concat_ws('.', p_at, CASE WHEN v_batch THEN 'unique.key' ELSE 'unique_key' END), 255);
  IF p_ufor IS NOT NULL AND p_ufor NOT BETWEEN 1 AND 31622400 THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, CASE WHEN v_batch THEN 'unique.for_seconds' ELSE 'unique_for_seconds' END),
      'must be between 1 and 31622400');
  END IF;
  IF p_uwhile IS NOT NULL THEN
    IF cardinality(p_uwhile) NOT BETWEEN 1 AND 5
       OR EXISTS (SELECT FROM unnest(p_uwhile) s
                  WHERE s IS NULL OR s NOT IN ('pending', 'running', 'completed', 'failed', 'cancelled')) THEN
      PERFORM enqueue_refuse(concat_ws('.', p_at, CASE WHEN v_batch THEN 'unique.while' ELSE 'unique_while' END),
        '1 to 5 of the states pending, running, completed, failed, cancelled');
    END IF;
    IF NOT p_uwhile @> ARRAY['pending', 'running'] THEN
      PERFORM enqueue_refuse(concat_ws('.', p_at, CASE WHEN v_batch THEN 'unique.while' ELSE 'unique_while' END),
        'must include pending and running: a job moves between them by itself (claimed, its lease lapsed, '
        'retried), and may not meet a second job with its key');
    END IF;
  END IF;
  IF v_is_unique AND p_idem IS NOT NULL THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, CASE WHEN v_batch THEN 'unique' ELSE 'unique_key' END),
      'give unique or idempotency_key, not both: an idempotency key is a unique key that holds in every state');
  END IF;
  -- debounce
  PERFORM enqueue_check_label(p_dkey, concat_ws('.', p_at, CASE WHEN v_batch THEN 'debounce.key' ELSE 'debounce_key' END), 255);
  IF (p_dkey IS NULL) <> (p_dsec IS NULL) THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, CASE WHEN v_batch THEN 'debounce' ELSE 'debounce_seconds' END),
      'debounce_key and debounce_seconds go together');
  END IF;
  IF p_dkey IS NULL AND p_dwait IS NOT NULL THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, 'debounce_max_wait_seconds'), 'applies to a debounced job (debounce_key)');
  END IF;
  IF p_dsec IS NOT NULL AND NOT (p_dsec >= 0 AND p_dsec <= 31622400) THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, CASE WHEN v_batch THEN 'debounce.seconds' ELSE 'debounce_seconds' END),
      'must be between 0 and 31622400');
  END IF;
  IF p_dwait IS NOT NULL AND NOT (p_dwait >= 0 AND p_dwait <= 31622400) THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, CASE WHEN v_batch THEN 'debounce.max_wait_seconds' ELSE 'debounce_max_wait_seconds' END),
      'must be between 0 and 31622400');
  END IF;
  IF p_dwait < p_dsec THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, CASE WHEN v_batch THEN 'debounce.max_wait_seconds' ELSE 'debounce_max_wait_seconds' END),
      'must be at least debounce seconds');
  END IF;
  IF p_dkey IS NOT NULL AND (v_is_unique OR p_idem IS NOT NULL OR cardinality(p_depends_on) > 0 OR p_run_at IS NOT NULL
                             OR p_delay IS NOT NULL) THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, CASE WHEN v_batch THEN 'debounce' ELSE 'debounce_key' END),
      'debounce goes with none of unique, idempotency_key, depends_on, run_at, delay_seconds: a debounced job''s '
      'run time and identity are its debounce key''s');
  END IF;
  IF v_is_unique AND cardinality(p_depends_on) > 0 THEN
    PERFORM enqueue_refuse(concat_ws('.', p_at, CASE WHEN v_batch THEN 'unique' ELSE 'unique_key' END),
      'unique is not supported with depends_on (yet): enqueue the unique job on its own');
  END IF;
  -- A W3C traceparent as stored (app/observability/tracing.py parse_traceparent): one that is not valid is
  -- ignored, never refused.
  v_tp := regexp_match(btrim(p_traceparent), '^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[ -~]*)?$');
  IF v_tp IS NULL OR v_tp[1] = 'ff' OR v_tp[2] = repeat('0', 32) OR v_tp[3] = repeat('0', 16)
     OR (v_tp[1] = '00' AND v_tp[5] IS NOT NULL) THEN
    p_traceparent := NULL;
  ELSE
    p_traceparent := format('00-%s-%s-%s', v_tp[2], v_tp[3], v_tp[4]);
  END IF;

  p_priority := coalesce(p_priority, p_priority_default);
  p_max_attempts := coalesce(p_max_attempts, p_max_attempts_default);
  v_run_at := coalesce(p_run_at, now() + make_interval(secs => coalesce(p_delay, 0)));

  -- -- debounced (app/db/debounce.py) ---------------------------------------------------------------------------
  IF p_dkey IS NOT NULL THEN
    -- The lock serialises enqueues of one key, then the lookup's statement sees what the last one committed: only
    -- under READ COMMITTED, where each statement takes a new snapshot.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
      RAISE EXCEPTION USING ERRCODE = '0A000',
        MESSAGE = 'jobq enqueue: debounce needs a READ COMMITTED transaction',
        HINT = 'Under REPEATABLE READ or SERIALIZABLE the lookup could miss the pending job a concurrent enqueue '
               'committed, and make a second one. Enqueue it from a READ COMMITTED transaction.';
    END IF;
    -- The same key as app/db/debounce.py JOB_DEBOUNCE_LOCK: HTTP and SQL enqueues of one key wait for each other.
    PERFORM pg_advisory_xact_lock(hashtextextended(p_queue || '/' || p_dkey, 24));
    SELECT j.id INTO job_id FROM jobs j
    WHERE j.queue_name = p_queue AND j.debounce_key = p_dkey AND j.debounce_key IS NOT NULL AND j.status = 'pending'
    ORDER BY j.id DESC
    LIMIT 1
    FOR UPDATE;
    IF FOUND THEN
      -- Replaced: the run time only moves later, so no claim is woken.
      UPDATE jobs AS j
      SET payload = p_payload, priority = p_priority, debounce_seconds = p_dsec, debounce_max_wait_seconds = p_dwait,
          run_at = greatest(j.run_at, least(now() + make_interval(secs => p_dsec),
                                            j.created_at + make_interval(secs => p_dwait)))
      WHERE j.id = job_id;
      due := false;
      RETURN;
    END IF;
    INSERT INTO jobs AS j (queue_name, payload, priority, run_at, max_attempts, traceparent, group_key,
                           timeout_seconds, debounce_key, debounce_seconds, debounce_max_wait_seconds)
    VALUES (p_queue, p_payload, p_priority, now() + make_interval(secs => p_dsec), p_max_attempts, p_traceparent,
            p_group, p_timeout, p_dkey, p_dsec, p_dwait)
    RETURNING j.id INTO job_id;
    due := p_dsec = 0;
    RETURN;
  END IF;

  -- -- unique (app/db/jobs.py JOB_INSERT_UNIQUE, JOB_GET_BY_UNIQUE) -------------------------------------------------
  IF v_is_unique THEN
    SELECT array_agg(s ORDER BY array_position(ARRAY['pending', 'running', 'completed', 'failed', 'cancelled'], s))
    INTO v_states
    FROM (SELECT DISTINCT s FROM unnest(coalesce(p_uwhile, ARRAY['pending', 'running', 'completed'])) s) d;
    -- app/db/jobs.py _UNIQUE_KEY and _UNIQUE_FROM
    v_ukey := coalesce(p_ukey, encode(sha256(convert_to(p_payload::text, 'UTF8')), 'hex'));
    v_ufrom := CASE WHEN p_ufor IS NULL THEN '-infinity'::timestamptz
                    ELSE to_timestamp(floor(extract(epoch FROM now())::float8 / p_ufor) * p_ufor) END;
    FOR attempt IN 1..3 LOOP  -- the holder gone between the insert and the lookup (finished, deleted): again
      INSERT INTO jobs AS j (queue_name, payload, priority, run_at, max_attempts, traceparent, group_key,
                             timeout_seconds, unique_key, unique_from, unique_for_seconds, unique_states)
      VALUES (p_queue, p_payload, p_priority, v_run_at, p_max_attempts, p_traceparent, p_group, p_timeout,
              v_ukey, v_ufrom, p_ufor, v_states)
      ON CONFLICT DO NOTHING
      RETURNING j.id INTO job_id;
      IF job_id IS NOT NULL THEN
        due := v_run_at <= now();
        RETURN;
      END IF;
      SELECT j.id INTO job_id FROM jobs j
      WHERE j.queue_name = p_queue AND j.unique_key = v_ukey AND j.unique_from = v_ufrom
        AND coalesce(j.unique_for_seconds, 0) = coalesce(p_ufor, 0)
        AND j.unique_key IS NOT NULL AND j.status = ANY(j.unique_states);
      IF job_id IS NOT NULL THEN
        due := false;
        RETURN;
      END IF;
    END LOOP;
    RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'jobq enqueue: a unique key kept vanishing between insert and lookup',
      HINT = 'Run the transaction again.';
  END IF;

  -- -- dependencies (app/db/dependencies.py) ---------------------------------------------------------------------
  IF cardinality(p_depends_on) > 0 THEN
    SELECT array_agg(d ORDER BY n) INTO v_ids
    FROM (SELECT d, min(n) AS n FROM unnest(p_depends_on) WITH ORDINALITY u(d, n) GROUP BY d) x;
    -- The parents as they are, under FOR KEY SHARE only: it keeps them from being deleted until this transaction
    -- ends, and conflicts with no UPDATE of theirs, so a worker's complete or fail of a parent never waits for
    -- the caller's transaction (nor, through the coalesced statement that completes it, do other queues'
    -- completes). Nothing is written to a parent: has_dependants is set by the service after the commit, on
    -- the message enqueue() and enqueue_batch() send, in its own short transaction; a parent that finished
    -- meanwhile (unmarked, so its finish recorded nothing) is recorded and released then. A lost message (a
    -- crash between the commit and the message) is the periodic reconciliation's (JOBQ_DEPENDENCY_RECONCILE_SECONDS).
    SELECT array_agg(p.id), array_agg(p.status), array_agg(p.queue_name), array_agg(p.depth)
    INTO v_found_ids, v_found_status, v_found_queue, v_found_depth
    FROM (SELECT j.id, j.status, j.queue_name, coalesce(j.dependency_depth, 0) AS depth
          FROM jobs j WHERE j.id = ANY(v_ids) ORDER BY j.id FOR KEY SHARE OF j) p;
    -- The job's status from its parents' (app/db/dependencies.py _settle).
    FOR i IN 1..cardinality(v_ids) LOOP
      k := array_position(v_found_ids, v_ids[i]);
      IF k IS NULL THEN
        PERFORM enqueue_refuse(concat_ws('.', p_at, 'depends_on'), format('no job %s', v_ids[i]));
      END IF;
      v_depth := greatest(v_depth, 1 + v_found_depth[k]);
      IF v_found_status[k] = 'completed' THEN
        CONTINUE;
      ELSIF v_found_status[k] IN ('failed', 'cancelled') THEN
        v_bad := coalesce(v_bad, format('dependency %s %s', v_ids[i], v_found_status[k]));
      ELSE
        v_unfinished := v_unfinished || v_ids[i];
        v_unfinished_queue := v_unfinished_queue || v_found_queue[k];
      END IF;
    END LOOP;
    IF v_depth > enqueue_limit('max_dependency_depth') THEN
      PERFORM enqueue_refuse(concat_ws('.', p_at, 'depends_on'),
        format('this job would be %s dependencies deep (a chain of jobs, each waiting for the one before it); at '
               'most %s (JOBQ_MAX_DEPENDENCY_DEPTH''s default)', v_depth, enqueue_limit('max_dependency_depth')),
        'Depend on fewer levels, or on a job nearer the start of the chain.');
    END IF;
    IF v_bad IS NOT NULL AND p_policy IS DISTINCT FROM 'run' THEN
      v_status := 'cancelled';
      v_finished_at := clock_timestamp();
    ELSIF cardinality(v_unfinished) > 0 THEN
      v_status := 'waiting';
      v_pending := cardinality(v_unfinished);
    ELSE
      v_bad := NULL;
    END IF;
    FOR attempt IN 1..3 LOOP
      INSERT INTO jobs AS j (queue_name, payload, priority, run_at, max_attempts, idempotency_key, traceparent,
                             group_key, timeout_seconds, status, pending_dependencies, depends_on,
                             on_dependency_failure, finished_at, last_error, dependency_depth)
      VALUES (p_queue, p_payload, p_priority, v_run_at, p_max_attempts, p_idem, p_traceparent, p_group, p_timeout,
              v_status, v_pending, v_ids, p_policy, v_finished_at, CASE WHEN v_status = 'cancelled' THEN v_bad END,
              v_depth)
      ON CONFLICT (queue_name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
      RETURNING j.id INTO job_id;
      v_created := job_id IS NOT NULL;
      EXIT WHEN v_created;
      -- An idempotency key that names a job: that job, its dependencies untouched.
      SELECT j.id INTO job_id FROM jobs j
      WHERE j.queue_name = p_queue AND j.idempotency_key = p_idem AND j.idempotency_key IS NOT NULL;
      IF job_id IS NOT NULL THEN
        due := false;
        RETURN;
      END IF;
    END LOOP;
    IF NOT v_created THEN
      RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'jobq enqueue: an idempotency key kept vanishing between insert and lookup',
        HINT = 'Run the transaction again.';
    END IF;
    IF v_status = 'cancelled' THEN
      -- Finished at birth: counted with the finished jobs, as app/db/jobs.py count_finished does.
      INSERT INTO queue_counts AS c (queue_name, status, shard, n)
      VALUES (p_queue, 'cancelled', mod(pg_backend_pid(), 64), 1)
      ON CONFLICT (queue_name, status, shard) DO UPDATE SET n = c.n + EXCLUDED.n;
    ELSIF v_status = 'waiting' THEN
      INSERT INTO job_dependencies (parent_id, job_id, parent_queue, job_queue)
      SELECT u.parent_id, job_id, u.parent_queue, p_queue
      FROM unnest(v_unfinished, v_unfinished_queue) AS u(parent_id, parent_queue)
      ORDER BY u.parent_id
      ON CONFLICT DO NOTHING;
    END IF;
    due := v_status = 'pending' AND v_run_at <= now();
    RETURN;
  END IF;

  -- -- plain, perhaps with an idempotency key (app/db/jobs.py JOB_INSERT_MANY, JOB_GET_BY_KEYS) --------------------
  FOR attempt IN 1..3 LOOP  -- a job holding the key deleted between the insert and the lookup (retention): again
    INSERT INTO jobs AS j (queue_name, payload, priority, run_at, max_attempts, idempotency_key, traceparent,
                           group_key, timeout_seconds)
    VALUES (p_queue, p_payload, p_priority, v_run_at, p_max_attempts, p_idem, p_traceparent, p_group, p_timeout)
    ON CONFLICT (queue_name, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING j.id INTO job_id;
    IF job_id IS NOT NULL THEN
      due := v_run_at <= now();
      RETURN;
    END IF;
    SELECT j.id INTO job_id FROM jobs j
    WHERE j.queue_name = p_queue AND j.idempotency_key = p_idem AND j.idempotency_key IS NOT NULL;
    IF job_id IS NOT NULL THEN
      due := false;
      RETURN;
    END IF;
  END LOOP;
  RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'jobq enqueue: an idempotency key kept vanishing between insert and lookup',
    HINT = 'Run the transaction again.';
END
$$;

-- --- the queue around it -----------------------------------------------------------------------------------------
-- The queue's name checked, and its configuration's defaults (app/core/flow.py effective): its default_priority
-- else 0, its max_attempts else JOBQ_DEFAULT_MAX_ATTEMPTS's default. Its timeout_seconds is not copied: a job
-- without its own is timed by its queue's when the sweeper looks, as after an HTTP enqueue. A paused queue takes
-- jobs (its claims get none), as over HTTP.
CREATE OR REPLACE FUNCTION enqueue_queue(queue text, OUT priority_default integer, OUT max_attempts_default integer,
                                         OUT was_live boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
BEGIN
  IF queue IS NULL OR queue !~ '^[A-Za-z0-9_.:-]{1,128}$' THEN
    PERFORM enqueue_refuse('queue', 'must match ^[A-Za-z0-9_.:-]{1,128}$');
  END IF;
  SELECT s.default_priority, s.max_attempts
  INTO priority_default, max_attempts_default
  FROM queue_state s WHERE s.queue_name = queue;
  priority_default := coalesce(priority_default, 0);
  max_attempts_default := coalesce(max_attempts_default, enqueue_limit('default_max_attempts'));
  was_live := enqueue_queue_live(queue);
END
$$;

-- --- the public functions --------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION enqueue(
  queue text,
  payload jsonb,
  priority integer DEFAULT NULL,
  run_at timestamptz DEFAULT NULL,
  delay_seconds double precision DEFAULT NULL,
  max_attempts integer DEFAULT NULL,
  idempotency_key text DEFAULT NULL,
  group_key text DEFAULT NULL,
  timeout_seconds integer DEFAULT NULL,
  depends_on bigint[] DEFAULT NULL,
  on_dependency_failure text DEFAULT NULL,
  unique_job boolean DEFAULT NULL,
  unique_key text DEFAULT NULL,
  unique_for_seconds integer DEFAULT NULL,
  unique_while text[] DEFAULT NULL,
  debounce_key text DEFAULT NULL,
  debounce_seconds double precision DEFAULT NULL,
  debounce_max_wait_seconds double precision DEFAULT NULL,
  traceparent text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
  q record;
  made record;
BEGIN
  SELECT * INTO q FROM enqueue_queue(queue);
  SELECT * INTO made FROM enqueue_job(queue, payload, priority, run_at, delay_seconds, max_attempts, idempotency_key, group_key,
                      timeout_seconds, depends_on, on_dependency_failure, unique_job, unique_key, unique_for_seconds,
                      unique_while, debounce_key, debounce_seconds, debounce_max_wait_seconds, traceparent, NULL,
                      q.priority_default, q.max_attempts_default);
  PERFORM enqueue_check_quotas(queue, q.was_live);
  -- A job that waits for others, named to the service at commit ("sql d <queue> <id>", app/core/wakeups.py):
  -- its parents were not touched here; the service marks them has_dependants and releases it if one finished
  -- meanwhile (app/core/dependencies.py enqueued). Dropped with a rollback, like any NOTIFY.
  IF cardinality(depends_on) > 0 AND EXISTS (SELECT FROM jobs j WHERE j.id = made.job_id AND j.queue_name = queue
                                                                  AND j.status = 'waiting') THEN
    PERFORM pg_notify('jobq_wakeup', 'sql d ' || queue || ' ' || made.job_id);
  END IF;
  IF made.due THEN
    -- app/core/wakeups.py's "jobs arrived on <queue>" from sender "sql", on app/db/channels.py's CHANNEL;
    -- delivered at commit, dropped on rollback. Repeats within one transaction are delivered once.
    PERFORM pg_notify('jobq_wakeup', 'sql w ' || queue);
  END IF;
  RETURN made.job_id;
END
$$;

-- One field of a batch item, checked against its JSON type (the HTTP body's strictness: no strings for numbers,
-- an integral 2.0 is 2, null is refused: leave the field out).
CREATE OR REPLACE FUNCTION enqueue_item_field(item jsonb, name text, kind text, at text) RETURNS jsonb
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
  v jsonb := item -> name;
BEGIN
  IF v IS NULL THEN
    RETURN NULL;
  END IF;
  IF jsonb_typeof(v) = 'null' THEN
    PERFORM enqueue_refuse(at || '.' || name, 'must not be null: leave the field out instead');
  END IF;
  IF kind = 'integer' THEN
    IF jsonb_typeof(v) <> 'number' THEN
      PERFORM enqueue_refuse(at || '.' || name, 'must be an integer');
    ELSIF v::text::numeric <> trunc(v::text::numeric) THEN
      PERFORM enqueue_refuse(at || '.' || name, 'must be an integer');
    ELSIF abs(v::text::numeric) > 2147483647 THEN
      PERFORM enqueue_refuse(at || '.' || name, 'out of range');
    END IF;
  ELSIF jsonb_typeof(v) <> kind THEN
    PERFORM enqueue_refuse(at || '.' || name, format('must be a JSON %s', kind));
  END IF;
  RETURN v;
END
$$;

-- `jobs`: a JSON array of objects with the fields of the HTTP batch's items (payload, priority, run_at,
-- delay_seconds, max_attempts, idempotency_key, group, timeout_seconds, depends_on, on_dependency_failure, ref,
-- unique, debounce). All or nothing; the ids in the batch's order.
CREATE OR REPLACE FUNCTION enqueue_batch(queue text, jobs jsonb, traceparent text DEFAULT NULL) RETURNS bigint[]
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
DECLARE
  q record;
  made record;
  item jsonb;
  n integer;
  at text;
  ids bigint[] := '{}';
  refs jsonb := '{}';
  dependent boolean;
  wake boolean := false;
  v_run_at timestamptz;
  v_parents bigint[];
  v_entry jsonb;
  v_ref jsonb;
  v_unique jsonb;
  v_debounce jsonb;
  v_while text[];
  k integer;
  v_waiting bigint;
  message text;
BEGIN
  SELECT * INTO q FROM enqueue_queue(queue);
  IF jobs IS NULL OR jsonb_typeof(jobs) <> 'array' OR jsonb_array_length(jobs) NOT BETWEEN 1 AND enqueue_limit('max_batch_jobs') THEN
    PERFORM enqueue_refuse('jobs', format('must be a JSON array of 1 to %s objects', enqueue_limit('max_batch_jobs')));
  END IF;
  -- Every debounce key of the batch locked now, before any item is written, in one order: the lock of
  -- app/db/debounce.py JOB_DEBOUNCE_LOCK (an HTTP enqueue of one of these keys waits for this transaction, and
  -- this one for it), sorted as it sorts. Taken item by item instead, two batches naming keys in different orders
  -- would each hold one and wait for the other's: a deadlock (40P01). enqueue_job takes an item's lock again,
  -- which it already holds. A key that is not a string is refused with its item, below.
  PERFORM count(pg_advisory_xact_lock(l.k)) FROM (
    SELECT DISTINCT hashtextextended(queue || '/' || (e -> 'debounce' ->> 'key'), 24) AS k
    FROM jsonb_array_elements(jobs) e
    WHERE jsonb_typeof(e) = 'object' AND jsonb_typeof(e -> 'debounce') = 'object'
      AND jsonb_typeof(e -> 'debounce' -> 'key') = 'string'
    ORDER BY 1
  ) l;
  -- A batch in which a job depends on others takes no unique or debounced job (as over HTTP).
  dependent := EXISTS (SELECT FROM jsonb_array_elements(jobs) e
                       WHERE jsonb_typeof(e -> 'depends_on') = 'array' AND jsonb_array_length(e -> 'depends_on') > 0);
  FOR item, n IN SELECT e, o::integer - 1 FROM jsonb_array_elements(jobs) WITH ORDINALITY AS x(e, o) LOOP
    at := format('jobs[%s]', n);
    IF jsonb_typeof(item) <> 'object' THEN
      PERFORM enqueue_refuse(at, 'must be a JSON object');
    END IF;
    IF EXISTS (SELECT FROM jsonb_object_keys(item) f
               WHERE f NOT IN ('payload', 'priority', 'run_at', 'delay_seconds', 'max_attempts', 'idempotency_key',
                               'group', 'timeout_seconds', 'depends_on', 'on_dependency_failure', 'ref', 'unique',
                               'debounce')) THEN
      PERFORM enqueue_refuse(at, format('unknown field(s): %s', (
        SELECT string_agg(f, ', ') FROM jsonb_object_keys(item) f
        WHERE f NOT IN ('payload', 'priority', 'run_at', 'delay_seconds', 'max_attempts', 'idempotency_key', 'group',
                        'timeout_seconds', 'depends_on', 'on_dependency_failure', 'ref', 'unique', 'debounce'))));
    END IF;
    IF NOT item ? 'payload' THEN
      PERFORM enqueue_refuse(at || '.payload', 'is required');
    END IF;
    -- run_at: an RFC 3339 date-time with an offset.
    v_run_at := NULL;
    IF enqueue_item_field(item, 'run_at', 'string', at) IS NOT NULL THEN
      IF item ->> 'run_at' !~ '^\d{4}-\d\d-\d\d[Tt ]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:\d\d)$' THEN
        PERFORM enqueue_refuse(at || '.run_at', 'must be an RFC 3339 date-time string with an offset');
      END IF;
      BEGIN
        v_run_at := (item ->> 'run_at')::timestamptz;
      EXCEPTION WHEN datetime_field_overflow OR invalid_datetime_format OR invalid_time_zone_displacement_value THEN
        PERFORM enqueue_refuse(at || '.run_at', 'is not a valid date-time');
      END;
    END IF;
    -- depends_on: job ids, and earlier items of this batch by ref or index (app/core/jobs.py _parents).
    v_parents := NULL;
    IF enqueue_item_field(item, 'depends_on', 'array', at) IS NOT NULL THEN
      v_parents := '{}';
      FOR v_entry, k IN SELECT e, o::integer - 1 FROM jsonb_array_elements(item -> 'depends_on') WITH ORDINALITY AS x(e, o) LOOP
        v_ref := CASE WHEN jsonb_typeof(v_entry) = 'object' THEN v_entry -> 'ref' ELSE v_entry END;
        IF jsonb_typeof(v_entry) = 'object' AND (v_ref IS NULL OR (SELECT count(*) FROM jsonb_object_keys(v_entry)) <> 1) THEN
          PERFORM enqueue_refuse(format('%s.depends_on.%s', at, k), 'an object entry is {"ref": <index or ref>}');
        END IF;
        IF jsonb_typeof(v_entry) = 'number' THEN
          IF v_entry::text::numeric <> trunc(v_entry::text::numeric) OR v_entry::text::numeric NOT BETWEEN 1 AND 9223372036854775807 THEN
            PERFORM enqueue_refuse(format('%s.depends_on.%s', at, k), 'a job id is a positive integer');
          END IF;
          v_parents := v_parents || v_entry::text::numeric::bigint;
        ELSIF jsonb_typeof(v_ref) = 'number' AND jsonb_typeof(v_entry) = 'object' THEN
          IF v_ref::text::numeric <> trunc(v_ref::text::numeric) OR v_ref::text::numeric < 0 OR v_ref::text::numeric >= n THEN
            PERFORM enqueue_refuse(format('%s.depends_on.%s', at, k), format('item %s is not an earlier item of this batch', v_ref));
          END IF;
          v_parents := v_parents || ids[v_ref::text::numeric::integer + 1];
        ELSIF jsonb_typeof(v_ref) = 'string' THEN
          IF NOT refs ? (v_ref #>> '{}') THEN
            PERFORM enqueue_refuse(format('%s.depends_on.%s', at, k), format('no earlier item of this batch has ref %s', v_ref));
          END IF;
          v_parents := v_parents || ids[(refs ->> (v_ref #>> '{}'))::integer + 1];
        ELSE
          PERFORM enqueue_refuse(format('%s.depends_on.%s', at, k), 'a job id, a ref or {"ref": <index or ref>}');
        END IF;
      END LOOP;
    END IF;
    v_unique := enqueue_item_field(item, 'unique', 'object', at);
    v_debounce := enqueue_item_field(item, 'debounce', 'object', at);
    IF dependent AND v_unique IS NOT NULL THEN
      PERFORM enqueue_refuse(at || '.unique', 'unique is not supported in a batch with depends_on (yet): enqueue those jobs on their own');
    END IF;
    IF dependent AND v_debounce IS NOT NULL THEN
      PERFORM enqueue_refuse(at || '.debounce', 'debounce is not supported in a batch with depends_on (yet): enqueue those jobs on their own');
    END IF;
    IF EXISTS (SELECT FROM jsonb_object_keys(coalesce(v_unique, '{}')) f WHERE f NOT IN ('key', 'for_seconds', 'while')) THEN
      PERFORM enqueue_refuse(at || '.unique', 'takes key, for_seconds and while only');
    END IF;
    IF EXISTS (SELECT FROM jsonb_object_keys(coalesce(v_debounce, '{}')) f WHERE f NOT IN ('key', 'seconds', 'max_wait_seconds')) THEN
      PERFORM enqueue_refuse(at || '.debounce', 'takes key, seconds and max_wait_seconds only');
    END IF;
    IF v_debounce IS NOT NULL AND NOT (v_debounce ? 'key' AND v_debounce ? 'seconds') THEN
      PERFORM enqueue_refuse(at || '.debounce', 'needs key and seconds');
    END IF;
    v_while := NULL;
    IF enqueue_item_field(coalesce(v_unique, '{}'), 'while', 'array', at || '.unique') IS NOT NULL THEN
      IF EXISTS (SELECT FROM jsonb_array_elements(v_unique -> 'while') s WHERE jsonb_typeof(s) <> 'string') THEN
        PERFORM enqueue_refuse(at || '.unique.while', 'a list of states');
      END IF;
      SELECT array_agg(s ORDER BY o) INTO v_while FROM jsonb_array_elements_text(v_unique -> 'while') WITH ORDINALITY AS x(s, o);
      v_while := coalesce(v_while, '{}');
    END IF;
    PERFORM enqueue_item_field(item, 'ref', 'string', at);
    PERFORM enqueue_check_label(item ->> 'ref', at || '.ref', 255);
    SELECT * INTO made FROM enqueue_job(
      queue, item -> 'payload',
      enqueue_item_field(item, 'priority', 'integer', at)::text::numeric::integer,
      v_run_at,
      enqueue_item_field(item, 'delay_seconds', 'number', at)::text::double precision,
      enqueue_item_field(item, 'max_attempts', 'integer', at)::text::numeric::integer,
      enqueue_item_field(item, 'idempotency_key', 'string', at) #>> '{}',
      enqueue_item_field(item, 'group', 'string', at) #>> '{}',
      enqueue_item_field(item, 'timeout_seconds', 'integer', at)::text::numeric::integer,
      v_parents,
      enqueue_item_field(item, 'on_dependency_failure', 'string', at) #>> '{}',
      CASE WHEN v_unique IS NOT NULL THEN true END,
      enqueue_item_field(coalesce(v_unique, '{}'), 'key', 'string', at || '.unique') #>> '{}',
      enqueue_item_field(coalesce(v_unique, '{}'), 'for_seconds', 'integer', at || '.unique')::text::numeric::integer,
      v_while,
      enqueue_item_field(coalesce(v_debounce, '{}'), 'key', 'string', at || '.debounce') #>> '{}',
      enqueue_item_field(coalesce(v_debounce, '{}'), 'seconds', 'number', at || '.debounce')::text::double precision,
      enqueue_item_field(coalesce(v_debounce, '{}'), 'max_wait_seconds', 'number', at || '.debounce')::text::double precision,
      traceparent, at, q.priority_default, q.max_attempts_default);
    ids := ids || made.job_id;
    wake := wake OR made.due;
    IF item ? 'ref' THEN
      IF refs ? (item ->> 'ref') THEN
        PERFORM enqueue_refuse(at || '.ref', format('ref %s is already used by item %s', item -> 'ref', refs ->> (item ->> 'ref')));
      END IF;
      refs := refs || jsonb_build_object(item ->> 'ref', n);
    END IF;
  END LOOP;
  PERFORM enqueue_check_quotas(queue, q.was_live);
  -- The jobs that wait for others, named to the service at commit as enqueue() names one: "sql d <queue> <id>
  -- ...", each message under NOTIFY's 8000 bytes.
  IF dependent THEN
    message := '';
    FOR v_waiting IN SELECT j.id FROM jobs j WHERE j.id = ANY(ids) AND j.queue_name = queue AND j.status = 'waiting'
                     ORDER BY j.id LOOP
      IF length(message) > 7700 THEN
        PERFORM pg_notify('jobq_wakeup', 'sql d ' || queue || message);
        message := '';
      END IF;
      message := message || ' ' || v_waiting;
    END LOOP;
    IF message <> '' THEN
      PERFORM pg_notify('jobq_wakeup', 'sql d ' || queue || message);
    END IF;
  END IF;
  IF wake THEN
    PERFORM pg_notify('jobq_wakeup', 'sql w ' || queue);
  END IF;
  RETURN ids;
END
$$;

-- --- who may call them -------------------------------------------------------------------------------------------
-- The public functions run as their owner (SECURITY DEFINER) with a pinned search_path: pg_catalog first (a
-- built-in is never looked for after jobq's schema), then jobq's schema, then pg_temp last (a temporary table
-- named jobs, say, is never found first). Only jobq_producer (and the owner) may execute them; the internal
-- ones nobody else. Exactly the functions made above, by signature: an application's function of one of these
-- names with other arguments is left alone (the check at the top of the file refused one of the same).
DO $$
DECLARE
  f regprocedure;
BEGIN
  FOREACH f IN ARRAY ARRAY[
    'enqueue(text, jsonb, integer, timestamptz, double precision, integer, text, text, integer, bigint[], text,
             boolean, text, integer, text[], text, double precision, double precision, text)',
    'enqueue_batch(text, jsonb, text)',
    'enqueue_job(text, jsonb, integer, timestamptz, double precision, integer, text, text, integer, bigint[], text,
                 boolean, text, integer, text[], text, double precision, double precision, text, text, integer,
                 integer)',
    'enqueue_queue(text)',
    'enqueue_item_field(jsonb, text, text, text)',
    'enqueue_check_quotas(text, boolean)',
    'enqueue_queue_live(text)',
    'enqueue_deeper_than(jsonb, integer)',
    'enqueue_check_label(text, text, bigint)',
    'enqueue_refuse(text, text, text)',
    'enqueue_limit(text)'
  ]::regprocedure[]
  LOOP
    EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, current_schema());
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    -- How `jobq migrate --move-into-schema` tells jobq's functions from an application's (app/db/migrate.py).
    EXECUTE format('COMMENT ON FUNCTION %s IS %L', f, 'jobq: enqueue from SQL (docs/producers.md)');
  END LOOP;
END
$$;

-- The role: cluster-wide, so made once for every database of the cluster, and only where the migrating user
-- may (CREATEROLE or superuser); several databases migrating at once may race to make it. Where it cannot be
-- made here, an administrator makes it and grants it (docs/producers.md, "The role").
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'jobq_producer')
     AND EXISTS (SELECT FROM pg_roles WHERE rolname = current_user AND (rolcreaterole OR rolsuper)) THEN
    BEGIN
      CREATE ROLE jobq_producer NOLOGIN;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
      NULL;  -- another database's migration made it a moment ago
    END;
  END IF;
  IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'jobq_producer') THEN
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO jobq_producer', current_schema());
    GRANT EXECUTE ON FUNCTION enqueue(text, jsonb, integer, timestamptz, double precision, integer, text, text,
                                      integer, bigint[], text, boolean, text, integer, text[], text, double precision,
                                      double precision, text),
                              enqueue_batch(text, jsonb, text)
      TO jobq_producer;
  END IF;
END
$$;
