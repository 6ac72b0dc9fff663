"""One start/stop protocol for background services, a base for the ones that tick, and the supervisor
that starts them in the lifespan and stops them in reverse order.

A ticking service does one pass in `run_once()`, which tests call directly; `start()` runs it every
`interval` seconds (jittered, so replicas started together do not tick in lockstep) until `stop()`;
`poke()` brings the next pass forward, and a service that knows when it is next due says so in
`next_delay()`. A
pass that fails is logged with its traceback and counted (`jobq_maintenance_errors_total{service}`);
the next tick tries again. Passes that work in batches take a connection per batch and pause between
batches, so a large backlog never holds a pooled connection for long or starves requests."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Protocol

from app.observability.metrics import Metrics

log = logging.getLogger("jobq.maintenance")

BATCH_PAUSE_SECONDS = 0.005  # between two batches of one pass: let requests have the pool and the CPU


class Service(Protocol):
    @property
    def name(self) -> str: ...

    def start(self) -> None: ...

    async def stop(self) -> None: ...


class Ticking:
    """A service that runs `run_once()` every `interval` seconds (0: never started)."""

    name: ClassVar[str] = "service"

    def __init__(self, interval: float, metrics: Metrics, *, first_delay: float | None = None) -> None:
        self.interval = interval
        self.metrics = metrics
        self.first_delay = first_delay  # None: one (jittered) interval
        self.passes = 0  # completed passes, for diagnostics and tests
        self._task: asyncio.Task[None] | None = None
        self._poked = asyncio.Event()

    async def run_once(self) -> Any:
        raise NotImplementedError

    def next_delay(self) -> float:
        """Seconds from the end of a pass to the next one."""
        return self.interval * random.uniform(0.8, 1.2)

    def poke(self) -> None:
        """Run the next pass now rather than at its time (something it must see has changed)."""
        self._poked.set()

    async def _loop(self) -> None:
        delay = (self.first_delay if self.first_delay is not None else self.interval) * random.uniform(0.8, 1.2)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poked.wait(), delay)
            self._poked.clear()
            try:
                await self.run_once()
                self.passes += 1
            except Exception:
                self.metrics.maintenance_errors.labels(self.name).inc()
                log.exception("%s: a pass failed; trying again in %.1fs", self.name, self.interval)
            delay = self.next_delay()

    def start(self) -> None:
        if self.interval > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"jobq-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


async def between_batches() -> None:
    await asyncio.sleep(BATCH_PAUSE_SECONDS)


class Supervisor:
    """Starts services in the order given and stops them in reverse; `supervisor["rescuer"]` finds one."""

    def __init__(self, services: Sequence[Service]) -> None:
        self.services = list(services)
        names = [s.name for s in self.services]
        if len(set(names)) != len(names):
            raise ValueError(f"two services share a name: {names}")

    def __getitem__(self, name: str) -> Any:
        for service in self.services:
            if service.name == name:
                return service
        raise KeyError(name)

    def __iter__(self) -> Iterator[Service]:
        return iter(self.services)

    def start(self) -> None:
        for service in self.services:
            service.start()
        log.debug("maintenance services started: %s", ", ".join(s.name for s in self.services))

    async def stop(self) -> None:
        for service in reversed(self.services):
            try:
                await service.stop()
            except Exception:
                log.exception("%s: could not stop cleanly", service.name)
