"""The fallback poll: every JOBQ_POLL_INTERVAL_SECONDS, the queues with waiting claims in this process are
looked at once more, whatever the wake-ups said (one statement for all of them, then a claim on each that
has a job ready), and so is each job that requests wait for. It covers what no wake-up announces (a delayed
job coming due, a retry's backoff ending) and wake-ups that were lost (a listener reconnecting, a finish
elsewhere just before our presence arrived there)."""

from __future__ import annotations

from app.core.dispatcher import ClaimDispatcher
from app.core.results import ResultWaiters
from app.maintenance.base import Ticking
from app.observability.metrics import Metrics


class FallbackPoll(Ticking):
    name = "poll"

    def __init__(self, dispatcher: ClaimDispatcher, results: ResultWaiters, interval: float, metrics: Metrics) -> None:
        super().__init__(interval, metrics)
        self.dispatcher = dispatcher
        self.results = results

    async def run_once(self) -> None:
        await self.dispatcher.poll_once()
        self.results.poll_once()
