"""What each producer and worker endpoint does, between a validated request and the SQL: limits that
depend on the settings, group commit for the hot writes, and the mapping of store outcomes to API
errors. Answers are rows (app/db/rows.py); the HTTP layer turns them into documents."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import compress
from operator import attrgetter, gt
from typing import Any, NamedTuple

from app.core.coalesce import Coalescer
from app.core.dependencies import DependencyRelease
from app.core.dispatcher import ClaimDispatcher, Handoff
from app.core.effects import NEW, PENDING, RUNNING, SCHEDULED, Effects, Moves, Path
from app.core.flow import Effective, QueueConfigs
from app.core.quotas import EnqueueQuotas
from app.core.results import ResultWaiters
from app.core.workers import Agent, WorkerActivity
from app.db import claim as store_claim
from app.db import jobs as store
from app.db import writes as store_writes
from app.db.claim import ClaimResult, ClaimSlot
from app.db.debounce import jobs_insert_debounced
from app.db.dependencies import Parent, TooDeep, UnknownJobs, jobs_insert_dependent
from app.db.jobs import Debounce, NewJob, Unique
from app.db.pool import Database
from app.db.rows import ClaimRow, Inserted, JobRow
from app.db.spread import ANY, any_key, logical, spread_key
from app.db.writes import Completion, Done, Heartbeat, Outcome, Renewed
from app.errors import BadRequest, ClaimLost, JobCancelled, JobNotFound, JobTimedOut, ValidationFailed
from app.models.jobs import (
    BatchRef,
    ClaimRequest,
    CompleteBatchRequest,
    CompleteItem,
    CompleteRequest,
    EnqueueRequest,
    FailRequest,
    HeartbeatRequest,
    ReleaseRequest,
)
from app.models.json_values import InvalidUnicode, JsonValueError, checked_json_text
from app.settings import Settings

# An enqueue statement hands its jobs to the claims parked on at most this many of their queues (_handoffs).
MAX_HANDOFF_QUEUES = 4

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def invalid(loc: Sequence[str | int], msg: str, kind: str = "value_error") -> ValidationFailed:
    """A 422 shaped like pydantic's, for the checks that JSON Schema cannot express."""
    where = ".".join(str(p) for p in loc)
    return ValidationFailed(f"{where}: {msg}", errors=[{"loc": list(loc), "msg": msg, "type": kind}])


def sanitise_error(text: str, max_bytes: int) -> str:
    """Error text as stored: control characters (other than tab and newline) removed, cut to max_bytes
    of UTF-8 on a character boundary with a visible marker."""
    text = _CONTROL.sub("", text)
    raw = text.encode()
    if len(raw) <= max_bytes:
        return text
    marker = " [truncated]"
    return raw[: max_bytes - len(marker)].decode(errors="ignore") + marker


def _raise_for(outcome: Outcome) -> None:
    if outcome == "not_found":
        raise JobNotFound()
    if outcome == "claim_lost":
        raise ClaimLost()
    if outcome == "cancelled":
        raise JobCancelled()
    if outcome == "timed_out":
        raise JobTimedOut()


def json_text(value: Any, limit: int, max_depth: int, loc: Sequence[str | int], field: str | None = None) -> str:
    """A payload or result as stored: checked (what jsonb cannot hold, nesting, size) and serialised. A refusal
    names `loc`, then `field` when given (so that a batch's thousand jobs need no list each for their loc)."""
    try:
        text = checked_json_text(value, max_depth)
    except InvalidUnicode as exc:
        raise BadRequest(f"The request body is not valid JSON: {exc}") from None
    except JsonValueError as exc:
        raise invalid(_at(loc, field), str(exc)) from None
    if len(text) > limit // 4 and len(text.encode()) > limit:
        raise invalid(_at(loc, field), f"larger than {limit} bytes of JSON", "too_large")
    return text


