-- jobq: own-schema
-- Enqueue from SQL on Citus (docs/scale-out.md): the functions of 0045_sql_enqueue.sql that Citus could not run,
-- replaced by ones that run on both engines. On plain PostgreSQL each does what it did, with the same statements;
-- on Citus every statement about the enqueued queue names it, so that it runs on that queue's shard:
--   * enqueue_queue_live is PL/pgSQL: Citus cannot plan a statement of an SQL function that uses its parameters;
--   * a debounced job's new run time is computed by the lookup that locks it, not by the UPDATE (an UPDATE may not
--     apply a STABLE function to a column there), and the UPDATE names its queue;
--   * on Citus the parents of a job with dependencies are locked queue by queue (a row lock is taken on one shard
--     only): those in the job's own queue first, the others after a read of their queues;
--   * on Citus the live queues are counted by a read of every shard (a recursive walk must name one queue);
--   * enqueue() looks at its job for a "sql d" message only when it has dependencies (an AND in one IF was a
--     statement, so on Citus a round trip, on every enqueue).
-- Only functions: no table is touched. Each is replaced as it is (its owner, grants and comment stay), then its
-- search_path pinned again as 0045 pins it (a CREATE OR REPLACE sets it from the migration's).

-- --- a queue's quotas ------------------------------------------------------------------------------------------
-- Whether a queue is live: a job not finished yet, or a configuration (app/db/quotas.py QUEUE_LIVE). PL/pgSQL,
-- not SQL: Citus refuses to plan a statement of an SQL function that uses the function's parameters.
CREATE OR REPLACE FUNCTION enqueue_queue_live(queue text) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
#variable_conflict use_variable
BEGIN
  RETURN EXISTS (SELECT 1 FROM jobs j WHERE j.queue_name = queue AND j.status = 'pending')
      OR EXISTS (SELECT 1 FROM jobs j WHERE j.queue_name = queue AND j.status = 'waiting')
      OR EXISTS (SELECT 1 FROM jobs j WHERE j.queue_name = queue AND j.status = 'running' COLLATE "C")
      OR EXISTS (SELECT 1 FROM queue_state s WHERE s.queue_name = queue);
END
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
  -- Live queues, at most v_cap + 1. On Citus, where a recursive walk must name one queue, one read of every
  -- shard, each grouping its jobs not yet finished by queue (app/db/quotas.py QUEUES_LIVE_COUNT_FANOUT): only
  -- when a queue that was not live is enqueued to.
  IF EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
    SELECT count(*) INTO v_count FROM (
      SELECT j.queue_name FROM jobs j WHERE j.status IN ('pending', 'waiting', 'running') GROUP BY j.queue_name
      UNION SELECT s.queue_name FROM queue_state s
      LIMIT v_cap + 1
    ) q;
  ELSE
  -- Elsewhere loose scans of the pending, waiting and running jobs' indexes, and the configured queues
  -- (app/db/quotas.py QUEUES_LIVE_COUNT).
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
  END IF;
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
  v_parent_queue text;
  v_parent_ids bigint[];
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
    -- The replaced job's new run time is computed by the lookup, not by the UPDATE: on Citus an UPDATE may not
    -- apply a STABLE function (timestamptz + interval) to a column (app/db/debounce.py JOB_DEBOUNCE does the same).
    SELECT j.id, greatest(j.run_at, least(now() + make_interval(secs => p_dsec),
                                          j.created_at + make_interval(secs => p_dwait)))
    INTO job_id, v_run_at
    FROM jobs j
    WHERE j.queue_name = p_queue AND j.debounce_key = p_dkey AND j.debounce_key IS NOT NULL AND j.status = 'pending'
    ORDER BY j.id DESC
    LIMIT 1
    FOR UPDATE;
    IF FOUND THEN
      -- Replaced: the run time only moves later, so no claim is woken. The queue named, so that on Citus this
      -- runs on the queue's shard alone.
      UPDATE jobs AS j
      SET payload = p_payload, priority = p_priority, debounce_seconds = p_dsec, debounce_max_wait_seconds = p_dwait,
          run_at = v_run_at
      WHERE j.queue_name = p_queue AND j.id = job_id;
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
    IF NOT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
      SELECT array_agg(p.id), array_agg(p.status), array_agg(p.queue_name), array_agg(p.depth)
      INTO v_found_ids, v_found_status, v_found_queue, v_found_depth
      FROM (SELECT j.id, j.status, j.queue_name, coalesce(j.dependency_depth, 0) AS depth
            FROM jobs j WHERE j.id = ANY(v_ids) ORDER BY j.id FOR KEY SHARE OF j) p;
    ELSE
      -- On Citus a row lock is taken by a statement on one shard only. The parents in the enqueue's own queue are
      -- locked by a statement on its shard (as app/db/dependencies.py looks there first); the queues of any others
      -- are read then (a read of every shard, unlocked, only when a parent is elsewhere), and those parents locked
      -- queue by queue, in name order, each queue's in id order. A parent deleted between that read and its lock
      -- is missing, as it would be had it gone before the enqueue.
      SELECT coalesce(array_agg(p.id), '{}'), coalesce(array_agg(p.status), '{}'),
             coalesce(array_agg(p.queue_name), '{}'), coalesce(array_agg(p.depth), '{}')
      INTO v_found_ids, v_found_status, v_found_queue, v_found_depth
      FROM (SELECT j.id, j.status, j.queue_name, coalesce(j.dependency_depth, 0) AS depth
            FROM jobs j WHERE j.queue_name = p_queue AND j.id = ANY(v_ids) ORDER BY j.id FOR KEY SHARE OF j) p;
      IF cardinality(v_found_ids) < cardinality(v_ids) THEN
        FOR v_parent_queue, v_parent_ids IN
          SELECT j.queue_name, array_agg(j.id ORDER BY j.id) FROM jobs j
          WHERE j.id = ANY(v_ids) AND j.id <> ALL(v_found_ids)
          GROUP BY j.queue_name ORDER BY j.queue_name
        LOOP
          SELECT v_found_ids || array_agg(p.id), v_found_status || array_agg(p.status),
                 v_found_queue || array_agg(p.queue_name), v_found_depth || array_agg(p.depth)
          INTO v_found_ids, v_found_status, v_found_queue, v_found_depth
          FROM (SELECT j.id, j.status, j.queue_name, coalesce(j.dependency_depth, 0) AS depth
                FROM jobs j WHERE j.queue_name = v_parent_queue AND j.id = ANY(v_parent_ids)
                ORDER BY j.id FOR KEY SHARE OF j) p;
        END LOOP;
      END IF;
    END IF;
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

-- --- the public function ---------------------------------------------------------------------------------------
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
  -- Two IFs, not one AND: Citus sends a condition's whole statement to the queue's shard, where the look at the
  -- job would cost every enqueue a round trip.
  IF cardinality(depends_on) > 0 THEN
    IF EXISTS (SELECT FROM jobs j WHERE j.id = made.job_id AND j.queue_name = queue AND j.status = 'waiting') THEN
      PERFORM pg_notify('jobq_wakeup', 'sql d ' || queue || ' ' || made.job_id);
    END IF;
  END IF;
  IF made.due THEN
    -- app/core/wakeups.py's "jobs arrived on <queue>" from sender "sql", on app/db/channels.py's CHANNEL;
    -- delivered at commit, dropped on rollback. Repeats within one transaction are delivered once.
    PERFORM pg_notify('jobq_wakeup', 'sql w ' || queue);
  END IF;
  RETURN made.job_id;
END
$$;

-- --- pinned again -------------------------------------------------------------------------------------------------
-- As 0045 pins them: pg_catalog first, then jobq's schema, pg_temp last. Owner, grants and comment were kept by
-- CREATE OR REPLACE.
DO $$
DECLARE
  f regprocedure;
BEGIN
  FOREACH f IN ARRAY ARRAY[
    'enqueue_job(text, jsonb, integer, timestamptz, double precision, integer, text, text, integer, bigint[], text,
                 boolean, text, integer, text[], text, double precision, double precision, text, text, integer,
                 integer)',
    'enqueue_check_quotas(text, boolean)',
    'enqueue_queue_live(text)',
    'enqueue(text, jsonb, integer, timestamptz, double precision, integer, text, text, integer, bigint[], text,
             boolean, text, integer, text[], text, double precision, double precision, text)'
  ]::regprocedure[]
  LOOP
    EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', f, current_schema());
  END LOOP;
END
$$;
