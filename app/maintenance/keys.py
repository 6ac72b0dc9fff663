"""Last use of API keys: the key cache notes which keys authenticated requests; this service records it
in api_keys every 30 s, one statement for all of them (diagnostics, not worth a write per request), and
once more when it stops."""

from __future__ import annotations

from app.auth.keyring import KeyRing
from app.maintenance.base import Ticking
from app.observability.metrics import Metrics

TOUCH_INTERVAL = 30.0


class KeyUse(Ticking):
    name = "key-use"

    def __init__(self, keys: KeyRing, metrics: Metrics, interval: float = TOUCH_INTERVAL) -> None:
        super().__init__(interval, metrics)
        self.keys = keys

    async def run_once(self) -> None:
        await self.keys.flush()

    async def stop(self) -> None:
        await super().stop()
        await self.keys.flush()