def _at(loc: Sequence[str | int], field: str | None) -> Sequence[str | int]:
    return loc if field is None else [*loc, field]


def _parents(reqs: Sequence[EnqueueRequest], loc: list[str | int], batch: bool) -> list[list[Parent]]:
    """Each item's depends_on resolved: job ids, and earlier items of the batch named by `ref` or index.
    A name that is not an earlier item's (unknown, later, the item itself) is a 422 naming the entry."""
    refs: dict[str, int] = {}
    out: list[list[Parent]] = []
    for n, req in enumerate(reqs):
        where: list[str | int] = [*loc, n] if batch else list(loc)
        found: list[Parent] = []
        for k, entry in enumerate(req.depends_on or ()):
            ref = entry.ref if isinstance(entry, BatchRef) else entry
            if isinstance(entry, int):
                found.append(Parent(job_id=entry))
            elif isinstance(ref, int):
                if ref >= n or not batch:
                    msg = f"item {ref} is not an earlier item of this batch" if batch else "no batch to refer to"
                    raise invalid([*where, "depends_on", k], msg)
                found.append(Parent(item=ref))
            elif ref in refs:
                found.append(Parent(item=refs[ref]))
            else:
                msg = f"no earlier item of this batch has ref {ref!r}" if batch else "no batch to refer to"
                raise invalid([*where, "depends_on", k], msg)
        out.append(found)
        if req.ref is not None:
            if req.ref in refs:
                raise invalid([*where, "ref"], f"ref {req.ref!r} is already used by item {refs[req.ref]}")
            refs[req.ref] = n
    return out


def _unknown(reqs: Sequence[EnqueueRequest], loc: list[str | int], batch: bool, ids: set[int]) -> ValidationFailed:
    """The 422 for parent ids that name no job the caller may use, at the first entry naming one."""
    for n, req in enumerate(reqs):
        for k, entry in enumerate(req.depends_on or ()):
            if isinstance(entry, int) and entry in ids:
                where = [*loc, n, "depends_on", k] if batch else [*loc, "depends_on", k]
                return invalid(where, f"no job {entry} (in a queue this key may use)", "unknown_job")
    return invalid(loc, "unknown job ids")


_CREATED, _JOB = attrgetter("created"), attrgetter("job")
_QUEUE, _RUN_AT, _CREATED_AT = attrgetter("queue"), attrgetter("run_at"), attrgetter("created_at")
_DELAY = attrgetter("delay_seconds")


def inserted_moves(jobs: Sequence[NewJob], rows: Sequence[Inserted]) -> Moves:
    """The jobs the shared insert made, all pending (an idempotency key's existing job moved nothing): due,
    unless one asked for a time; then due when its run_at is no later than its created_at (both the
    statement's clock). Summed in C (map, Counter): the hot path's work per job stays what it was."""
    made = compress(map(_JOB, rows), map(_CREATED, rows))
    moves = Moves(Path.ENQUEUE)
    if any(map(_RUN_AT, jobs)) or any(map(_DELAY, jobs)):
        timed = list(made)
        later = map(gt, map(_RUN_AT, timed), map(_CREATED_AT, timed))
        for (queue, scheduled), n in Counter(zip(map(_QUEUE, timed), later, strict=True)).items():
            moves.add(queue, NEW, SCHEDULED if scheduled else PENDING, n)
    else:
        for queue, n in Counter(map(_QUEUE, made)).items():
            moves.add(queue, NEW, PENDING, n)
    return moves


