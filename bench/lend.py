"""What lending a pooled connection costs (app/db/pool.py `Database._lend`): 20,000 lends and returns on an idle
pool of 2, then by 16 tasks sharing that pool of 2 (nearly every lend waits in the pool's queue).

usage: PYTHONPATH=<tree> .venv/bin/python bench/lend.py [--url URL] [--n 20000]
A tree before `_lend` existed is measured through the pool's own getconn.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from app.db.pool import Database
from app.settings import Settings


async def measure(url: str, n: int) -> tuple[float, float]:
    settings = Settings(database_url=url, pool_min_size=2, pool_max_size=2, pool_timeout_seconds=5)
    db = Database(settings, url)
    await db.open(10)

    async def lend() -> Any:
        return await (db._lend(None) if hasattr(db, "_lend") else db.pool.getconn(None))

    try:
        t0 = time.perf_counter()
        for _ in range(n):
            await db.pool.putconn(await lend())
        idle = (time.perf_counter() - t0) / n * 1e6

        async def worker(k: int) -> None:
            for _ in range(k):
                conn = await lend()
                await asyncio.sleep(0)
                await db.pool.putconn(conn)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(n // 16) for _ in range(16)))
        busy = (time.perf_counter() - t0) / n * 1e6
    finally:
        await db.close()
    return idle, busy


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--n", type=int, default=20_000)
    args = p.parse_args()
    idle, busy = asyncio.run(measure(args.url, args.n))
    print(f"lend + return: idle pool {idle:.1f} us; busy pool (16 tasks, 2 connections) {busy:.1f} us")


if __name__ == "__main__":
    main()
