"""jobq benchmark: the service beside the physical limit of this machine and beside PgQueuer, in one run.

  1. the reference: ../shared/limit/run.sh (the article's SQL driven by pgbench, a C client, 8 clients);
  2. jobq (`jobq serve --workers 2`) through HTTP with a lean client:
     enqueue   single-job requests (each --clients count); batches of 1,000 from 1 and from 4 clients;
     drain     claim 1 + complete; claim 1 handing the result in on the next claim; claim 10 + batch
               complete; claim 10 with completes on the next claim; claim 100 + batch complete. Each on a
               fresh database, twice: right after a bulk load with statistics taken while the table was
               empty and autovacuum off for it (as a user has it), then loaded again after ANALYZE;
     latency   enqueue to a waiting claim, with the lean client and with httpx;
     memory    RSS with --waiters parked long-polls (every phase's line also prints its processes' RSS);
     sqs       the SQS API beside jobq's own on one queue: SendMessageBatch of 10 against a batch enqueue of
               10, ReceiveMessage 10 + DeleteMessageBatch against claim 10 + batch complete (bench/sqs_phases.py);
     parked    single-job enqueue and idle transactions/s with none, --waiters on one queue and --waiters
               on as many queues parked, the enqueue load in 3 rounds (or --rounds), the layouts' order
               turned each round, each ratio the median of its rounds' (bench/parked.py);
     minimal   single enqueue, batch enqueue and claim 1 + complete with and without `Prefer:
               return=minimal`, alternated, --rounds times each (bench/minimal.py);
     sdk       the Python SDK's Worker (--sdk-concurrency) draining a queue, beside the raw-HTTP claim 10 +
               batch complete drain, alternated --rounds times (bench/sdk_drain.py);
     flowing   8 producers enqueue single jobs while 32 workers long-poll the same queue, claiming one job at
               a time (the workers mostly waiting: the direct hand-off's case; bench/flowing.py);
     scaling   issue 22's scaling phase: GET /queues/{queue}/stats and GET /queues at each backlog of
               --scaling-steps (100k, 1M, 3M) over 1 and over 1,000 queues, fresh and vacuumed, and claim 10 on a
               queue alone against among 1,000 in a heap of the largest backlog (bench/ops.py backlog, heap);
  3. PgQueuer 1.6.0 at its best setting (bench/peers/pgqueuer_peer.py) on its own fresh database:
     single-job enqueue, bulk enqueue (1 and 4 clients), drain, wake latency;
  4. a table per topic: jobq, raw SQL, PgQueuer, both ratios, the target (issue 22, else 9), whether it was met.

Every phase prints the CPU split (cores) and the API processes' CPU per job. A phase that misbehaves (a
non-2xx answer, a refused complete, a queue running dry) stops the run with an error.

usage: python bench/run.py [--clients 16,64] [--seconds 10] [--only PHASES] [--skip-peer] [--skip-limit]
                           [--preload N] [--json FILE]
The admin URL names a server where the benchmark may create and drop the databases jobq_bench,
jobq_bench_drain, jobq_limit and jobq_peer (default: postgresql://postgres@127.0.0.1:5432/postgres).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import sqs_phases
from bench.flowing import run as flowing_run
from bench.harness import (
    CpuSplit,
    Service,
    Worker,
    create_key,
    fresh_database,
    load_analyzed,
    load_unanalyzed,
    preload,
    restore_autovacuum,
    rss_mib,
    run_limit,
    timed,
)
from bench.loadgen import Connection
from bench.minimal import minimal_ab
from bench.parked import WAIT_SECONDS as PARKED_WAIT_SECONDS
from bench.parked import parked_scaling
from bench.phases import ClaimComplete, Enqueue, handin_supported, latency_httpx, latency_lean, waiting_rss
from bench.report import Row, as_json, at_least, at_most, at_most_peer, below_peer, render
from bench.sdk_drain import sdk_vs_raw

ROOT = Path(__file__).resolve().parent.parent
PHASES = (
    "enqueue",
    "batch",
    "claim1",
    "claim1next",
    "claim10",
    "claim10next",
    "claim100",
    "latency",
    "rss",
    "sqs",
    "parked",
    "minimal",
    "sdk",
    "flowing",
    "scaling",
)
SDK_PRELOAD = 300_000
BENCH_MAX_PENDING = 100_000_000
# phase: (label, claim limit, completes handed in on the next claim, default preload = the reference's)
DRAIN: dict[str, tuple[str, int, bool, int]] = {
    "claim1": ("claim 1 + complete (2 requests a job)", 1, False, 400_000),
    "claim1next": ("claim 1, complete on the next claim (1 request a job)", 1, True, 400_000),
    "claim10": ("claim 10 + batch complete", 10, False, 1_000_000),
    "claim10next": ("claim 10, completes on the next claim", 10, True, 1_000_000),
    "claim100": ("claim 100 + batch complete", 100, False, 1_000_000),
}
PEER_DRAIN_PRELOAD = 400_000
SQS_PRELOAD_PER_SECOND = 40_000  # above the fastest drain seen here (about 20k jobs/s): a phase never runs dry
BATCH = 1000
NOT_AVAILABLE = "not available on this server"
IDLE_SETTLE_SECONDS = 2


def _mib(values: list[float]) -> str:
    return "/".join(f"{v:.1f}" for v in values) + " MiB"


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.clients = [int(c) for c in args.clients.split(",")]
        self.phases = set((args.only or ",".join(PHASES)).split(","))
        unknown = self.phases - set(PHASES)
        if unknown:
            raise SystemExit(f"unknown phases {sorted(unknown)}; known: {','.join(PHASES)}")
        self.results: dict[str, Any] = {"machine": {"cpus": os.cpu_count()}, "args": vars(args), "jobq": {}}
        self.headers: dict[str, str] = {}
        self.handin: bool | None = None

    def service(self, url: str) -> Service:
        env = {"JOBQ_AUTH": "on"} if self.args.auth else {}
        # The batch phase at four connections writes over a million jobs into its one queue within its seconds on
        # a fast machine (2026-12-07: 90,000 a second), past the default cap of jobs not yet started a queue may
        # hold (JOBQ_MAX_PENDING_JOBS, a back-pressure setting): every enqueue still checks a cap, a higher one.
        env["JOBQ_MAX_PENDING_JOBS"] = str(BENCH_MAX_PENDING)
        if "parked" in self.phases:
            env["JOBQ_WAIT_MAX_SECONDS"] = str(PARKED_WAIT_SECONDS)  # its claims wait longer than it lasts
        service = Service(url, self.args.workers, self.args.port, env, Path(self.args.service_log))
        service.start()
        if "rss_idle_mib" not in self.results["jobq"]:
            # Once a run, on the first service: what start-up leaves (imports, the app, the pool), the
            # figure an import's cost shows in without the noise of a phase's peak.
            time.sleep(IDLE_SETTLE_SECONDS)
            idle = self.results["jobq"]["rss_idle_mib"] = [round(rss_mib(p), 1) for p in service.api_pids()]
            print(f"jobq idle after start-up: RSS {_mib(idle)} per API process", flush=True)
        if self.args.auth:
            key = create_key(url)
            Connection.extra_headers = f"Authorization: Bearer {key}\r\n".encode()
            self.headers = {"Authorization": f"Bearer {key}"}
        return service

    def measure(self, service: Service, clients: int, worker: Worker, label: str) -> dict[str, Any]:
        cpu = CpuSplit(service.api_pids())
        rate = asyncio.run(timed(clients, self.args.seconds, self.args.warmup, worker, cpu))
        out = {"rate": rate, "cpu_cores": cpu.split, "api_us_per_job": cpu.us_per_job(rate)}
        out["rss_mib"] = [round(rss_mib(p), 1) for p in service.api_pids()]
        conns = f"{clients} connection{'s' if clients > 1 else ''}"
        print(
            f"{label}, {conns}: {rate:,.0f} jobs/s; API CPU {out['api_us_per_job']:.0f} µs/job; {cpu}; "
            f"RSS {_mib(out['rss_mib'])} per API process",
            flush=True,
        )
        return out

    # --- jobq ----------------------------------------------------------------------------------------------

    def enqueue_and_latency(self) -> None:
        if not self.phases & {"enqueue", "batch", "latency", "rss", "parked"}:
            return
        url = fresh_database(self.args.admin_url, "jobq_bench")
        service = self.service(url)
        jobq = self.results["jobq"]
        try:
            if "enqueue" in self.phases:
                for n in self.clients:
                    preload(url, 0)
                    jobq.setdefault("enqueue", {})[n] = self.measure(
                        service, n, Enqueue(self.args.port, 1), "enqueue, single-job requests"
                    )
            if "batch" in self.phases:
                for n in (1, 4):
                    preload(url, 0)
                    jobq[f"batch{BATCH}_{n}"] = self.measure(
                        service, n, Enqueue(self.args.port, BATCH), f"enqueue, batches of {BATCH:,}"
                    )
            if "latency" in self.phases:
                idle = self.args.idle_ms / 1000
                jobq["latency_lean"] = asyncio.run(latency_lean(self.args.port, self.args.latency_samples, idle))
                print(f"enqueue-to-claim latency, lean client: {jobq['latency_lean']}", flush=True)
                jobq["latency_httpx"] = asyncio.run(
                    latency_httpx(self.args.port, self.args.latency_samples, idle, self.headers)
                )
                print(f"enqueue-to-claim latency, httpx: {jobq['latency_httpx']}", flush=True)
            if "rss" in self.phases:
                jobq["rss"] = asyncio.run(waiting_rss(service, self.args.waiters))
                r = jobq["rss"]
                print(
                    f"RSS with {r['waiters']:,} waiting long-polls: {_mib(r['rss_mib_per_worker_process'])} per API "
                    f"process (supervisor {r['rss_mib_supervisor']:.1f} MiB); one batch enqueue served "
                    f"{r['served_after_enqueue']:,} of them",
                    flush=True,
                )
            if "parked" in self.phases:
                jobq["parked"] = asyncio.run(self.parked(url, service))
        finally:
            service.stop()

    async def parked(self, url: str, service: Service) -> dict[str, Any]:
        n = max(self.clients)

        def load(label: str) -> dict[str, Any]:
            preload(url, 0)
            return self.measure(service, n, Enqueue(self.args.port, 1), f"parked scaling, {label}: enqueue, single-job")

        return await parked_scaling(
            url, service, self.args.waiters, load, max(5.0, self.args.seconds), rounds=max(3, self.args.rounds)
        )

    def minimal(self) -> None:
        if "minimal" not in self.phases:
            return
        url = fresh_database(self.args.admin_url, "jobq_bench_minimal")
        service = self.service(url)
        # claim 1 + complete drains a few thousand jobs a second: enough for the warmup and the phase.
        rows = self.args.preload or max(50_000, int(6_000 * (self.args.seconds + self.args.warmup)))
        try:
            self.results["jobq"]["minimal"] = minimal_ab(
                url,
                self.args.port,
                max(self.clients),
                self.args.rounds,
                rows,
                lambda n, worker, label: self.measure(service, n, worker, label),
            )
        finally:
            service.stop()

    def scaling(self) -> None:
        """How the cost grows with the backlog and the number of queues (issue 22, item 5); each part on fresh
        databases of its own (bench/ops.py)."""
        if "scaling" not in self.phases:
            return
        from bench import ops

        steps = [int(x) for x in self.args.scaling_steps.split(",")]
        port, seconds = self.args.port, max(2, round(self.args.seconds))
        self.results["jobq"]["scaling"] = {
            "backlog": ops.part_backlog(self.args.admin_url, port, steps, [1, 1000]),
            # `bench` holds a tenth of the heap among 1,000 queues: enough for 30,000 claims a second of the run.
            "heap": ops.part_heap(
                self.args.admin_url, port, max(*steps, 300_000 * (seconds + 2)), max(self.clients), seconds
            ),
        }

    def flowing(self) -> None:
        if "flowing" not in self.phases:
            return
        url = fresh_database(self.args.admin_url, "jobq_bench_flowing")
        service = self.service(url)
        try:
            out = asyncio.run(
                flowing_run(self.args.port, 8, 32, self.args.seconds, self.args.warmup, service.api_pids())
            )
            print(
                f"jobs flowing, 8 producers and 32 waiting workers: {out['enqueued_per_second']:,} enqueued/s, "
                f"{out['claimed_per_second']:,} claimed/s, enqueue answer to claim p50 {out['wait_p50_ms']} ms, "
                f"p99 {out['wait_p99_ms']} ms; {out['cpu']}",
                flush=True,
            )
            self.results["jobq"]["flowing"] = out
        finally:
            service.stop()

    def sdk(self) -> None:
        if "sdk" not in self.phases:
            return
        url = fresh_database(self.args.admin_url, "jobq_bench_sdk")
        service = self.service(url)
        try:
            self.results["jobq"]["sdk"] = sdk_vs_raw(
                service,
                url,
                self.args.port,
                self.headers,
                max(self.clients),
                self.args.sdk_concurrency,
                self.args.preload or SDK_PRELOAD,
                self.args.seconds,
                self.args.warmup,
                self.args.rounds,
                lambda n, worker, label: self.measure(service, n, worker, label),
            )
        finally:
            service.stop()

    def drains(self) -> None:
        for key in [k for k in DRAIN if k in self.phases]:
            label, limit, handin, default_rows = DRAIN[key]
            rows = self.args.preload or default_rows
            for n in self.clients:
                url = fresh_database(self.args.admin_url, "jobq_bench_drain")
                service = self.service(url)
                try:
                    if handin and self.handin is None:
                        self.handin = asyncio.run(handin_supported(self.args.port))
                    if handin and not self.handin:
                        print(f"{label}: {NOT_AVAILABLE} (it refuses `complete` on a claim)", flush=True)
                        self.results["jobq"][key] = NOT_AVAILABLE
                        break
                    worker = ClaimComplete(self.args.port, limit, handin)
                    reloptions = load_unanalyzed(url, rows)
                    try:
                        a = self.measure(service, n, worker, f"{label}, {rows:,} jobs, un-analyzed")
                    finally:
                        restore_autovacuum(url, reloptions)
                    load_analyzed(url, rows)
                    worker = ClaimComplete(self.args.port, limit, handin)
                    b = self.measure(service, n, worker, f"{label}, {rows:,} jobs, after ANALYZE")
                    print(f"{label}, {n} connections: un-analyzed / analyzed = {a['rate'] / b['rate']:.2f}")
                    self.results["jobq"].setdefault(key, {})[n] = {"jobs": rows, "unanalyzed": a, "analyzed": b}
                finally:
                    service.stop()

    def sqs(self) -> None:
        """The SQS API and jobq's own, alternately on one service and queue, each from the same start."""
        if "sqs" not in self.phases:
            return
        url = fresh_database(self.args.admin_url, "jobq_bench_sqs")
        service = self.service(url)
        rows = self.args.preload or int(SQS_PRELOAD_PER_SECOND * (self.args.seconds + self.args.warmup))
        out = self.results["jobq"].setdefault("sqs", {})
        try:
            asyncio.run(sqs_phases.create_queue(self.args.port))
            port = self.args.port
            phases: dict[str, tuple[int, Callable[[], Worker], str]] = {
                "enqueue10": (0, lambda: Enqueue(port, 10), "enqueue, batches of 10"),
                "send10": (0, lambda: sqs_phases.SendBatch(port), "SQS SendMessageBatch 10"),
                "claim10": (rows, lambda: ClaimComplete(port, 10), f"claim 10 + batch complete, {rows:,} jobs"),
                "drain10": (
                    rows,
                    lambda: sqs_phases.Drain(port),
                    f"SQS ReceiveMessage 10 + DeleteMessageBatch, {rows:,}",
                ),
            }
            for n in self.clients:
                m = out.setdefault(n, {})
                # Each pair twice, alternately, keeping each one's better run: on a shared machine a burst of
                # other work during one phase says nothing about the two APIs.
                for _ in range(2):
                    for key, (jobs, make, label) in phases.items():
                        preload(url, jobs)
                        got = self.measure(service, n, make(), label)
                        if key not in m or got["rate"] > m[key]["rate"]:
                            m[key] = got
                for a, b in (("send10", "enqueue10"), ("drain10", "claim10")):
                    print(f"{a} / {b}, {n} connections: {m[a]['rate'] / m[b]['rate']:.2f}", flush=True)
        finally:
            service.stop()

    # --- PgQueuer ------------------------------------------------------------------------------------------

    def peer(self) -> None:
        if self.args.skip_peer:
            return
        from bench.peers import pgqueuer_peer as pgq

        out: dict[str, Any] = {"version": pgq.VERSION, "processes": self.args.peer_processes}
        self.results["pgqueuer"] = out
        a, w, s, procs = self.args.admin_url, self.args.warmup, self.args.seconds, self.args.peer_processes
        if "enqueue" in self.phases:
            n = max(self.clients)
            out["enqueue"] = pgq.enqueue(a, n, 1, w, s, procs)
            print(f"PgQueuer enqueue, one job a call, {n} enqueuers: {self._peer_line(out['enqueue'])}", flush=True)
        if "batch" in self.phases:
            for n in (1, 4):
                m = out[f"bulk{BATCH}_{n}"] = pgq.enqueue(a, n, BATCH, w, s, procs)
                who = f"{n} client{'s' if n > 1 else ''}"
                print(f"PgQueuer bulk enqueue, {BATCH:,} a call, {who}: {self._peer_line(m)}", flush=True)
        if self.phases & set(DRAIN):
            rows = self.args.preload or PEER_DRAIN_PRELOAD
            out["drain"] = pgq.drain(a, rows, w, s, procs)
            for table in ("unanalyzed", "analyzed"):
                print(
                    f"PgQueuer drain, batch {pgq.BATCH_SIZE}, {procs} processes, {rows:,} jobs, "
                    f"{table.replace('un', 'un-')}: "
                    f"{self._peer_line(out['drain'][table])}",
                    flush=True,
                )
        if "latency" in self.phases:
            out["latency"] = pgq.latency(a, self.args.latency_samples, self.args.idle_ms / 1000)
            print(f"PgQueuer enqueue-to-handler latency: {out['latency']}", flush=True)

    @staticmethod
    def _peer_line(m: dict[str, Any]) -> str:
        rate = f"{m['rate']:,.0f} jobs/s; PgQueuer CPU {m['cpu_us_per_job']:.0f} µs/job"
        return f"{rate}; {m['cpu']}; RSS {_mib(m['rss_mib'])} per process"

    # --- the report ----------------------------------------------------------------------------------------

    def tables(self) -> dict[str, list[Row]]:
        ref = self.results.get("reference", {})
        jobq, peer = self.results["jobq"], self.results.get("pgqueuer", {})
        top = max(self.clients)

        def rate(m: Any) -> float | None:
            return m["rate"] if isinstance(m, dict) else None

        enqueue: list[Row] = []
        for n, m in jobq.get("enqueue", {}).items():
            p = rate(peer.get("enqueue")) if n == top else None
            row = Row("enqueue, single-job requests", str(n), m["rate"], ref.get("enqueue"), p)
            row.api_us = m["api_us_per_job"]
            enqueue.append(row.judge(">= 0.8x raw", at_least(0.8, "raw")) if n == top else row)
            if n == top and p is not None:
                lead = Row("enqueue, single-job requests, against PgQueuer", str(n), m["rate"], peer=p)
                enqueue.append(lead.judge(">= 1.0x PgQueuer (keep the lead)", at_least(1.0, "peer")))
            if n == top:
                cpu = Row("API CPU per single-job enqueue", str(n), m["api_us_per_job"], unit="µs")
                enqueue.append(cpu.judge("<= 60 µs", at_most(60)))
        for n, goal in ((1, 1.0), (4, 1.0)):  # issue 22: at least PgQueuer's bulk at equal concurrency
            if m := jobq.get(f"batch{BATCH}_{n}"):
                row = Row(
                    f"enqueue, batches of {BATCH:,}",
                    str(n),
                    m["rate"],
                    ref.get("enqueue"),
                    rate(peer.get(f"bulk{BATCH}_{n}")),
                    api_us=m["api_us_per_job"],
                )
                enqueue.append(row.judge(f">= {goal}x PgQueuer bulk", at_least(goal, "peer")))

        drain: list[Row] = []
        for key, (label, limit, handin, _) in DRAIN.items():
            got = jobq.get(key)
            if got == NOT_AVAILABLE:
                drain.append(Row(label, "-", None, note=NOT_AVAILABLE))
                continue
            raw = ref.get("claim_complete_1" if limit == 1 else "claim_complete_10" if limit == 10 else "")
            for n, m in (got or {}).items():
                for table in ("unanalyzed", "analyzed"):
                    t, state = m[table], table.replace("un", "un-")
                    p = rate(peer.get("drain", {}).get(table))
                    row = Row(f"{label}, {state}", str(n), t["rate"], raw, p, api_us=t["api_us_per_job"])
                    if n == top and limit == 1 and not handin:
                        row.judge(">= 1.0x raw", at_least(1.0, "raw"))  # issue 22's claim 1 + complete
                    elif n == top and (handin or limit == 10):
                        row.judge(">= 0.8x raw", at_least(0.8, "raw"))
                    elif n == top and limit == 100:
                        row.judge(">= 1.5x PgQueuer drain", at_least(1.5, "peer"))
                    drain.append(row)
                    if n == top and limit == 100:
                        cpu = Row(f"API CPU per job, limit 100, {state}", str(n), t["api_us_per_job"], unit="µs")
                        drain.append(cpu.judge("<= 40 µs", at_most(40)))
                ratio = Row(
                    f"{label}: un-analyzed / analyzed",
                    str(n),
                    m["unanalyzed"]["rate"] / m["analyzed"]["rate"],
                    unit="x",
                )
                drain.append(ratio.judge(">= 0.9", at_least(0.9, "jobq")))
        if d := peer.get("drain"):
            ratio = Row("PgQueuer drain: un-analyzed / analyzed", "-", None, unit="x")
            ratio.peer = d["unanalyzed"]["rate"] / d["analyzed"]["rate"]
            drain.append(ratio)

        latency: list[Row] = []
        lean, hx, pl = jobq.get("latency_lean"), jobq.get("latency_httpx"), peer.get("latency")
        ceilings: tuple[tuple[str, float | None], ...] = (("p50", 3.0), ("p99", 10.0), ("max", None))
        for stat, ceiling in ceilings:
            if lean:
                row = Row(f"enqueue to waiting claim, lean client, {stat}", "1", lean[f"{stat}_ms"], unit="ms")
                latency.append(row.judge(f"<= {ceiling:g} ms", at_most(ceiling)) if ceiling else row)
        for stat in ("p50", "p99", "max"):
            if hx or pl:
                figure = f"enqueue to waiting claim, httpx (PgQueuer: to handler start), {stat}"
                row = Row(figure, "1", hx[f"{stat}_ms"] if hx else None, unit="ms")
                row.peer = pl[f"{stat}_ms"] if pl else None
                latency.append(row.judge("below PgQueuer", below_peer) if stat != "max" else row)

        memory: list[Row] = []
        if idle := jobq.get("rss_idle_mib"):
            memory.append(Row("RSS per API process, idle after start-up", "0", max(idle), unit="MiB"))
        if rss := jobq.get("rss"):
            row = Row(
                f"RSS per API process, {rss['waiters']:,} waiting long-polls",
                str(rss["waiters"]),
                rss["rss_mib_max_process"],
                unit="MiB",
            )
            memory.append(row.judge("<= 150 MiB", at_most(150)))
        drained = jobq.get("claim100")
        if isinstance(drained, dict) or peer.get("drain"):
            j = max(drained[top]["analyzed"]["rss_mib"]) if isinstance(drained, dict) and top in drained else None
            p = max(peer["drain"]["analyzed"]["rss_mib"]) if peer.get("drain") else None
            row = Row(
                "RSS per process at the end of a drain (jobq limit 100, PgQueuer batch 200)",
                str(top),
                j,
                peer=p,
                unit="MiB",
            )
            memory.append(row.judge("<= PgQueuer", at_most_peer))
        sqs: list[Row] = []
        for n, m in jobq.get("sqs", {}).items():
            for a, b, label in (
                ("send10", "enqueue10", "SendMessageBatch 10 / jobq batch enqueue of 10"),
                ("drain10", "claim10", "ReceiveMessage 10 + DeleteMessageBatch / jobq claim 10 + batch complete"),
            ):
                sqs.append(Row(f"SQS: {label.split(' / ')[0]}", str(n), m[a]["rate"], api_us=m[a]["api_us_per_job"]))
                sqs.append(Row(f"jobq: {label.split(' / ')[1]}", str(n), m[b]["rate"], api_us=m[b]["api_us_per_job"]))
                ratio = Row(label, str(n), m[a]["rate"] / m[b]["rate"], unit="x")
                sqs.append(ratio.judge(">= 0.8", at_least(0.8, "jobq")) if n == top else ratio)
        if s := jobq.get("sdk"):
            concurrency = str(s["sdk"]["concurrency"])
            sdk_row = Row("SDK drain: Python Worker", concurrency, s["sdk"]["rate"], api_us=s["sdk"]["api_us_per_job"])
            drain.append(sdk_row)
            raw_row = Row("raw-HTTP drain beside it: claim 10 + batch complete", str(top), s["raw"]["rate"])
            drain.append(raw_row)
            drain.append(Row("SDK drain / raw-HTTP drain", concurrency, s["ratio"], unit="x"))
        parked: list[Row] = []
        if p := jobq.get("parked"):
            for key in ("none", "one_queue", "many_queues"):
                m = p[key]
                parked.append(Row(f"enqueue, single-job, {m['label']}", str(top), m["enqueue"]["rate"]))
            for key in ("one_queue", "many_queues"):
                ratio = Row(f"enqueue {p[key]['label']} / none parked", str(top), p[key]["enqueue_vs_none"], unit="x")
                parked.append(ratio.judge(">= 0.9", at_least(0.9, "jobq")))
            for key in ("none", "one_queue", "many_queues"):
                m = p[key]
                tps = m["idle"]["transactions_per_second"]
                parked.append(Row(f"idle transactions/s, {m['label']}", "0", tps, unit="tx/s"))
        scaling: list[Row] = []
        if sc := jobq.get("scaling"):
            for key, m in sc["backlog"].items():
                queues, total, state = key.split("/")
                where = f"{int(queues[:-1]):,} queue(s), {int(total):,} pending, {state}"
                for figure, label in (("stats", "GET /queues/q0/stats"), ("queues", "GET /queues")):
                    row = Row(f"{label} p50, {where}", "1", m[figure]["p50_ms"], unit="ms")
                    scaling.append(row.judge("< 10 ms", at_most(10)))
            for key, ratio in sc["heap"].items():
                if key.startswith("alone_vs_"):
                    other, _, state = key.removeprefix("alone_vs_").rpartition(", ")
                    row = Row(f"claim 10, a queue alone / {other}, {state}", str(top), ratio, unit="x")
                    scaling.append(row.judge("<= 1.5x", at_most(1.5)))
        return {
            "Enqueue": enqueue,
            "Drain": drain,
            "Latency": latency,
            "Memory": memory,
            "SQS API": sqs,
            "Parked": parked,
            "Scaling": scaling,
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--workers", type=int, default=2, help="jobq serve --workers (default 2)")
    p.add_argument("--clients", default="16,64", help="concurrent HTTP connections, a list (default 16,64)")
    p.add_argument("--seconds", type=float, default=10, help="measured seconds per phase (default 10)")
    p.add_argument("--warmup", type=float, default=2, help="seconds of load before each measurement (default 2)")
    p.add_argument("--preload", type=int, help="jobs loaded before each drain phase (default 400k/1M; PgQueuer 400k)")
    p.add_argument(
        "--flow",
        help="drain phases: the bench queue's configuration, queue_state columns as JSON, "
        'e.g. \'{"concurrency": 1000, "fair": true}\' (flow control; default: none)',
    )
    p.add_argument("--groups", type=int, default=0, help="drain phases: spread the jobs over this many groups")
    p.add_argument("--latency-samples", type=int, default=1000)
    p.add_argument("--idle-ms", type=float, default=20, help="the consumer idles this long before each sample")
    p.add_argument("--waiters", type=int, default=1000)
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="minimal, sdk: A/B rounds per path (default 2); parked: rounds of its three layouts (at least 3)",
    )
    p.add_argument("--sdk-concurrency", type=int, default=64, help="sdk: the Python Worker's concurrency")
    p.add_argument(
        "--scaling-steps",
        default="100000,1000000,3000000",
        help="scaling: pending jobs at each step (the largest: the heap)",
    )
    p.add_argument("--port", type=int, default=8765)
    p.add_argument(
        "--service-log",
        default=str(Path(tempfile.gettempdir()) / "jobq-bench-service.log"),
        help="where jobq's stdout (its access log: every request, as a user runs it) is appended",
    )
    p.add_argument("--limit-script", default=str(ROOT.parent / "shared" / "limit" / "run.sh"))
    p.add_argument("--skip-limit", action="store_true", help="do not run the pgbench reference")
    p.add_argument("--skip-peer", action="store_true", help="do not run PgQueuer")
    p.add_argument("--peer-processes", type=int, default=2, help="PgQueuer processes (default 2)")
    p.add_argument("--only", help=f"comma-separated phases: {','.join(PHASES)}")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--auth", action="store_true", help="JOBQ_AUTH=on, every request with an API key")
    args = p.parse_args()
    if args.flow or args.groups:
        from bench import harness

        harness.FLOW.update(json.loads(args.flow or "{}"))
        harness.GROUPS = args.groups

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    bench = Bench(args)
    if not args.skip_limit:
        seconds = max(1, round(args.seconds))
        print(f"== reference: the article's SQL through pgbench (8 clients, {seconds} s per phase)", flush=True)
        ref = run_limit(Path(args.limit_script), args.admin_url, 8, seconds)
        print(ref.pop("raw"), flush=True)
        bench.results["reference"] = ref
    print(f"== jobq (its access log goes to {args.service_log})", flush=True)
    bench.enqueue_and_latency()
    bench.drains()
    bench.sqs()
    bench.minimal()
    bench.sdk()
    bench.flowing()
    bench.scaling()
    if not args.skip_peer:
        print("== PgQueuer", flush=True)
    bench.peer()

    tables = bench.tables()
    for topic, rows in tables.items():
        if rows:
            print(render(topic, rows))
    if max(bench.clients) != 64:
        print(f"\n(The targets are set for 64 connections; this run judged them at {max(bench.clients)}.)")
    bench.results["report"] = as_json(tables)
    if args.json:
        Path(args.json).write_text(json.dumps(bench.results, indent=2, default=str))


if __name__ == "__main__":
    main()
