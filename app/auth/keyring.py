"""Verified API keys, cached per process: no database round trip per request, revocation at once.

A key's row is read once per process (on its first use, then again after JOBQ_AUTH_CACHE_SECONDS) and
kept with its verdict; unknown selectors are cached too, so a flood of bad keys costs no queries after
the first of each, and at most LOOKUP_CONCURRENCY connections while it lasts. Every change to a key
sends a NOTIFY (app/db/keys.py) that app/maintenance/listener.py turns into invalidate() in every process; the TTL
only bounds what a listener that was disconnected might have missed (it also invalidates on reconnect).
A lookup that raced an invalidation returns its answer to its own request but does not cache it.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from dataclasses import dataclass

from app.auth.keys import digest, parse_key
from app.auth.policy import ENV_KEY, Principal
from app.db import keys as store_keys
from app.db.pool import Database

log = logging.getLogger("jobq.auth")

MAX_ENTRIES = 10_000  # past this, forget everything (mostly cached unknown selectors)
LOOKUP_CONCURRENCY = 4


@dataclass(frozen=True, slots=True)
class _Entry:
    expires: float  # monotonic
    principal: Principal | None  # None: no live key has this selector
    key_hash: bytes


class KeyRing:
    def __init__(self, db: Database, ttl: float, env_key: str | None = None) -> None:
        self.db = db
        self.ttl = ttl
        self._env = digest(env_key) if env_key else None
        self._entries: dict[str, _Entry] = {}
        self._loading: dict[str, asyncio.Future[_Entry]] = {}
        self._generation = 0
        self._used: set[int] = set()
        self._lookup_slots = asyncio.Semaphore(LOOKUP_CONCURRENCY)
        self.lookups = 0  # database lookups so far (tests, diagnostics)

    async def authenticate(self, token: str) -> Principal | None:
        """The principal of a valid, live key; None for anything else."""
        if self._env is not None and hmac.compare_digest(digest(token), self._env):
            return ENV_KEY
        parsed = parse_key(token)
        if parsed is None:
            return None
        selector, secret = parsed
        entry = self._entries.get(selector)
        if entry is None or entry.expires < time.monotonic():
            entry = await self._load(selector)
        if entry.principal is None or not hmac.compare_digest(entry.key_hash, digest(secret)):
            return None
        if entry.principal.key_id is not None:
            self._used.add(entry.principal.key_id)
        return entry.principal

    __call__ = authenticate

    def invalidate(self) -> None:
        """Forget every cached key (a key changed somewhere, or we may have missed that it did)."""
        self._generation += 1
        self._entries.clear()

    async def _load(self, selector: str) -> _Entry:
        # Concurrent first uses of one key share one lookup.
        pending = self._loading.get(selector)
        if pending is None:
            pending = asyncio.ensure_future(self._fetch(selector))
            self._loading[selector] = pending
            pending.add_done_callback(lambda _: self._loading.pop(selector, None))
        return await asyncio.shield(pending)

    async def _fetch(self, selector: str) -> _Entry:
        generation = self._generation
        async with self._lookup_slots, self.db.connection() as conn:
            row = await store_keys.api_key_by_selector(conn, selector)
        self.lookups += 1
        principal = None if row is None else Principal.of(row.name, row.scopes, row.queue_patterns, row.id)
        entry = _Entry(time.monotonic() + self.ttl, principal, row.key_hash if row else b"")
        if generation == self._generation:
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[selector] = entry
        return entry

    # -- last use ------------------------------------------------------------------------------------------

    async def flush(self) -> None:
        """Record which keys were used since the last flush (one statement)."""
        if not self._used:
            return
        ids, self._used = sorted(self._used), set()
        try:
            async with self.db.connection() as conn:
                await store_keys.api_keys_touch(conn, ids)
        except Exception:
            self._used.update(ids)  # diagnostics only: try again next time
            log.warning("could not record the last use of %d API key(s)", len(ids))