def handed_moves(
    jobs: Sequence[NewJob], rows: Sequence[Inserted], queues: Sequence[str], claimed: Sequence[ClaimResult]
) -> tuple[Moves, Moves]:
    """The moves of an insert that handed jobs to parked claims in its transaction (app/core/dispatcher.py
    take_parked): a new job its claim took went from nothing to running (NEW -> RUNNING: counted enqueued and
    claimed, and it wakes nobody: no claim anywhere can take it); the other new jobs as inserted_moves says
    (pending ones wake claims, here and in other processes), and older jobs the claim took first, by claim
    order, as claims (PENDING -> RUNNING)."""
    moves = inserted_moves(jobs, rows)
    claims = Moves(Path.CLAIM)
    for queue, result in zip(queues, claimed, strict=True):
        taken = {r.id for got in result.rows for r in got}
        new = 0
        for r in rows:
            if r.created and r.job.queue == queue and r.job.id in taken:
                # Out of the move inserted_moves counted it under (a job with a time of its own may have come due
                # between the insert and the claim).
                key = (queue, NEW, SCHEDULED if r.job.run_at > r.job.created_at else PENDING)
                if (left := moves.counts.get(key, 0) - 1) > 0:
                    moves.counts[key] = left
                else:
                    moves.counts.pop(key, None)
                new += 1
        if new:
            moves.add(queue, NEW, RUNNING, new)
        if len(taken) > new:
            claims.add(queue, PENDING, RUNNING, len(taken) - new)
    return moves, claims


def _inserted_dependent(rows: Sequence[Inserted]) -> Moves:
    """The jobs a dependent insert made: pending (due or not), waiting, or cancelled at once."""
    moves = Moves(Path.ENQUEUE_DEPENDENT)
    for r in rows:
        if r.created:
            job = r.job
            to = SCHEDULED if job.status == PENDING and job.run_at > job.created_at else job.status
            moves.add_jobs(job.queue, NEW, to, (job.id,))
    return moves


def any_key_resolved(jobs: list[NewJob]) -> list[NewJob]:
    """The jobs of one insert statement, those that may go under any key of their spread queue (app/db/spread.py
    any_key) given one key per queue, drawn for this statement."""
    drawn: dict[str, str] = {}
    out = []
    for job in jobs:
        if ANY in job.queue:
            key = drawn.get(job.queue)
            if key is None:
                queue, _, spread = job.queue.partition(ANY)
                key = drawn[job.queue] = spread_key(queue, int(spread))
            job = job._replace(queue=key)
        out.append(job)
    return out


def _keyed(req: EnqueueRequest) -> bool:
    """A job that a spread queue keeps under key 0, the queue's own name (app/db/spread.py): what makes it one of a
    kind (an idempotency key, a unique or debounce key) is looked up among the jobs of one key, and its
    dependencies are released queue by queue; so all such jobs of the queue live under one key."""
    return req.idempotency_key is not None or req.unique is not None or req.debounce is not None or bool(req.depends_on)


def _moved(path: Path, job: JobRow, frm: str, to: str) -> Moves:
    moves = Moves(path)
    moves.add_jobs(job.queue, frm, to, (job.id,))
    return moves


class Renewal(NamedTuple):
    """A heartbeat's answer (app/models/answers.py HeartbeatResponse)."""

    id: int
    lease_expires_at: datetime | None
    cancel_requested: bool


class ItemOutcome(NamedTuple):
    """One item of a batch complete, or of the completes a claim carries (CompleteOutcome)."""

    id: int
    outcome: str
    status: str | None


@dataclass(slots=True, frozen=True)
class Claimed:
    """A claim's answer: the jobs handed out, and the outcome of each complete it carried."""

    jobs: list[ClaimRow]
    completed: list[ItemOutcome]


