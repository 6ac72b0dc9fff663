"""What the enqueue's quota check costs in CPU (issue 21): EnqueueQuotas.admit() and written() for a queue far
from its limit, called in a loop, beside an empty coroutine and function call. No database, no HTTP.

usage: python bench/admit.py [--calls N] [--rounds N]"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from app.core.quotas import EnqueueQuotas, _Backlog
from app.settings import Settings


async def measure(calls: int, rounds: int) -> None:
    quotas = EnqueueQuotas(Settings.defaults(database_url="postgresql://unused"), db=None)  # type: ignore[arg-type]
    far = time.monotonic() + 3600
    quotas._known["bench"] = far
    backlog = quotas._backlogs["bench"] = _Backlog(
        count=100_000, at=time.monotonic(), counted=True, cap=1_000_001, due=far, fast_until=far
    )

    async def nothing(queue: str, jobs: int, limit: int) -> None:
        return None

    def nothing_either(queue: str, jobs: int, ok: bool) -> None:
        return None

    for n in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            await quotas.admit("bench", 1, 1_000_000)
            quotas.written("bench", 1, True)
        checked = time.perf_counter() - started
        backlog.added = 0
        started = time.perf_counter()
        for _ in range(calls):
            await nothing("bench", 1, 1_000_000)
            nothing_either("bench", 1, True)
        empty = time.perf_counter() - started
        print(
            f"round {n + 1}: admit + written {checked / calls * 1e6:.2f} µs, empty calls {empty / calls * 1e6:.2f} µs"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=200_000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    asyncio.run(measure(args.calls, args.rounds))


if __name__ == "__main__":
    main()
