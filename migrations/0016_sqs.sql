-- The SQS API (app/sqs/, docs/sqs.md). An SQS queue is a jobq queue; these tables hold only what SQS has
-- and jobq does not. VisibilityTimeout and maxReceiveCount live in the queue's configuration (queue_state:
-- lease_seconds, max_attempts), FIFO order in its `ordered` flag: one source of truth for both APIs.

-- The queues created over SQS (or first named by GetQueueUrl), with the attributes jobq has no column for.
CREATE TABLE sqs_queues (
  queue_name           text PRIMARY KEY,
  created_at           timestamptz NOT NULL DEFAULT now(),
  modified_at          timestamptz NOT NULL DEFAULT now(),
  -- Defaults of a SendMessage without DelaySeconds and of a ReceiveMessage without WaitTimeSeconds.
  delay_seconds        integer NOT NULL DEFAULT 0 CHECK (delay_seconds BETWEEN 0 AND 900),
  receive_wait_seconds integer NOT NULL DEFAULT 0 CHECK (receive_wait_seconds BETWEEN 0 AND 20),
  maximum_message_size integer NOT NULL DEFAULT 262144 CHECK (maximum_message_size BETWEEN 1024 AND 1048576),
  -- As set; what jobq does with it (failed jobs kept that long) is the queue's retention configuration.
  retention_seconds    integer NOT NULL DEFAULT 345600 CHECK (retention_seconds BETWEEN 60 AND 1209600),
  content_based_dedup  boolean NOT NULL DEFAULT false,
  -- The RedrivePolicy JSON exactly as set (its maxReceiveCount is also the queue's max_attempts).
  redrive_policy       text,
  tags                 jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(tags) = 'object'),
  -- The latest StartMessageMoveTask whose source is this queue (ListMessageMoveTasks), as answered.
  move_task            jsonb
);

-- What a message sent over SQS carries besides its body (the job's payload, a JSON string): its message
-- attributes as sent, and on a FIFO queue its deduplication id. Only messages that have one get a row, so
-- a plain SendMessage writes nothing here. No foreign key: a cascade would cost every deletion of a job a
-- lookup here (retention deletes jobs by the thousand) and forbid TRUNCATE jobs; the retention service
-- deletes the rows whose job is gone instead.
CREATE TABLE sqs_messages (
  job_id     bigint PRIMARY KEY,
  attributes jsonb,
  dedup_id   text
);

-- The FIFO deduplication window: a (queue, deduplication id) names the job it made until expires_at
-- (five minutes after the send). Taken by INSERT ... ON CONFLICT in the transaction that inserts the job,
-- so two concurrent sends of one id make one job; expired rows are replaced in place, and pruned by the
-- retention service.
CREATE TABLE sqs_dedup (
  queue_name text NOT NULL,
  dedup_id   text NOT NULL,
  job_id     bigint NOT NULL,
  expires_at timestamptz NOT NULL,
  PRIMARY KEY (queue_name, dedup_id)
);
CREATE INDEX sqs_dedup_expiry_idx ON sqs_dedup (expires_at);