class JobService:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        dispatcher: ClaimDispatcher,
        effects: Effects,
        results: ResultWaiters,
        configs: QueueConfigs,
        quotas: EnqueueQuotas,
        release: DependencyRelease,
        activity: WorkerActivity | None = None,
    ) -> None:
        self.settings = settings
        self.configs = configs
        self.quotas = quotas
        self.dependants = release  # the jobs waiting for those a complete or fail finished
        # What claims, heartbeats, completes and fails see of workers, flushed by app/maintenance/workers.py.
        self.activity = activity if activity is not None else WorkerActivity()
        self.db = db
        self.dispatcher = dispatcher
        self.effects = effects
        self.results = results
        # Group commit for the hot writes (see app/core/coalesce.py). An item is one request's rows, so a
        # batch stays all-or-nothing (enqueue) and in order even when it shares a statement.
        self._any_keys = False  # a job of this process went to any key of a spread queue: see any_key_resolved
        self._insert: Coalescer[list[NewJob], list[Inserted]] = Coalescer(
            self._insert_many,
            max_items=max(1000, settings.max_batch_jobs),
            max_inflight=2,
            weight=len,
            isolate=lambda exc: isinstance(exc, ValidationFailed),
        )
        # Enqueues answered with ids and states only (Prefer: return=minimal): no payload travels back.
        self._insert_brief: Coalescer[list[NewJob], list[Inserted]] = Coalescer(
            lambda requests: self._insert_many(requests, full=False),
            max_items=max(1000, settings.max_batch_jobs),
            max_inflight=2,
            weight=len,
            isolate=lambda exc: isinstance(exc, ValidationFailed),
        )
        # Completes answered with the whole job (POST /jobs/{id}/complete), and completes answered with an
        # outcome only (the batch endpoint, and the completes a claim carries): no payload travels back.
        self._complete_full: Coalescer[list[Completion], list[Done]] = Coalescer(
            lambda items: self._complete_many(items, full=True), max_items=1000, max_inflight=2, weight=len
        )
        self._complete_brief: Coalescer[list[Completion], list[Done]] = Coalescer(
            lambda items: self._complete_many(items, full=False),
            max_items=max(1000, settings.max_batch_complete),
            max_inflight=2,
            weight=len,
        )
        self._heartbeat: Coalescer[Heartbeat, Renewed] = Coalescer(self._heartbeat_many, max_items=1000, max_inflight=2)

    async def aclose(self) -> None:
        for c in (self._insert, self._insert_brief, self._complete_full, self._complete_brief, self._heartbeat):
            await c.aclose()

    # -- checks ------------------------------------------------------------------------------------------

    def _json(self, value: Any, limit: int, loc: Sequence[str | int]) -> str:
        return json_text(value, limit, self.settings.max_json_depth, loc)

    def _new_job(
        self,
        queue: str,
        req: EnqueueRequest,
        loc: Sequence[str | int],
        cfg: Effective,
        traceparent: str | None = None,
    ) -> NewJob:
        # Positional, the common case's fields read once: a batch makes a thousand of these (BENCHMARKS.md, "Stop
        # 44"). The order is NewJob's.
        settings = self.settings
        priority, unique, debounce = req.priority, req.unique, req.debounce
        return NewJob(
            queue,
            json_text(req.payload, settings.max_payload_bytes, settings.max_json_depth, loc, "payload"),
            cfg.default_priority if priority is None else priority,
            req.run_at,
            # A debounced job is due `seconds` after its enqueue (what inserted_moves reads).
            req.delay_seconds if debounce is None else debounce.seconds,
            req.max_attempts or cfg.max_attempts,
            req.idempotency_key,
            traceparent,
            req.group,
            req.timeout_seconds,
            None if unique is None else Unique(unique.key, unique.for_seconds, unique.states()),
            None if debounce is None else Debounce(debounce.key, debounce.seconds, debounce.max_wait_seconds),
        )

    def _result(self, value: Any, loc: Sequence[str | int]) -> str | None:
        return None if value is None else self._json(value, self.settings.max_result_bytes, loc)

    def _completions(self, items: Sequence[CompleteItem], allowed: str | None, loc: str) -> list[Completion]:
        # An id may occur twice (one item is a retry of the other): each gets its own outcome, and of the
        # items with the claim's token the first one's result is kept (store_writes.jobs_complete).
        return [
            Completion(item.id, item.claim_token, self._result(item.result, ["body", loc, i, "result"]), allowed)
            for i, item in enumerate(items)
        ]

    # -- producers ------------------------------------------------------------------------------------------

    async def _insert_many(self, requests: list[list[NewJob]], *, full: bool = True) -> list[list[Inserted]]:
        flat = [job for jobs in requests for job in jobs]
        if self._any_keys:
            flat = any_key_resolved(flat)
        # Only a lone insert statement hands off: under a flow of enqueues, claims parked in the process are woken
        # and claim in statements of their own beside the inserts, which then share commits among themselves
        # (bench/flowing.py measured a claim inside each insert's transaction slowing both down).
        lone = self._insert.inflight + self._insert_brief.inflight == 1
        handoffs = self._handoffs(flat) if lone and self.dispatcher.parked else []
        if not handoffs:
            async with self.db.connection() as conn:
                rows = await store.jobs_insert(conn, flat, full=full)
            self.effects.apply(inserted_moves(flat, rows))
        else:
            made: list[ClaimResult] = []
            try:
                async with self.db.connection() as conn:
                    rows = await store_claim.jobs_insert_handing_off(
                        conn, flat, [(h.queue, h.slots) for h in handoffs], made, full=full
                    )
            except BaseException:
                # Failed, or the commit in doubt: claims it made may hold jobs under tokens nobody will get.
                if made:
                    self.dispatcher.release([r for result in made for got in result.rows for r in got])
                for h in handoffs:
                    self.dispatcher.handed_off(h, None)
                raise
            if not made:  # a claim failed: the jobs were inserted alone
                for h in handoffs:
                    self.dispatcher.handed_off(h, None)
                self.effects.apply(inserted_moves(flat, rows))
            else:
                for h, result in zip(handoffs, made, strict=True):
                    self.dispatcher.handed_off(h, result)
                for moves in handed_moves(flat, rows, [h.queue for h in handoffs], made):
                    self.effects.apply(moves)
        out, at = [], 0
        for jobs in requests:
            out.append(rows[at : at + len(jobs)])
            at += len(jobs)
        return out

    def _handoffs(self, flat: Sequence[NewJob]) -> list[Handoff]:
        """Claims parked here on the queues of these jobs that are due now (app/core/dispatcher.py
        take_parked): the insert claims for them in its own transaction. At most MAX_HANDOFF_QUEUES queues a
        statement, so that a shared insert's commit waits for few claims."""
        out: list[Handoff] = []
        for queue, n in Counter(j.queue for j in flat if j.run_at is None and not j.delay_seconds).items():
            if (h := self.dispatcher.take_parked(queue, n)) is not None:
                out.append(h)
                if len(out) == MAX_HANDOFF_QUEUES:
                    break
        return out

    async def enqueue(
        self,
        queue: str,
        req: EnqueueRequest,
        traceparent: str | None = None,
        allowed: str | None = None,
        *,
        minimal: bool = False,
    ) -> Inserted:
        """The job; `created` is false when the idempotency key already named it. `traceparent`: the
        enqueue's trace context, handed to the job's workers on claim. `allowed`: the caller's queue regex,
        which the jobs it depends on must be in. `minimal`: the caller reads only ids and states, so a new
        job's row may come without its payload."""
        cfg = self.configs.cached(queue) or await self.configs.get(queue)
        if cfg.spread == 1 or _keyed(req):
            key = queue
        else:  # its key is drawn where its statement is built, one for every such job of the queue there
            key, self._any_keys = any_key(queue, cfg.spread), True
        job = self._new_job(key, req, ["body"], cfg, traceparent)
        await self.quotas.admit(queue, 1, cfg.max_pending)
        written = False
        try:
            if req.depends_on:
                [inserted] = await self._insert_dependent([job], [req], ["body"], allowed)
            elif job.debounce is not None:
                [inserted] = await self._insert_debounced([job])
            elif job.unique is not None:
                [inserted] = await self._insert_unique([job])
            else:
                [inserted] = await (self._insert_brief if minimal else self._insert)([job])
            written = True
        finally:
            self.quotas.written(queue, 1, written)
        return inserted

    async def enqueue_batch(
        self,
        queue: str,
        reqs: Sequence[EnqueueRequest],
        traceparent: str | None = None,
        allowed: str | None = None,
        *,
        minimal: bool = False,
    ) -> list[Inserted]:
        # A key that occurs twice names one job, as it would in two requests: the later occurrence gets
        # the job of the first (store.jobs_insert).
        cfg = self.configs.cached(queue) or await self.configs.get(queue)
        # A spread queue takes a batch under one key: one shard's statement, and the keys even out over batches.
        key = queue if cfg.spread == 1 or any(map(_keyed, reqs)) else spread_key(queue, cfg.spread)
        jobs = [self._new_job(key, r, ("body", "jobs", i), cfg, traceparent) for i, r in enumerate(reqs)]
        dependent = any(r.depends_on for r in reqs)
        for option in ("unique", "debounce") if dependent else ():
            if (n := next((i for i, r in enumerate(reqs) if getattr(r, option) is not None), None)) is not None:
                msg = f"{option} is not supported in a batch with depends_on (yet): enqueue those jobs on their own"
                raise invalid(["body", "jobs", n, option], msg)
        if not dependent and any(r.ref is not None for r in reqs):
            _parents(reqs, ["body", "jobs"], True)  # refs unique, even when no item names one
        await self.quotas.admit(queue, len(jobs), cfg.max_pending)
        written = False
        try:
            if dependent:
                inserted = await self._insert_dependent(jobs, reqs, ["body", "jobs"], allowed)
            elif any(j.debounce is not None for j in jobs):
                inserted = await self._insert_debounced(jobs)
            elif any(j.unique is not None for j in jobs):
                inserted = await self._insert_unique(jobs)
            else:
                inserted = await (self._insert_brief if minimal else self._insert)(jobs)
            written = True
        finally:
            self.quotas.written(queue, len(jobs), written)
        return inserted

    async def _insert_unique(self, jobs: list[NewJob]) -> list[Inserted]:
        """Jobs of which some are unique: a statement of their own (the shared insert stays as it is for the
        others), one per request; a held key answers with the job that holds it. One transaction: the insert
        and the lookups that may follow it are several statements, and a failure leaves nothing made."""
        async with self.db.connection() as conn, conn.transaction():
            rows = await store.jobs_insert_unique(conn, jobs)
        self.effects.apply(inserted_moves(jobs, rows))
        return rows

    async def _insert_debounced(self, jobs: list[NewJob]) -> list[Inserted]:
        """Jobs of which some are debounced: one transaction (app/db/debounce.py). A replaced job stays
        pending, its run time moved later, so it sets nothing off: no claim is woken for it."""
        async with self.db.connection() as conn:
            rows = await jobs_insert_debounced(conn, jobs)
        self.effects.apply(inserted_moves(jobs, rows))
        return rows

    async def _insert_dependent(
        self, jobs: list[NewJob], reqs: Sequence[EnqueueRequest], loc: list[str | int], allowed: str | None
    ) -> list[Inserted]:
        """Jobs of which some depend on others: their own transaction, not the shared insert statement."""
        batch = loc[-1] == "jobs"
        parents = _parents(reqs, loc, batch)
        policies = [r.on_dependency_failure for r in reqs]
        try:
            async with self.db.connection() as conn:
                rows = await jobs_insert_dependent(
                    conn, jobs, parents, policies, allowed, self.settings.max_dependency_depth
                )
        except UnknownJobs as exc:
            raise _unknown(reqs, loc, batch, set(exc.ids)) from None
        except TooDeep as exc:
            where = [*loc, exc.item, "depends_on"] if batch else [*loc, "depends_on"]
            msg = (
                f"this job would be {exc.depth} dependencies deep (a chain of jobs, each waiting for the one "
                f"before it); at most {exc.limit} (JOBQ_MAX_DEPENDENCY_DEPTH). Depend on fewer levels, or on "
                "a job nearer the start of the chain"
            )
            raise invalid(where, msg, "too_deep") from None
        self.effects.apply(_inserted_dependent(rows))
        return rows

    # -- workers ------------------------------------------------------------------------------------------------

    # Routes addressed by job id take `allowed`: the caller's queue regex (None: every queue). A job in
    # another queue is "not_found", decided in the same guarded statement (app/auth/policy.py).

    async def claim(
        self,
        queue: str,
        req: ClaimRequest,
        allowed: str | None = None,
        disconnected: Callable[[], Awaitable[Any]] | None = None,
        *,
        client: str | None = None,
        still_authorized: Callable[[], Awaitable[bool]] | None = None,
        agent: Agent | None = None,
    ) -> Claimed:
        """Complete the jobs the request hands in, then claim: at once when jobs are ready, else within
        wait_seconds, else none. The completes are committed before the claim runs, whatever it finds.
        `disconnected` makes an awaitable that ends when the client goes away (a long-poll stops waiting);
        `client` and `still_authorized`: see ClaimDispatcher.claim; `agent`: what the request tells of the
        worker's program (the worker registry)."""
        self.activity.seen(req.worker, queue, agent)
        completed: list[ItemOutcome] = []
        if req.complete:
            completed = await self._complete_outcomes(self._completions(req.complete, allowed, "complete"))
        lease = req.lease_seconds or (self.configs.cached(queue) or await self.configs.get(queue)).lease_seconds
        slot = ClaimSlot(req.worker, lease, req.limit)
        rows = await self.dispatcher.claim(
            queue, slot, req.wait_seconds, disconnected, client=client, still_authorized=still_authorized
        )
        return Claimed(rows, completed)

    async def _heartbeat_many(self, beats: list[Heartbeat]) -> list[Renewed]:
        async with self.db.connection() as conn:
            return await store_writes.jobs_heartbeat(conn, beats)

    async def heartbeat(
        self, job_id: int, req: HeartbeatRequest, allowed: str | None = None, agent: Agent | None = None
    ) -> Renewal:
        beat = Heartbeat(job_id, req.claim_token, req.lease_seconds, allowed)
        if "progress" in req.model_fields_set:
            progress = None
            if req.progress is not None:
                progress = self._json(req.progress, self.settings.max_progress_bytes, ["body", "progress"])
            beat = Heartbeat(job_id, req.claim_token, req.lease_seconds, allowed, progress, set_progress=True)
        renewed = await self._heartbeat(beat)
        outcome, expires = renewed.outcome, renewed.lease_expires_at
        if renewed.worker is not None and renewed.queue is not None:
            self.activity.seen(renewed.worker, logical(renewed.queue), agent)
        if outcome == "cancelled":
            # Cooperative cancel: the worker learns it here, stops, and does not complete.
            return Renewal(job_id, None, True)
        _raise_for(outcome)
        return Renewal(job_id, expires, False)

    async def _complete_many(self, requests: list[list[Completion]], *, full: bool) -> list[list[Done]]:
        flat = [item for items in requests for item in items]
        async with self.db.connection() as conn:
            done = await store_writes.jobs_complete(conn, flat, full=full)
        # One pass, as the counts before it: ids and durations per queue, then one entry per queue.
        per_queue: dict[str, tuple[list[int], list[float]]] = {}
        for d in done:
            job = d.job
            if d.changed and job is not None:
                self.activity.finished(job.worker, logical(job.queue), completed=1)
            if d.changed and job is not None and job.finished_at and job.claimed_at:
                if (entry := per_queue.get(job.queue)) is None:
                    entry = per_queue[job.queue] = ([], [])
                entry[0].append(job.id)
                entry[1].append((job.finished_at - job.claimed_at).total_seconds() * 1000)
        moves = Moves(Path.COMPLETE)
        for queue, (ids, durations) in per_queue.items():
            moves.completed(queue, ids, durations)
        self.effects.apply(moves)
        # Their dependants: the direct ones released now, before the completes are answered.
        await self.dependants.after_finish(d.job for d in done if d.changed)
        out, at = [], 0
        for items in requests:
            out.append(done[at : at + len(items)])
            at += len(items)
        return out

    async def complete(
        self, job_id: int, req: CompleteRequest, allowed: str | None = None, *, minimal: bool = False
    ) -> JobRow:
        """The job as completed; `minimal`: the caller reads only its id and status, so the row may come
        without payload and result (the statement it shares is then the batch completes')."""
        result = self._result(req.result, ["body", "result"])
        completes = self._complete_brief if minimal else self._complete_full
        [done] = await completes([Completion(job_id, req.claim_token, result, allowed)])
        _raise_for(done.outcome)
        assert done.job is not None
        return done.job

    async def _complete_outcomes(self, items: list[Completion]) -> list[ItemOutcome]:
        done = await self._complete_brief(items)
        return [
            ItemOutcome(
                item.id,
                "completed" if d.outcome == "ok" else d.outcome,
                d.job.status if d.job is not None else None,
            )
            for item, d in zip(items, done, strict=True)
        ]

    async def complete_batch(self, req: CompleteBatchRequest, allowed: str | None = None) -> list[ItemOutcome]:
        return await self._complete_outcomes(self._completions(req.jobs, allowed, "jobs"))

    async def fail(self, job_id: int, req: FailRequest, allowed: str | None = None) -> JobRow:
        async with self.db.connection() as conn:
            done = await store_writes.job_fail(
                conn,
                job_id,
                req.claim_token,
                sanitise_error(req.error, self.settings.max_error_bytes),
                allowed=allowed,
                retry=req.retry,
                retry_in=req.retry_in_seconds,
                backoff_base=self.settings.backoff_base_seconds,
                backoff_cap=self.settings.backoff_cap_seconds,
            )
        _raise_for(done.outcome)
        job = done.job
        assert job is not None
        if done.changed:
            self.activity.finished(job.worker, logical(job.queue), failed=1)
            # A retry asked for now is claimable at once; one after a backoff only frees the slot.
            due = job.status != PENDING or req.retry_in_seconds == 0
            self.effects.apply(_moved(Path.FAIL, job, RUNNING, job.status if due else SCHEDULED))
            await self.dependants.after_finish([job])  # failed for good: its dependants cancelled
        return job

    async def release(self, job_id: int, req: ReleaseRequest, allowed: str | None = None) -> JobRow:
        """Hand a claimed job back untried: pending again, the claim's attempt not counted. A job whose
        cancel was requested answers job-cancelled, as complete does: the operator's cancel wins, and the
        worker learns the job will not come back."""
        async with self.db.connection() as conn:
            done = await store_writes.job_release_claim(conn, job_id, req.claim_token, req.delay_seconds, allowed)
        _raise_for(done.outcome)
        job = done.job
        assert job is not None
        if done.changed:
            self.effects.apply(_moved(Path.RELEASE, job, RUNNING, PENDING if req.delay_seconds == 0 else SCHEDULED))
        return job

    # -- reads -------------------------------------------------------------------------------------------------------

    async def get(
        self,
        job_id: int,
        allowed: str | None = None,
        wait_seconds: float = 0,
        disconnected: Callable[[], Awaitable[Any]] | None = None,
        *,
        client: str | None = None,
        still_authorized: Callable[[], Awaitable[bool]] | None = None,
    ) -> JobRow:
        """The job; with wait_seconds, once it has finished or else as it is at the deadline (a waiting
        request holds no connection: app/core/results.py)."""
        return await self.results.wait(
            job_id, allowed, wait_seconds, disconnected, client=client, still_authorized=still_authorized
        )
