"""Group commit (app/core/coalesce.py), without a database: who shares a statement, and what a failure does."""

from __future__ import annotations

import asyncio

import pytest

from app.core.coalesce import Coalescer


class Recorder:
    """A stand-in for a statement: records each batch, answers each item with its double, and can be held
    open or made to fail."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_on: int | None = None

    async def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        await self.gate.wait()
        if self.fail_on is not None and self.fail_on in items:
            raise ValueError(f"refused {self.fail_on}")
        return [i * 2 for i in items]


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_a_lone_call_runs_at_once_as_a_batch_of_one() -> None:
    async def main() -> None:
        rec = Recorder()
        c = Coalescer(rec, max_items=10, max_inflight=1)
        assert await c(3) == 6
        assert rec.batches == [[3]]

    run(main())


def test_calls_that_arrive_while_a_statement_runs_share_the_next_one() -> None:
    async def main() -> None:
        rec = Recorder()
        rec.gate.clear()
        c = Coalescer(rec, max_items=100, max_inflight=1)
        first = asyncio.create_task(c(1))
        await asyncio.sleep(0)
        later = [asyncio.create_task(c(i)) for i in range(2, 7)]
        await asyncio.sleep(0)
        rec.gate.set()
        assert await first == 2
        assert [await t for t in later] == [4, 6, 8, 10, 12]
        assert rec.batches == [[1], [2, 3, 4, 5, 6]]

    run(main())


def test_batches_respect_max_items_by_weight() -> None:
    async def main() -> None:
        rec = Recorder()
        rec.gate.clear()
        c = Coalescer(rec, max_items=5, max_inflight=1, weight=lambda i: i)
        tasks = [asyncio.create_task(c(i)) for i in (1, 2, 3, 4)]
        await asyncio.sleep(0)
        rec.gate.set()
        await asyncio.gather(*tasks)
        assert rec.batches == [[1, 2], [3], [4]]  # 1+2 fit in 5; 3+4 would not

    run(main())


def test_an_item_heavier_than_the_limit_still_runs_alone() -> None:
    async def main() -> None:
        rec = Recorder()
        c = Coalescer(rec, max_items=2, max_inflight=1, weight=lambda i: i)
        assert await c(9) == 18
        assert rec.batches == [[9]]

    run(main())


def test_an_isolated_error_fails_only_its_own_caller() -> None:
    async def main() -> None:
        rec = Recorder()
        rec.gate.clear()
        rec.fail_on = 3
        c = Coalescer(rec, max_items=10, max_inflight=1, isolate=lambda exc: isinstance(exc, ValueError))
        blocker = asyncio.create_task(c(0))
        await asyncio.sleep(0)
        tasks = [asyncio.create_task(c(i)) for i in (2, 3, 4)]
        await asyncio.sleep(0)
        rec.gate.set()
        await blocker
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert results[0] == 4 and results[2] == 8
        assert isinstance(results[1], ValueError)
        assert rec.batches == [[0], [2, 3, 4], [2], [3], [4]]

    run(main())


def test_an_error_that_is_not_isolated_fails_the_whole_batch() -> None:
    async def main() -> None:
        rec = Recorder()
        rec.fail_on = 1
        c = Coalescer(rec, max_items=10, max_inflight=1)
        with pytest.raises(ValueError):
            await c(1)

    run(main())


def test_a_cancelled_caller_does_not_cancel_the_statement() -> None:
    async def main() -> None:
        rec = Recorder()
        rec.gate.clear()
        c = Coalescer(rec, max_items=10, max_inflight=1)
        gone = asyncio.create_task(c(1))
        await asyncio.sleep(0)
        gone.cancel()
        stays = asyncio.create_task(c(2))
        await asyncio.sleep(0)
        rec.gate.set()
        assert await stays == 4
        await c.aclose()
        assert rec.batches == [[1], [2]]  # the cancelled item's write still ran

    run(main())


def test_at_most_max_inflight_statements_run_at_once() -> None:
    async def main() -> None:
        rec = Recorder()
        rec.gate.clear()
        c = Coalescer(rec, max_items=1, max_inflight=2)
        tasks = [asyncio.create_task(c(i)) for i in range(5)]
        for _ in range(3):
            await asyncio.sleep(0)
        assert len(rec.batches) == 2
        rec.gate.set()
        assert await asyncio.gather(*tasks) == [0, 2, 4, 6, 8]

    run(main())
