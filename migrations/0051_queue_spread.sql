-- A queue spread over several distribution keys (issue 19; app/db/spread.py, docs/scale-out.md). `spread` is the
-- number of keys of the queue this row names (1: the queue keeps every job under its own name, as before). A
-- spread queue's key k >= 1 stores its jobs, and its own queue_state row, under the name `queue#k`: `#` is outside
-- the API's queue names, so the CHECKs take it only as such a suffix, k from 1 to 63. The test is 0049's for a name
-- without `#` (every row written before this file has none); only a key's name is tested by a regex.
-- Cheap on a big table, as 0049: dropped and added NOT VALID, nothing scanned; a column with a constant default is
-- added without a rewrite.
ALTER TABLE queue_state ADD COLUMN IF NOT EXISTS spread smallint NOT NULL DEFAULT 1
  CONSTRAINT queue_state_spread_check CHECK (spread BETWEEN 1 AND 64);
-- The keys the queue has ever been spread over (spread lowered: the keys above it still hold jobs, and a claim still
-- takes from them).
ALTER TABLE queue_state ADD COLUMN IF NOT EXISTS keys_used smallint NOT NULL DEFAULT 1
  CONSTRAINT queue_state_keys_used_check CHECK (keys_used BETWEEN 1 AND 64);

ALTER TABLE jobs DROP CONSTRAINT jobs_queue_name_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_queue_name_check
  CHECK (queue_name !~ '[^A-Za-z0-9_.:#-]' AND CASE strpos(queue_name, '#')
           WHEN 0 THEN length(queue_name) BETWEEN 1 AND 128
           ELSE strpos(queue_name, '#') BETWEEN 2 AND 129 AND queue_name ~ '^[^#]+#([1-9]|[1-5][0-9]|6[0-3])$' END)
  NOT VALID;

ALTER TABLE queue_state DROP CONSTRAINT queue_state_queue_name_check;
ALTER TABLE queue_state ADD CONSTRAINT queue_state_queue_name_check
  CHECK (queue_name !~ '[^A-Za-z0-9_.:#-]' AND CASE strpos(queue_name, '#')
           WHEN 0 THEN length(queue_name) BETWEEN 1 AND 128
           ELSE strpos(queue_name, '#') BETWEEN 2 AND 129 AND queue_name ~ '^[^#]+#([1-9]|[1-5][0-9]|6[0-3])$' END)
  NOT VALID;
