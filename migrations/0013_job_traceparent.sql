-- The W3C trace context of the enqueue that made a job (app/observability/tracing.py): stored with the job and
-- handed to the worker on claim, so that the worker's span continues the producer's trace. NULL when the
-- enqueue carried none. Always version 00, 55 characters (the application normalises it); the CHECK is
-- NOT VALID because a new column has nothing to check, and validating would read the whole table.
ALTER TABLE jobs ADD COLUMN traceparent text;
ALTER TABLE jobs ADD CONSTRAINT jobs_traceparent_shape CHECK (length(traceparent) = 55) NOT VALID;
