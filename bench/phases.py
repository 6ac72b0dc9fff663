"""What jobq's producers and workers do in each phase, over HTTP: the lean client for load, and httpx beside
it for wake latency as a real user's client sees it. Every answer is checked: a phase that got anything but
what a working queue answers raises PhaseError instead of reporting a figure."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

import orjson

from bench.harness import HOST, PAYLOAD, PhaseError, Service, expect, rss_mib
from bench.loadgen import Connection

ENQUEUE_BODY = orjson.dumps({"payload": PAYLOAD})
PREFER_MINIMAL = b"Prefer: return=minimal\r\n"


def _expect_shape(body: bytes, minimal: bool) -> None:
    """A minimal answer (Prefer: return=minimal) has no payload; a full one has it. Either way, the other
    would make the A/B comparison a lie."""
    if (b'"payload"' in body) == minimal:
        raise PhaseError(f"asked for {'a minimal' if minimal else 'the full'} answer, got: {body[:300]!r}")


class Enqueue:
    """Enqueue single jobs or batches; `minimal`: with `Prefer: return=minimal`, each answer checked for it."""

    def __init__(self, port: int, batch: int, *, minimal: bool = False) -> None:
        self.port = port
        self.batch = batch
        self.minimal = minimal
        self.headers = PREFER_MINIMAL if minimal else b""
        self.path = "/queues/bench/jobs/batch" if batch > 1 else "/queues/bench/jobs"
        self.body = orjson.dumps({"jobs": [{"payload": PAYLOAD}] * batch}) if batch > 1 else ENQUEUE_BODY

    async def __call__(self, conn: Connection, counter: list[int]) -> None:
        status, body = await conn.post(self.path, self.body, self.headers)
        expect(status, body, 201)
        _expect_shape(body, self.minimal)
        counter[0] += self.batch


def _check_outcomes(sent: list[dict[str, Any]], outcomes: Any) -> None:
    """One outcome per item, in request order, every one `completed`: anything else is a broken phase."""
    if not isinstance(outcomes, list) or len(outcomes) != len(sent):
        raise PhaseError(f"{len(sent)} completes sent, outcomes answered: {outcomes!r:.300}")
    for item, got in zip(sent, outcomes, strict=True):
        if got.get("id") != item["id"] or got.get("outcome") != "completed":
            raise PhaseError(f"complete of job {item['id']} answered {got!r}")


class ClaimComplete:
    """Claim `limit` jobs, then complete them: one request per job at limit 1 (`POST /jobs/{id}/complete`), a
    batch complete above it, or, with `handin`, nothing extra: the next claim hands them in (`complete` on
    the claim body), one request per round. Counts completed jobs. No result is sent in any variant.
    `minimal`: single completes ask for `Prefer: return=minimal` (each answer checked for it)."""

    def __init__(
        self, port: int, limit: int, handin: bool = False, *, minimal: bool = False, queues: Sequence[str] = ()
    ) -> None:
        self.port = port
        # Where each claim goes: the queue `bench`, or one of `queues` at random (each claim its own pick).
        self.paths = [f"/queues/{q}/claim" for q in queues or ("bench",)]
        self.limit = limit
        self.handin = handin
        self.minimal = minimal
        self.complete_headers = PREFER_MINIMAL if minimal else b""
        self.claim = orjson.dumps({"worker": "bench", "limit": limit, "lease_seconds": 60})
        self.held: dict[Connection, list[dict[str, Any]]] = {}

    async def _claim(self, conn: Connection, complete: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        body = self.claim
        if complete is not None:
            body = orjson.dumps({"worker": "bench", "limit": self.limit, "lease_seconds": 60, "complete": complete})
        path = self.paths[0] if len(self.paths) == 1 else random.choice(self.paths)
        status, raw = await conn.post(path, body)
        expect(status, raw, 200)
        answer = orjson.loads(raw)
        if complete is not None:
            _check_outcomes(complete, answer.get("completed"))
        jobs: list[dict[str, Any]] = answer["jobs"]
        if not jobs:
            raise PhaseError("the queue ran dry: preload more jobs (--preload)")
        return jobs

    async def __call__(self, conn: Connection, counter: list[int]) -> None:
        if self.handin:
            done = self.held.pop(conn, [])
            jobs = await self._claim(conn, done)
            counter[0] += len(done)
            self.held[conn] = [{"id": j["id"], "claim_token": j["claim_token"]} for j in jobs]
            return
        jobs = await self._claim(conn, None)
        if self.limit == 1:
            job = jobs[0]
            status, raw = await conn.post(
                f"/jobs/{job['id']}/complete",
                b'{"claim_token":"%s"}' % job["claim_token"].encode(),
                self.complete_headers,
            )
            expect(status, raw, 200)
            _expect_shape(raw, self.minimal)
        else:
            items = [{"id": j["id"], "claim_token": j["claim_token"]} for j in jobs]
            status, raw = await conn.post("/jobs/complete", orjson.dumps({"jobs": items}))
            expect(status, raw, 200)
            _check_outcomes(items, orjson.loads(raw).get("results"))
        counter[0] += len(jobs)


async def handin_supported(port: int) -> bool:
    """Does this server take completes on the claim body? A server without the field refuses it (422), or
    would ignore it (no `completed` in the answer): either way the hand-in phases cannot run."""
    conn = await Connection(HOST, port).open()
    try:
        body = orjson.dumps({"worker": "probe", "limit": 1, "complete": []})
        status, raw = await conn.post("/queues/bench-probe/claim", body)
    finally:
        await conn.close()
    if status == 422:
        return False
    expect(status, raw, 200)
    return "completed" in orjson.loads(raw)


def summarize(times_ms: list[float]) -> dict[str, float]:
    times_ms = sorted(times_ms)
    return {
        "samples": len(times_ms),
        "p50_ms": statistics.median(times_ms),
        "p99_ms": times_ms[max(0, int(len(times_ms) * 0.99) - 1)],
        "max_ms": times_ms[-1],
    }


WARMUP_SAMPLES = 50


async def latency_lean(port: int, samples: int, idle: float) -> dict[str, float]:
    """An idle worker long-polls; a producer enqueues one job; time from sending the enqueue to the
    worker holding the claim. Sequential samples, the worker parked `idle` seconds before each."""
    worker = await Connection(HOST, port).open()
    producers = [await Connection(HOST, port).open() for _ in range(4)]  # spread over server processes
    poll = orjson.dumps({"worker": "lat", "wait_seconds": 30})
    times = []
    try:
        for i in range(samples + WARMUP_SAMPLES):
            pending = asyncio.create_task(worker.post("/queues/lat/claim", poll))
            await asyncio.sleep(idle)
            producer = producers[i % len(producers)]
            t0 = time.perf_counter()
            status, raw = await producer.post("/queues/lat/jobs", ENQUEUE_BODY)
            expect(status, raw, 201)
            status, raw = await pending
            t1 = time.perf_counter()
            expect(status, raw, 200)
            jobs = orjson.loads(raw)["jobs"]
            if len(jobs) != 1:
                raise PhaseError(f"the waiting claim answered {len(jobs)} jobs")
            job = jobs[0]
            body = b'{"claim_token":"%s"}' % job["claim_token"].encode()
            status, raw = await producer.post(f"/jobs/{job['id']}/complete", body)
            expect(status, raw, 200)
            if i >= WARMUP_SAMPLES:
                times.append((t1 - t0) * 1000)
    finally:
        for c in [worker, *producers]:
            await c.close()
    return summarize(times)


async def latency_httpx(port: int, samples: int, idle: float, headers: dict[str, str]) -> dict[str, float]:
    """The same measurement with httpx.AsyncClient on both sides, as a user's Python service would have it."""
    import httpx

    base = f"http://{HOST}:{port}"
    worker = httpx.AsyncClient(base_url=base, headers=headers, timeout=60)
    producers = [httpx.AsyncClient(base_url=base, headers=headers, timeout=60) for _ in range(4)]
    poll = {"worker": "lat", "wait_seconds": 30}
    times = []
    try:
        for i in range(samples + WARMUP_SAMPLES):
            pending = asyncio.create_task(worker.post("/queues/lat/claim", json=poll))
            await asyncio.sleep(idle)
            producer = producers[i % len(producers)]
            t0 = time.perf_counter()
            r = await producer.post("/queues/lat/jobs", json={"payload": PAYLOAD})
            expect(r.status_code, r.content, 201)
            claim = await pending
            t1 = time.perf_counter()
            expect(claim.status_code, claim.content, 200)
            jobs = claim.json()["jobs"]
            if len(jobs) != 1:
                raise PhaseError(f"the waiting claim answered {len(jobs)} jobs")
            r = await producer.post(f"/jobs/{jobs[0]['id']}/complete", json={"claim_token": jobs[0]["claim_token"]})
            expect(r.status_code, r.content, 200)
            if i >= WARMUP_SAMPLES:
                times.append((t1 - t0) * 1000)
    finally:
        for c in [worker, *producers]:
            await c.aclose()
    return summarize(times)


