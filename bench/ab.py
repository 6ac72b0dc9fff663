"""An A/B of two source trees of jobq that this machine's drift cannot fake: both services run side by side (`jobq
serve --workers 1` each, or --workers N, from its own tree through PYTHONPATH, on its own fresh database), and one
path's load goes to each in short bursts, alternated, the order reversed every round. Each burst reports the rate
and the serving processes' CPU a job (from /proc, over the burst's measured seconds); the medians and ranges of the
rounds are printed per tree, then each further tree's ratio to the first, round by round (both bursts of a round
run within seconds of each other, so their ratio cancels most of the machine's drift, which the ranges carry: rates
on this machine drift by a third within minutes).

    .venv/bin/python bench/ab.py --trees /tmp/base,. [--phase enqueue|batch|batchmin|claim10|claim100|claim10next
                                 |claim1] [--clients 64] [--rounds 8] [--seconds 2] [--preload N] [--workers 1]

A tree is a checkout (`git worktree add /tmp/base <commit>`); both run this virtualenv's packages. `enqueue`: single
jobs; `batch`: batches of 1,000 (`batchmin`: with `Prefer: return=minimal`); `claim*`: drains of a queue preloaded
before each burst (claim 10 + batch complete, claim 100 + batch complete, claim 10 with the completes on the next
claim, claim 1 + complete).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.harness import HOST, Service, fresh_database, preload
from bench.loadgen import Connection
from bench.phases import ClaimComplete, Enqueue

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
PHASES = ("enqueue", "batch", "batchmin", "claim10", "claim100", "claim10next", "claim1")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((HOST, port)) != 0


def start(tree: Path, port: int, database: str, workers: int = 1) -> Service:
    """`jobq serve --workers N` from `tree` (bench/harness.py Service, its access log dropped)."""
    if not port_free(port):  # a leftover service would answer /readyz and be measured in this tree's place
        raise SystemExit(f"port {port} is in use: stop what listens there first")
    url = fresh_database(ADMIN, database)
    service = Service(url, workers, port, extra_env={"PYTHONPATH": str(tree)}, log=Path(os.devnull))
    try:
        return service.start()
    except BaseException:
        service.stop()
        raise


async def burst(phase: str, port: int, pids: list[int], clients: int, seconds: float) -> tuple[float, float]:
    load = {
        "enqueue": lambda: Enqueue(port, 1),
        "batch": lambda: Enqueue(port, 1000),
        "batchmin": lambda: Enqueue(port, 1000, minimal=True),
        "claim10": lambda: ClaimComplete(port, 10),
        "claim100": lambda: ClaimComplete(port, 100),
        "claim10next": lambda: ClaimComplete(port, 10, handin=True),
        "claim1": lambda: ClaimComplete(port, 1),
    }[phase]()
    counter = [0]
    conns = [await Connection(HOST, port).open() for _ in range(clients)]

    async def drive(conn: Connection, until: float) -> None:
        while time.monotonic() < until:
            await load(conn, counter)

    await asyncio.gather(*(drive(c, time.monotonic() + 0.5) for c in conns))  # warm-up
    counter[0] = 0
    cpu0, t0 = sum(map(cpu_seconds, pids)), time.monotonic()
    await asyncio.gather(*(drive(c, t0 + seconds) for c in conns))
    elapsed, cpu1 = time.monotonic() - t0, sum(map(cpu_seconds, pids))
    for c in conns:
        await c.close()
    if not counter[0]:
        raise RuntimeError("no job went through in the burst")
    return counter[0] / elapsed, (cpu1 - cpu0) / counter[0] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", required=True, help="two (or more) checkouts, comma-separated")
    parser.add_argument("--phase", choices=PHASES, default="enqueue")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2)
    parser.add_argument("--workers", type=int, default=1, help="API processes a service (`jobq serve --workers`)")
    parser.add_argument("--preload", type=int, default=0, help="claim phases: jobs before each burst (default: enough)")
    args = parser.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    # Enough for 64 connections draining claim 10 at 30,000 jobs/s through the warm-up and the burst.
    preload_n = args.preload or int(40_000 * (args.seconds + 1))
    services: list[Service] = []
    got: list[list[tuple[float, float]]] = [[] for _ in trees]
    try:
        for i, tree in enumerate(trees):
            services.append(start(tree, 8800 + i, f"jobq_ab{i}", args.workers))
        for r in range(args.rounds):
            order = list(range(len(trees)))
            for i in order if r % 2 == 0 else order[::-1]:
                service = services[i]
                if args.phase.startswith("claim"):
                    preload(service.database_url, preload_n)
                elif r % 3 == 2:
                    preload(service.database_url, 0)  # the queue kept small
                pids = service.api_pids()
                got[i].append(asyncio.run(burst(args.phase, service.port, pids, args.clients, args.seconds)))
        print(
            f"{args.phase}, --workers {args.workers}, {args.clients} connections, {args.rounds} rounds of "
            f"{args.seconds:g} s, alternated:"
        )
        for tree, runs in zip(trees, got, strict=True):
            rates, cpus = [x[0] for x in runs], [x[1] for x in runs]
            print(
                f"  {tree}: {statistics.median(rates):,.0f} jobs/s [{min(rates):,.0f}-{max(rates):,.0f}]; "
                f"API CPU {statistics.median(cpus):.1f} µs/job [{min(cpus):.1f}-{max(cpus):.1f}]"
            )
        # Each round's pair ran minutes apart at most: its ratio cancels the machine's drift that the ranges carry.
        for tree, runs in zip(trees[1:], got[1:], strict=True):
            cpu = [b[1] / a[1] for a, b in zip(got[0], runs, strict=True)]
            rate = [b[0] / a[0] for a, b in zip(got[0], runs, strict=True)]
            print(
                f"  {tree} / {trees[0]}, round by round: API CPU a job median {statistics.median(cpu):.2f} "
                f"[{min(cpu):.2f}-{max(cpu):.2f}], lower in {sum(c < 1 for c in cpu)} of {len(cpu)}; "
                f"rate median {statistics.median(rate):.2f} [{min(rate):.2f}-{max(rate):.2f}]"
            )
    finally:
        for service in services:
            service.stop()


if __name__ == "__main__":
    main()
