"""The fallback poll: every JOBQ_POLL_INTERVAL_SECONDS, each queue with waiting claims in this process is
looked at once more, whatever the wake-ups said. It covers what no wake-up announces (a delayed job
coming due, a retry's backoff ending) and wake-ups that were lost (a listener reconnecting)."""

from __future__ import annotations

from app.core.dispatcher import ClaimDispatcher
from app.maintenance.base import Ticking
from app.runtime.metrics import Metrics


class FallbackPoll(Ticking):
    name = "poll"

    def __init__(self, dispatcher: ClaimDispatcher, interval: float, metrics: Metrics) -> None:
        super().__init__(interval, metrics)
        self.dispatcher = dispatcher

    async def run_once(self) -> None:
        self.dispatcher.poll_once()
