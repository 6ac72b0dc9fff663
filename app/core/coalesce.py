"""Group commit: concurrent calls share one database statement.

A call never waits on a timer. When fewer than `max_inflight` statements are running, it starts one at
once; calls that arrive while they run queue up and go together in the next statement. Under light load
every call is a batch of one; under heavy load batches grow by themselves and the number of statements
and commits per job falls. That is the lever that counts: on the reference machine, round trips and
commits, not PostgreSQL itself, are the first bottleneck.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Coalescer(Generic[T, R]):
    def __init__(
        self,
        run: Callable[[list[T]], Awaitable[Sequence[R]]],
        *,
        max_items: int,
        max_inflight: int,
        weight: Callable[[T], int] = lambda _: 1,
        isolate: Callable[[Exception], bool] = lambda _: False,
    ) -> None:
        """`run` gets the items of one statement and returns one result per item, in order.
        When a shared statement fails with an error for which `isolate` is true (one that certainly
        rolled back, such as a refused value), it is retried item by item, so that one bad item fails
        only its own caller. Never isolate errors after which the commit is in doubt."""
        self._run = run
        self._max_items = max_items
        self._max_inflight = max_inflight
        self._weight = weight
        self._isolate = isolate
        self._waiting: deque[tuple[T, asyncio.Future[R]]] = deque()
        self._inflight = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._inflight < self._max_inflight:
            self._inflight += 1
            task = asyncio.get_running_loop().create_task(self._drain())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # A cancelled caller cancels its future: the item still runs with its batch (its write may commit)
        # and the result is dropped (_execute skips done futures). No shield needed, and shield is not
        # free: it cost 8% of the enqueue path's CPU.
        return await future

    @property
    def inflight(self) -> int:
        """Statements of this coalescer under way (the caller's own included, from inside `run`)."""
        return self._inflight

    def _take(self) -> list[tuple[T, asyncio.Future[R]]]:
        batch: list[tuple[T, asyncio.Future[R]]] = []
        total = 0
        while self._waiting:
            w = self._weight(self._waiting[0][0])
            if batch and total + w > self._max_items:
                break
            batch.append(self._waiting.popleft())
            total += w
        return batch

    async def _drain(self) -> None:
        try:
            while batch := self._take():
                await self._execute(batch)
        finally:
            self._inflight -= 1

    async def _execute(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._run([item for item, _ in batch])
        except Exception as exc:
            if len(batch) > 1 and self._isolate(exc):
                for one in batch:
                    await self._execute([one])
                return
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)

    async def aclose(self) -> None:
        """Wait for statements already started (their callers are owed an answer)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
