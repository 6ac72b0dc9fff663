"""What the SQS API does with jobq's parts: SQS queues (a row of attributes beside a jobq queue), sends with
message attributes and FIFO deduplication, the extras a receive reads, purges and dead-letter redrives.
The protocol (parsing, limits, answers) is app/sqs/; everything a message does once sent is JobService's."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from app.core.dispatcher import ClaimDispatcher
from app.core.effects import CANCELLED, Effects, Moves, Path
from app.core.flow import Effective, QueueConfigs
from app.core.jobs import Claimed, ItemOutcome, JobService, Renewal, inserted_moves, json_text
from app.core.operations import OpsService
from app.db import jobs as store_jobs
from app.db import sqs as store
from app.db.jobs import NewJob
from app.db.pool import Database
from app.db.rows import JobRow
from app.db.spread import spread_key
from app.db.sqs import SqsQueueRow
from app.models.flow import QueueConfigPatch, RetentionPatch
from app.models.jobs import Contract, build_contract
from app.settings import Settings

# How long this process trusts what it read of an SQS queue's row (existence, default delay and wait, size
# limit): a change made through another replica shows here within this time.
QUEUE_CACHE_SECONDS = 5.0
# The most attempts jobq allows: an SQS queue without a RedrivePolicy redelivers (all but) forever.
NO_REDRIVE_ATTEMPTS = 1000


class NoSuchQueue(Exception):
    """The queue was not created over SQS (nor named by GetQueueUrl)."""


class Outgoing(NamedTuple):
    """A message to send, checked by the protocol layer."""

    body: str
    attributes: str | None  # the message attributes as sent (JSON text), None: none
    delay_seconds: int
    group: str | None = None
    dedup_id: str | None = None  # FIFO only


@dataclass(frozen=True, slots=True)
class Sent:
    job_id: int
    duplicate: bool  # a FIFO message whose deduplication id was live: nothing new was sent


class SqsService:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        jobs: JobService,
        ops: OpsService,
        configs: QueueConfigs,
        dispatcher: ClaimDispatcher,
        effects: Effects,
    ) -> None:
        self.settings = settings
        self.db = db
        self.jobs = jobs
        self.ops = ops
        self.configs = configs
        self.dispatcher = dispatcher
        self.effects = effects  # what a send's and a purge's moves set off (app/core/effects.py)
        self.contract: Contract = build_contract(settings)
        self._queues: dict[str, tuple[float, SqsQueueRow]] = {}

    # -- queues --------------------------------------------------------------------------------------------

    def _remember(self, row: SqsQueueRow) -> SqsQueueRow:
        if len(self._queues) >= 10_000:
            self._queues.clear()
        self._queues[row.queue] = (time.monotonic() + QUEUE_CACHE_SECONDS, row)
        return row

    async def queue(self, name: str, *, fresh: bool = False) -> SqsQueueRow:
        """The queue's row (cached a few seconds unless `fresh`); NoSuchQueue if it is not an SQS queue."""
        hit = self._queues.get(name)
        if hit is not None and not fresh and hit[0] > time.monotonic():
            return hit[1]
        async with self.db.connection() as conn:
            row = await store.sqs_queue_get(conn, name)
        if row is None:
            self._queues.pop(name, None)
            raise NoSuchQueue(name)
        return self._remember(row)

    async def create(
        self,
        name: str,
        values: dict[str, Any],
        tags: dict[str, str],
        config: dict[str, Any],
        defaults: dict[str, Any] | None = None,
    ) -> tuple[SqsQueueRow, bool]:
        """The queue and whether this call made it. A new queue gets `config` (queue_config's fields: lease,
        attempts, order), and `defaults` for the fields its jobq configuration does not set already (a queue
        that jobq used before keeps what its operator chose)."""
        async with self.db.connection() as conn:
            row, created = await store.sqs_queue_create(conn, name, values, tags)
        if created:
            fields = dict(config)
            if defaults:
                stored = await self.ops.config(name)
                for field, value in defaults.items():
                    if field not in fields and (stored is None or getattr(stored, field) is None):
                        fields[field] = value
            if fields:
                await self.ops.configure(name, queue_config(**fields))
        return self._remember(row), created

    async def adopt(self, name: str) -> SqsQueueRow:
        """GetQueueUrl of a queue jobq knows but SQS does not yet: it becomes an SQS queue with SQS's defaults
        and its jobq configuration as it is. NoSuchQueue when jobq does not know it either."""
        try:
            return await self.queue(name)
        except NoSuchQueue:
            pass
        names = (await self.configs.get(name)).keys or (name,)  # a spread queue's keys (app/db/spread.py)
        async with self.db.connection() as conn:
            known = any([await store.jobq_queue_known(conn, key) for key in names])
        if not known:
            raise NoSuchQueue(name)
        row, _ = await self.create(name, dict(DEFAULTS), {}, {})
        return row

    async def names(self, prefix: str, after: str | None, limit: int) -> list[str]:
        async with self.db.connection() as conn:
            return await store.sqs_queues_list(conn, prefix, after, limit)

    async def set_attributes(self, name: str, values: dict[str, Any], config: QueueConfigPatch) -> None:
        if values:
            async with self.db.connection() as conn:
                await store.sqs_queue_set(conn, name, values)
        if config.model_fields_set:
            await self.ops.configure(name, config)
        self._queues.pop(name, None)

    async def lease_seconds(self, name: str) -> int:
        """The queue's VisibilityTimeout: its jobq lease."""
        return (self.configs.cached(name) or await self.configs.get(name)).lease_seconds

    async def counts(self, name: str) -> dict[str, Any]:
        stats = await self.ops.stats(name, None)
        counts: dict[str, Any] = stats["counts"]
        return counts

    async def tag(self, name: str, add: dict[str, str], remove: Sequence[str]) -> None:
        async with self.db.connection() as conn:
            await store.sqs_queue_tag(conn, name, add, remove)
        self._queues.pop(name, None)

    async def purge(self, name: str) -> int:
        """Every unfinished job of the queue cancelled (running ones too: their workers learn it)."""
        moves = Moves(Path.PURGE)
        n, depended_on = 0, False
        async with self.db.connection() as conn:
            # A spread queue's jobs under every key (app/db/spread.py), each key's statements on its own shard.
            for key in (await self.configs.get(name)).keys or (name,):
                purged, parents = await store.jobs_purge(conn, key, self.settings.sweep_batch_size)
                for was, ids in purged.items():
                    moves.add_jobs(key, was, CANCELLED, ids)
                    n += len(ids)
                depended_on = depended_on or bool(parents)
        self.effects.apply(moves)
        if depended_on:
            self.ops.dependants.backlog()  # jobs depend on some of them: cancelled in the background
        return n

    async def delete(self, name: str) -> None:
        """DeleteQueue: purged, then no longer an SQS queue (its finished jobs stay until retention)."""
        await self.purge(name)
        async with self.db.connection() as conn:
            await store.sqs_queue_delete(conn, name)
        self._queues.pop(name, None)

    async def dead_letter_sources(self, name: str) -> list[str]:
        async with self.db.connection() as conn:
            return await store.sqs_dead_letter_sources(conn, name)

    async def redrive(self, source: str, queues: Sequence[str], task: dict[str, Any]) -> int:
        """StartMessageMoveTask: the failed jobs of `queues` back to pending; the task recorded on `source`."""
        moved = 0
        for queue in queues:
            moved += int((await self.ops.redrive(queue, None, False, None))["jobs"])
        async with self.db.connection() as conn:
            await store.sqs_move_task_set(conn, source, {**task, "ApproximateNumberOfMessagesMoved": moved})
        self._queues.pop(source, None)
        return moved

    # -- messages -----------------------------------------------------------------------------------------

    async def send(
        self, queue: str, messages: Sequence[Outgoing], fifo: bool, traceparent: str | None = None
    ) -> list[Sent]:
        """Send in order, all or nothing. Plain messages share JobService's insert statement (group commit);
        messages with attributes, and FIFO ones, are inserted with their rows here, in one transaction."""
        if not fifo and all(m.attributes is None for m in messages):
            # Validated by the same models as a jobq batch enqueue (pydantic's core: faster than constructing them).
            batch = self.contract.enqueue_batch.model_validate({"jobs": [_enqueue_item(m) for m in messages]})
            inserted = await self.jobs.enqueue_batch(queue, batch.jobs, traceparent)
            return [Sent(i.job.id, False) for i in inserted]
        return await self._send_with_rows(queue, messages, fifo, traceparent)

    async def _send_with_rows(
        self, queue: str, messages: Sequence[Outgoing], fifo: bool, traceparent: str | None
    ) -> list[Sent]:
        cfg = self.configs.cached(queue) or await self.configs.get(queue)
        await self.jobs.quotas.admit(queue, len(messages), cfg.max_pending)
        written = False
        try:
            sent = await self._insert_with_rows(queue, messages, fifo, traceparent, cfg)
            written = True
        finally:
            self.jobs.quotas.written(queue, len(messages), written)
        return sent

    async def _insert_with_rows(
        self, queue: str, messages: Sequence[Outgoing], fifo: bool, traceparent: str | None, cfg: Effective
    ) -> list[Sent]:
        limit, depth = self.settings.max_payload_bytes, self.settings.max_json_depth
        out: list[Sent | None] = [None] * len(messages)
        first: dict[str, int] = {}  # deduplication id -> the first message of this batch that carries it
        async with self.db.connection() as conn, conn.transaction():
            taken: set[str] = set()
            live: dict[str, int] = {}
            if fifo:
                ids = [m.dedup_id for m in messages if m.dedup_id is not None]
                taken, live = await store.sqs_dedup_take(conn, queue, sorted(set(ids)))
            fresh: list[int] = []
            for n, m in enumerate(messages):
                key = m.dedup_id
                if key is None or (key in taken and key not in first):
                    fresh.append(n)
                    if key is not None:
                        first[key] = n
                elif key in live:
                    out[n] = Sent(live[key], True)
                # else: a repeat of an id taken by an earlier message of this batch, filled in below
            # A spread queue (app/db/spread.py): the messages under one key, as a jobq batch; a FIFO queue's under
            # key 0, where its deduplication ids are kept.
            key = queue if fifo or cfg.spread == 1 else spread_key(queue, cfg.spread)
            jobs = [
                NewJob(
                    queue=key,
                    payload=json_text(messages[n].body, limit, depth, ["body", "MessageBody"]),
                    priority=cfg.default_priority,
                    run_at=None,
                    delay_seconds=messages[n].delay_seconds or None,
                    max_attempts=cfg.max_attempts,
                    idempotency_key=None,
                    traceparent=traceparent,
                    group=messages[n].group,
                )
                for n in fresh
            ]
            rows = await store_jobs.jobs_insert(conn, jobs) if jobs else []
            extras = []
            for n, r in zip(fresh, rows, strict=True):
                out[n] = Sent(r.job.id, False)
                m = messages[n]
                if m.attributes is not None or m.dedup_id is not None:
                    extras.append((r.job.id, m.attributes, m.dedup_id))
            if extras:
                await store.sqs_messages_insert(conn, extras)
            if fifo and first:
                await store.sqs_dedup_bind(conn, queue, {k: rows[fresh.index(n)].job.id for k, n in first.items()})
        for n, m in enumerate(messages):
            if out[n] is None and m.dedup_id is not None:
                made = out[first[m.dedup_id]]
                assert made is not None
                out[n] = Sent(made.job_id, True)
        self.effects.apply(inserted_moves(jobs, rows))
        return [s for s in out if s is not None]

    async def receive(
        self,
        queue: str,
        limit: int,
        lease_seconds: int | None,  # None: the queue's VisibilityTimeout (its lease)
        wait_seconds: float,
        allowed: str | None,
        disconnected: Callable[[], Awaitable[Any]] | None,
        client: str,
        still_authorized: Callable[[], Awaitable[bool]] | None,
    ) -> Claimed:
        fields: dict[str, Any] = {"worker": "sqs", "limit": limit, "wait_seconds": wait_seconds}
        if lease_seconds is not None:
            fields["lease_seconds"] = lease_seconds
        req = self.contract.claim.model_validate(fields)
        return await self.jobs.claim(
            queue, req, allowed, disconnected, client=client, still_authorized=still_authorized
        )

    async def extras(self, job_ids: Sequence[int]) -> dict[int, tuple[str | None, str | None]]:
        """Per job sent with them: (message attributes as JSON text, deduplication id)."""
        if not job_ids:
            return {}
        async with self.db.connection() as conn:
            return await store.sqs_messages_get(conn, job_ids)

    async def delete_messages(self, handles: Sequence[tuple[int, str]], allowed: str | None) -> list[ItemOutcome]:
        req = self.contract.complete_batch.model_validate({"jobs": [{"id": i, "claim_token": t} for i, t in handles]})
        return await self.jobs.complete_batch(req, allowed)

    async def change_visibility(self, job_id: int, token: str, seconds: int, allowed: str | None) -> Renewal | JobRow:
        """ChangeMessageVisibility: a heartbeat with a new lease; 0 releases the job back at once."""
        if seconds == 0:
            release = self.contract.release.model_validate({"claim_token": token})
            return await self.jobs.release(job_id, release, allowed)
        beat = self.contract.heartbeat.model_validate({"claim_token": token, "lease_seconds": seconds})
        return await self.jobs.heartbeat(job_id, beat, allowed)


