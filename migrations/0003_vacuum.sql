-- The jobs table is a queue: every job is inserted, updated two or three times and deleted, so dead
-- row versions pile up several times faster than live rows. Measured (BENCHMARKS.md, "a million jobs
-- through"): with PostgreSQL's default autovacuum the table reached 616 MiB of dead rows and claim +
-- complete fell to 0.43 of its fresh-table rate, because claims scan the dead entries at the head of
-- jobs_claim_idx. jobq vacuums the table itself (app/maintenance/vacuum.py); these settings make
-- autovacuum a prompt second line: start after 2,000 dead rows or 2% of the table, unthrottled.
ALTER TABLE jobs SET (
  autovacuum_vacuum_threshold = 2000,
  autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_vacuum_insert_threshold = 2000,
  autovacuum_vacuum_insert_scale_factor = 0.02,
  autovacuum_analyze_threshold = 2000,
  autovacuum_analyze_scale_factor = 0.02,
  autovacuum_vacuum_cost_delay = 0
);

-- The counters and per-minute statistics are updated in place all day: vacuum them promptly too.
ALTER TABLE queue_counts SET (autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_scale_factor = 0.0);
ALTER TABLE queue_stats SET (autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_scale_factor = 0.05);
