-- A request rate of its own per API key (issue 21): requests a second one process takes from the key, and
-- how many at once after a pause. NULL: the global setting (JOBQ_KEY_RATE_PER_SECOND, JOBQ_KEY_RATE_BURST);
-- a rate of 0: no limit. Nullable columns without a default: a catalog change, and a release that does
-- not know them reads and writes the table as before.
ALTER TABLE api_keys
  ADD COLUMN rate_per_second double precision CHECK (rate_per_second >= 0 AND rate_per_second <= 1000000),
  ADD COLUMN rate_burst      integer          CHECK (rate_burst BETWEEN 1 AND 10000000);