def _enqueue_item(m: Outgoing) -> dict[str, Any]:
    item: dict[str, Any] = {"payload": m.body}
    if m.delay_seconds:
        item["delay_seconds"] = float(m.delay_seconds)
    if m.group is not None:
        item["group"] = m.group
    return item


DEFAULTS: dict[str, Any] = {
    "delay_seconds": 0,
    "receive_wait_seconds": 0,
    "maximum_message_size": 262_144,
    "retention_seconds": 345_600,
    "content_based_dedup": False,
    "redrive_policy": None,
}


def queue_config(
    *,
    lease_seconds: int | None = None,
    max_attempts: int | None = None,
    ordered: bool | None = None,
    retention_failed: int | None = None,
) -> QueueConfigPatch:
    """The jobq configuration an SQS attribute sets (only the fields given)."""
    fields: dict[str, Any] = {}
    if lease_seconds is not None:
        fields["lease_seconds"] = lease_seconds
    if max_attempts is not None:
        fields["max_attempts"] = max_attempts
    if ordered is not None:
        fields["ordered"] = ordered
    if retention_failed is not None:
        fields["retention"] = RetentionPatch(failed=retention_failed)
    return QueueConfigPatch(**fields)


def tags_of(row: SqsQueueRow) -> dict[str, str]:
    tags: dict[str, str] = orjson.loads(row.tags)
    return tags
