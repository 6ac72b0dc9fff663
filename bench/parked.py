"""The scaling phase of parked long-polls (issue 22): what claims waiting on queues nobody enqueues to cost,
on one queue and spread over as many queues as claims (one queue per tenant, each with a worker waiting).

Two figures for each of 0 parked, N parked on one queue and N parked on N queues: single-job enqueue
throughput on another queue (within 10% of the figure with none parked is the target), and, with no load
at all, the database's transactions per second (pg_stat_database.xact_commit of the bench database) and
where the CPU went. With the waiting costing per queue, the N-queue figures collapse and its idle
transactions grow with N; with it costing a constant, the three rows read alike."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import orjson
import psycopg

from bench.harness import HOST, CpuSplit, PhaseError, Service, expect
from bench.loadgen import Connection

# Longer than a layout lasts (about 35 s), so that no wait ends inside a measured window: with the default
# 30 s, every parked claim comes back at once half-way through the enqueue load and asks again, a burst of
# 1,000 requests that measures when the claims were sent, not what waiting costs. (A claim asking again
# costs one claim statement, per claim whatever the queues: at 30 s, 1,000 workers are 33 a second.)
WAIT_SECONDS = 120
POLL = orjson.dumps({"worker": "parked", "wait_seconds": WAIT_SECONDS})
SETTLE_SECONDS = 3.0  # after the claims are sent: parked, announced to the other process, looked at once
# A backend reports its transaction counts to pg_stat_database at most once a second, and one that went
# idle within a second of its last report only after 10 s (PostgreSQL 15's PGSTAT_IDLE_INTERVAL): the
# idle window opens that long after the last burst (the previous load, the claims' first statements), or
# the burst would be counted in it. In a steady state the lag at both ends of the window cancels out.
STATS_LAG_SECONDS = 10.5


class Parked:
    """`n` long-polls kept waiting on `queues` (spread round robin) until stop(); each asks again when its wait
    ends with nothing, as a worker does. Any answer but an empty 200 breaks the phase."""

    def __init__(self, port: int, n: int, queues: list[str]) -> None:
        self.port = port
        self.n = n
        self.queues = queues
        self.conns: list[Connection] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.stopping = False

    async def start(self) -> Parked:
        self.conns = [await Connection(HOST, self.port).open() for _ in range(self.n)]
        for i, conn in enumerate(self.conns):
            self.tasks.append(asyncio.create_task(self._wait(conn, self.queues[i % len(self.queues)])))
        await asyncio.sleep(SETTLE_SECONDS)
        self.check()
        return self

    async def _wait(self, conn: Connection, queue: str) -> None:
        while not self.stopping:
            status, raw = await conn.post(f"/queues/{queue}/claim", POLL)
            expect(status, raw, 200)
            if orjson.loads(raw)["jobs"]:
                raise PhaseError(f"a parked claim on {queue} received a job: nobody enqueues there")

    def check(self) -> None:
        for t in self.tasks:
            if t.done():
                t.result()  # raises what broke it
                raise PhaseError("a parked claim stopped waiting")

    async def stop(self) -> None:
        self.check()
        self.stopping = True
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for c in self.conns:
            await c.close()


def _commits(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


async def idle_transactions(url: str, service: Service, seconds: float) -> dict[str, Any]:
    """Transactions per second in the bench database with no load, and the CPU split, over `seconds`."""
    await asyncio.sleep(STATS_LAG_SECONDS)
    cpu = CpuSplit(service.api_pids())
    before = await asyncio.to_thread(_commits, url)
    cpu.start()
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    cpu.stop()
    elapsed = time.perf_counter() - t0
    await asyncio.sleep(1.2)  # the last second's counts reach pg_stat_database
    after = await asyncio.to_thread(_commits, url)
    return {"transactions_per_second": round((after - before) / elapsed, 1), "cpu_cores": cpu.split}


async def parked_scaling(
    url: str,
    service: Service,
    waiters: int,
    measure: Callable[[str], dict[str, Any]],
    idle_seconds: float,
    rounds: int = 3,
) -> dict[str, Any]:
    """The three layouts: none parked, `waiters` on one queue, `waiters` on as many queues. `measure` runs the
    single-job enqueue load (on queue `bench`, where nobody waits) and returns its figures.

    Each layout's idle figure is read once. The enqueue load runs in `rounds` rounds, each of the three layouts
    in turn, the order turned by one each round (so no layout is always the first or the last, after the same
    neighbour), the claims parked afresh for each: a layout's ratio is the median over the rounds of its rate
    over the rate with none parked in the same round. One pass in a fixed order read 0.69-1.14 for the same
    code in reruns (BENCHMARKS.md, stop 46), the machine's drift between two loads a minute apart."""
    layouts: list[tuple[str, str, int, list[str]]] = [
        ("none", "none parked", 0, []),
        ("one_queue", f"{waiters:,} parked on 1 queue", waiters, ["parked"]),
        ("many_queues", f"{waiters:,} parked on {waiters:,} queues", waiters, [f"tenant-{i}" for i in range(waiters)]),
    ]
    out: dict[str, Any] = {
        key: {"label": label, "parked": n, "queues": len(queues), "rounds": []} for key, label, n, queues in layouts
    }
    for r in range(rounds):
        turned = layouts[r % len(layouts) :] + layouts[: r % len(layouts)]
        for key, label, n, queues in turned:
            parked = await Parked(service.port, n, queues).start() if n else None
            try:
                if r == 0:
                    idle = await idle_transactions(url, service, idle_seconds)
                    out[key]["idle"] = idle
                    print(
                        f"parked scaling, {label}: idle {idle['transactions_per_second']:,.0f} transactions/s; "
                        + ", ".join(f"{k} {v:.2f}" for k, v in idle["cpu_cores"].items())
                        + " cores",
                        flush=True,
                    )
                load = await asyncio.to_thread(measure, f"{label}, round {r + 1} of {rounds}")
                if parked is not None:
                    parked.check()
            finally:
                if parked is not None:
                    await parked.stop()
            out[key]["rounds"].append(load)
    for key, *_ in layouts:
        # The layout's figures are those of its median round (by rate), its rate the median rate.
        ranked = sorted(out[key]["rounds"], key=lambda m: m["rate"])
        out[key]["enqueue"] = ranked[len(ranked) // 2]
    for key in ("one_queue", "many_queues"):
        ratios = sorted(
            m["rate"] / base["rate"] for m, base in zip(out[key]["rounds"], out["none"]["rounds"], strict=True)
        )
        out[key]["enqueue_vs_none_rounds"] = [round(x, 3) for x in ratios]
        out[key]["enqueue_vs_none"] = round(ratios[len(ratios) // 2], 3)
    print(
        f"parked scaling, single-job enqueue against none parked in the same round (median of {rounds}): "
        + ", ".join(
            f"{out[k]['label']} {out[k]['enqueue_vs_none']:.2f}x "
            f"({' '.join(f'{x:.2f}' for x in out[k]['enqueue_vs_none_rounds'])})"
            for k in ("one_queue", "many_queues")
        ),
        flush=True,
    )
    return out
