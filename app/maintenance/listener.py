"""The wake-up listener: one LISTEN connection per process that hands every message on the wake-up
channel to the wake-up seam (app/core/wakeups.py), reconnects by itself, and renews this process's
presence announcements. "API keys changed" messages (app/db/keys.py) empty the key cache, and "config <queue>"
messages (app/db/flow.py) drop that queue's cached configuration; a reconnect empties both, since a change
may have gone by unheard."""

from __future__ import annotations

import asyncio
import logging

import psycopg

from app.auth.keyring import KeyRing
from app.core.flow import QueueConfigs
from app.core.wakeups import RENEW_INTERVAL, Wakeups
from app.db.channels import CHANNEL, CONFIG_CHANGED, KEYS_CHANGED

log = logging.getLogger("jobq.listener")


class WakeupListener:
    name = "listener"

    def __init__(self, url: str, wakeups: Wakeups, keys: KeyRing, configs: QueueConfigs) -> None:
        self.url = url
        self.wakeups = wakeups
        self.keys = keys
        self.configs = configs
        self._tasks: list[asyncio.Task[None]] = []

    def _received(self, payload: str) -> None:
        if payload == KEYS_CHANGED:
            self.keys.invalidate()
        elif payload.startswith(CONFIG_CHANGED + " "):
            queue = payload.removeprefix(CONFIG_CHANGED + " ")
            self.configs.invalidate(queue)
            self.wakeups.local.wake([queue])  # waiting claims go by the new limits now
        else:
            self.wakeups.received(payload)

    async def _listen(self) -> None:
        backoff = 0.1
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self.url,
                    autocommit=True,
                    connect_timeout=5,
                    application_name="jobq-listener",
                    keepalives=1,
                    keepalives_idle=10,
                    keepalives_interval=5,
                    keepalives_count=3,
                )
            except Exception as exc:
                log.warning("cannot connect (%s); retrying in %.1fs", str(exc).strip(), backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            try:
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.keys.invalidate()  # a revocation may have gone by while we were not listening
                    self.configs.invalidate()  # and so may a change of configuration
                    self.wakeups.listening()
                    backoff = 0.1
                    async for note in conn.notifies():
                        self._received(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("connection lost (%s); reconnecting", str(exc).strip())
            finally:
                self.wakeups.deaf()

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(RENEW_INTERVAL)
            self.wakeups.renew()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._listen(), name="jobq-listener"),
            loop.create_task(self._renew(), name="jobq-presence"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.wakeups.aclose()
