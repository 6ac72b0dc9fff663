"""Whether the primary jobq writes to replicates synchronously: read on every new pooled connection (at
start, and on each reconnect, a failover included), so that an asynchronous setup, which may lose
acknowledged jobs on failover, is reported rather than assumed away.

jobq sets `synchronous_commit = on` in its own sessions (app/db/pool.py), so its commits wait for the
standbys named in `synchronous_standby_names` whatever the server's default; what decides is whether that
list is empty while standbys stream from the primary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg.rows import class_row

Mode = Literal["none", "synchronous", "asynchronous"]

REPLICATION_STATE = """
-- The standbys streaming from this server (a base backup in progress is not one), how many of them a
-- commit waits for, and the settings that decide it. Without pg_read_all_stats (pg_monitor) the rows of
-- pg_stat_replication show their pid only: sync_state is then NULL and synchronous_standbys unknown.
SELECT (SELECT count(*) FROM pg_stat_replication WHERE state IS DISTINCT FROM 'backup')::int AS standbys,
       (SELECT count(*) FILTER (WHERE sync_state IN ('sync', 'quorum'))
          FROM pg_stat_replication
         HAVING count(*) = count(sync_state))::int AS synchronous_standbys,
       current_setting('synchronous_standby_names') AS synchronous_standby_names,
       (SELECT reset_val FROM pg_settings WHERE name = 'synchronous_commit') AS server_synchronous_commit
"""

ASYNCHRONOUS_WARNING = (
    "the primary has {standbys} standby(s) but replicates asynchronously (synchronous_standby_names is empty): "
    "a job acknowledged just before a failover may be missing on the promoted standby. Set "
    "synchronous_standby_names (Patroni: synchronous_mode: true; CloudNativePG: minSyncReplicas >= 1)"
)
NO_SYNCHRONOUS_STANDBY = (
    "synchronous_standby_names is set but no synchronous standby is connected: every commit waits until one is"
)


@dataclass(frozen=True, slots=True)
class ReplicationRow:
    standbys: int
    synchronous_standbys: int | None
    synchronous_standby_names: str
    server_synchronous_commit: str


@dataclass(frozen=True, slots=True)
class Replication:
    """What the primary said, and what it means for an acknowledged job."""

    mode: Mode
    standbys: int
    synchronous_standbys: int | None  # None: not visible to jobq's role (grant it pg_monitor)
    synchronous_standby_names: str
    server_synchronous_commit: str  # the server's default; jobq's sessions use `on`
    warning: str | None

    @property
    def asynchronous(self) -> bool:
        return self.mode == "asynchronous"

    def summary(self) -> dict[str, Any]:
        """What /readyz shows, to anyone (no setting that may name hosts)."""
        return {
            "mode": self.mode,
            "standbys": self.standbys,
            "synchronous_standbys": self.synchronous_standbys,
            "warning": self.warning,
        }

    def document(self) -> dict[str, Any]:
        """What the stats show (an admin's)."""
        return {
            "mode": self.mode,
            "standbys": self.standbys,
            "synchronous_standbys": self.synchronous_standbys,
            "synchronous_standby_names": self.synchronous_standby_names,
            "server_synchronous_commit": self.server_synchronous_commit,
            "warning": self.warning,
        }


def judge(row: ReplicationRow) -> Replication:
    names = row.synchronous_standby_names.strip()
    warning = None
    if names:
        mode: Mode = "synchronous"
        if row.synchronous_standbys == 0:
            warning = NO_SYNCHRONOUS_STANDBY
    elif row.standbys:
        mode = "asynchronous"
        warning = ASYNCHRONOUS_WARNING.format(standbys=row.standbys)
    else:
        mode = "none"  # a single server (or replication jobq cannot see, such as a managed service's storage)
    return Replication(mode, row.standbys, row.synchronous_standbys, names, row.server_synchronous_commit, warning)


async def replication_state(conn: psycopg.AsyncConnection[Any]) -> Replication:
    async with conn.cursor(row_factory=class_row(ReplicationRow)) as cur:
        await cur.execute(REPLICATION_STATE)
        row = await cur.fetchone()
    assert row is not None
    return judge(row)
