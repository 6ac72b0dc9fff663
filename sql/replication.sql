-- Rendered from app/db/replication.py by `make sql`: do not edit. tests/unit/test_sql_rendered.py compares.

-- name: REPLICATION_STATE --
-- The standbys streaming from this server (a base backup in progress is not one), how many of them a
-- commit waits for, and the settings that decide it. Without pg_read_all_stats (pg_monitor) the rows of
-- pg_stat_replication show their pid only: sync_state is then NULL and synchronous_standbys unknown.
SELECT (SELECT count(*) FROM pg_stat_replication WHERE state IS DISTINCT FROM 'backup')::int AS standbys,
       (SELECT count(*) FILTER (WHERE sync_state IN ('sync', 'quorum'))
          FROM pg_stat_replication
         HAVING count(*) = count(sync_state))::int AS synchronous_standbys,
       current_setting('synchronous_standby_names') AS synchronous_standby_names,
       (SELECT reset_val FROM pg_settings WHERE name = 'synchronous_commit') AS server_synchronous_commit
