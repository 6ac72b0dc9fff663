-- The queue-name CHECKs of jobs and queue_state, the same rule tested without a bounded repetition (issue 22).
-- `queue_name ~ '^[A-Za-z0-9_.:-]{1,128}$'` runs PostgreSQL's regex engine over a 128-fold repetition, and a CHECK
-- runs on every row an INSERT or UPDATE writes: on jobs that is every enqueue, claim, heartbeat and complete. It
-- cost 3.6 µs a row for the queue `bench` and 11.8 µs for a 23-character name, the test below 0.2-0.3 µs (each
-- evaluated over 100,000 rows of a table); a 1,000-row insert took 4.3 ms with it against 1.4 ms without, 15.6-20.2
-- ms with the longer name, 1.8-2.2 ms with the test below.
--
-- The new test says the same: 1 to 128 characters (every allowed character is ASCII, so characters are bytes), none
-- outside the class. Cheap on a big table: the old CHECK is dropped and the new one added NOT VALID, so nothing is
-- scanned (a VALIDATE would read the whole table under the lock this file's ALTERs hold); every existing row passed
-- the old CHECK, which is this one, and every row written from now on is checked. Each ALTER takes its table's lock
-- for a moment, as 0010 does.
ALTER TABLE jobs DROP CONSTRAINT jobs_queue_name_check;
ALTER TABLE jobs ADD CONSTRAINT jobs_queue_name_check
  CHECK (length(queue_name) BETWEEN 1 AND 128 AND queue_name !~ '[^A-Za-z0-9_.:-]') NOT VALID;

ALTER TABLE queue_state DROP CONSTRAINT queue_state_queue_name_check;
ALTER TABLE queue_state ADD CONSTRAINT queue_state_queue_name_check
  CHECK (length(queue_name) BETWEEN 1 AND 128 AND queue_name !~ '[^A-Za-z0-9_.:-]') NOT VALID;
