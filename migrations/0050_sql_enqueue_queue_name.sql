-- jobq: own-schema
-- Enqueue from SQL checks its queue's name as 0049_queue_name_check.sql's CHECKs do: 1 to 128 characters, none
-- outside the class, without the regex repetition that cost 3-19 µs a call (issue 22). enqueue_queue (0045) is
-- replaced as it is but for that test (its owner, grants and comment stay; the refusal's message is unchanged),
-- then its search_path pinned again as 0045 pins it (a CREATE OR REPLACE sets it from the migration's).
CREATE OR REPLACE FUNCTION enqueue_queue(queue text, OUT priority_default integer, OUT max_attempts_default integer,
                                         OUT was_live boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_variable
BEGIN
  IF queue IS NULL OR NOT (length(queue) BETWEEN 1 AND 128 AND queue !~ '[^A-Za-z0-9_.:-]') THEN
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

DO $$
BEGIN
  EXECUTE format('ALTER FUNCTION enqueue_queue(text) SET search_path = pg_catalog, %I, pg_temp', current_schema());
END
$$;