async def waiting_rss(service: Service, waiters: int) -> dict[str, Any]:
    """RSS of every process with `waiters` long-polls parked, then one batch enqueue that must serve them all."""
    conns = [await Connection(HOST, service.port).open() for _ in range(waiters)]
    poll = orjson.dumps({"worker": "idle", "wait_seconds": 30})
    pending = [asyncio.create_task(c.post("/queues/rss/claim", poll)) for c in conns]
    await asyncio.sleep(3)
    per_process = {pid: rss_mib(pid) for pid in service.pids()}
    feeder = await Connection(HOST, service.port).open()
    body = orjson.dumps({"jobs": [{"payload": i} for i in range(waiters)]})
    status, raw = await feeder.post("/queues/rss/jobs/batch", body)
    expect(status, raw, 201)
    answers = await asyncio.gather(*pending)
    for status, raw in answers:
        expect(status, raw, 200)
    served = sum(len(orjson.loads(b)["jobs"]) for _, b in answers)
    for c in [*conns, feeder]:
        await c.close()
    supervisor = service.pids()[0]
    workers = [v for pid, v in per_process.items() if pid != supervisor] or list(per_process.values())
    return {
        "waiters": waiters,
        "served_after_enqueue": served,
        "rss_mib_per_worker_process": [round(v, 1) for v in workers],
        "rss_mib_max_process": round(max(workers), 1),
        "rss_mib_supervisor": round(per_process[supervisor], 1),
    }
