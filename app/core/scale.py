"""The scaling signal of a queue: how many more claims could be served now under its limits (what an
autoscaler should scale workers on, rather than the raw backlog, which over-scales a queue its limits hold
back), with its jobs in flight and the age of its oldest ready job (app/db/scale.py)."""

from __future__ import annotations

from dataclasses import dataclass

from app.core.flow import QueueConfigs
from app.db import scale as store_scale
from app.db.replica import Conn, Reads
from app.db.scale import ScaleRow

DEFAULT_CAP = 1000


@dataclass(slots=True, frozen=True)
class Scale:
    queue: str
    claimable: int
    held_by: list[str]  # the limits that keep claimable below ready: paused, concurrency, rate, groups
    row: ScaleRow


def scale_of(queue: str, row: ScaleRow) -> Scale:
    if row.paused:
        return Scale(queue, 0, ["paused"] if row.ready else [], row)
    rooms = {"concurrency": row.room_concurrency, "rate": row.room_rate}
    queue_wide = max(0, min([row.ready, *(v for v in rooms.values() if v is not None)]))
    held = [name for name, v in rooms.items() if v is not None and v < row.ready and max(0, v) == queue_wide]
    claimable = queue_wide
    # The groups are walked only until they cover what the queue-wide limits allow: they hold claims back
    # only when they let through less than that.
    if row.room_groups is not None and row.room_groups < queue_wide:
        claimable, held = row.room_groups, ["groups"]
    return Scale(queue, claimable, held, row)


class ScaleService:
    """An autoscaler polls this every few seconds and acts on a trend, not on one answer: the read replica
    serves it when there is one (at most JOBQ_READ_MAX_LAG_SECONDS behind, which may show a few claims or
    jobs fewer than the primary would), so that the polling adds no load to the primary."""

    def __init__(self, reads: Reads, configs: QueueConfigs) -> None:
        self.reads = reads
        self.configs = configs  # a spread queue's keys (app/db/spread.py), whose jobs its signal adds up

    async def scale(self, queue: str, cap: int = DEFAULT_CAP) -> Scale:
        names = (await self.configs.get(queue)).keys or (queue,)

        async def read(conn: Conn) -> ScaleRow:
            return await store_scale.queue_scale(conn, names, cap)

        return scale_of(queue, await self.reads.run(read))
