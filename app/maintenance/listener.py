"""The wake-up listener: one LISTEN connection per process that hands every message on the wake-up
channel to the wake-up seam (app/core/wakeups.py), reconnects by itself, and renews this process's
presence announcements; it follows the primary through a failover (JOBQ_DATABASE_URL may name several
hosts: CHECK_SECONDS). "API keys changed" messages (app/db/keys.py) empty the key cache, and "config <queue>"
messages (app/db/flow.py) drop that queue's cached configuration; a reconnect empties both, since a change
may have gone by unheard."""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg

from app.auth.keyring import KeyRing
from app.core.flow import QueueConfigs
from app.core.wakeups import RENEW_INTERVAL, Wakeups
from app.db.channels import CHANNEL, CONFIG_CHANGED, KEYS_CHANGED
from app.db.pool import KEEPALIVES, READ_ONLY

log = logging.getLogger("jobq.listener")

MAX_BACKOFF = 1.0  # seconds between two connection attempts, at most: a failover is over within about this
# Every CHECK_SECONDS the LISTEN connection asks whether its server still takes writes. A primary demoted
# without a restart (set read-only; an old primary left running beside the new one) would otherwise keep it
# listening where nobody writes any more; a connection that died silently is found out too.
CHECK_SECONDS = 5.0
# One attempt to connect and LISTEN, every host of the URL included, whatever libpq does. (In one full test run
# on a loaded machine, listeners stayed away over 30 s after their connection was killed, for a cause not
# found; with this bound a hung attempt costs at most this long.)
CONNECT_DEADLINE = 15.0
WARN_EVERY = 10.0  # seconds between two warnings of one outage


async def _still_primary(conn: psycopg.AsyncConnection[object]) -> None:
    cur = await conn.execute(READ_ONLY)
    row = await cur.fetchone()
    if row and row[0]:  # type: ignore[index]
        raise psycopg.OperationalError("the server is read-only now (a standby); looking for the primary")


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

    async def _connect(self) -> psycopg.AsyncConnection[object]:
        """A connection that listens; closed again if LISTEN fails."""
        conn = await psycopg.AsyncConnection.connect(
            self.url, autocommit=True, connect_timeout=5, application_name="jobq-listener", **KEEPALIVES
        )
        try:
            await conn.execute(f"LISTEN {CHANNEL}")
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _listen(self) -> None:
        backoff = 0.1
        lost_at: float | None = None  # when the connection was lost, while it is
        warned_at = 0.0
        while True:
            try:
                conn = await asyncio.wait_for(self._connect(), CONNECT_DEADLINE)
            except Exception as exc:
                # Said once every WARN_EVERY seconds of an outage: a failover takes many attempts.
                now = time.monotonic()
                lost_at = lost_at if lost_at is not None else now
                (log.warning if now - warned_at >= WARN_EVERY else log.debug)(
                    "cannot connect for %.1fs (%s: %s); trying again every %.1fs or less",
                    now - lost_at, type(exc).__name__, str(exc).strip(), MAX_BACKOFF,
                )  # fmt: skip
                warned_at = now if now - warned_at >= WARN_EVERY else warned_at
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
                continue
            try:
                async with conn:
                    self.keys.invalidate()  # a revocation may have gone by while we were not listening
                    self.configs.invalidate()  # and so may a change of configuration
                    # ... and wake-ups: every waited queue is looked at once (app/core/wakeups.py)
                    self.wakeups.listening()
                    if lost_at is not None:
                        log.info(
                            "listening again on %s:%s after %.1fs",
                            conn.info.host,
                            conn.info.port,
                            time.monotonic() - lost_at,
                        )
                    backoff, lost_at = 0.1, None
                    while True:
                        await self._receive_for(conn, CHECK_SECONDS)
                        # Messages arriving meanwhile wait in psycopg's backlog for the next notifies().
                        await _still_primary(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("connection lost (%s); reconnecting", str(exc).strip())
                lost_at = lost_at if lost_at is not None else time.monotonic()
                self.wakeups.db.check_soon()  # the pool's connections to that server are likely gone too
            finally:
                self.wakeups.deaf()

    async def _receive_for(self, conn: psycopg.AsyncConnection[object], seconds: float) -> None:
        """Hand on the messages that arrive within `seconds`. psycopg's own `notifies(timeout=...)` is not
        relied on alone: in the failover tests, with the pool's connection attempts failing around it, one
        such wait stayed pending past its deadline for over a minute, and the listener never looked whether
        its server was still the primary (tests/test_failover.py). The outer bound ends the wait whatever."""
        try:
            async with asyncio.timeout(seconds + 1.0):
                async for note in conn.notifies(timeout=seconds):
                    try:
                        self._received(note.payload)
                    except Exception:  # any role that may connect may NOTIFY: no message closes the connection
                        log.warning("a message on the channel was not understood: %r", note.payload[:200],
                                    exc_info=True)  # fmt: skip
        except TimeoutError:
            pass

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
