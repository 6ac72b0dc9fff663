"""Verified API keys, cached per process: no database round trip per request, revocation at once.

A key's row is read once per process (on its first use, then again after JOBQ_AUTH_CACHE_SECONDS) and
kept with its verdict. Live keys and unknown selectors are cached apart, each in a bounded LRU, so that a
flood of made-up keys can push out only other made-up keys, never a live one. Unknown selectors cost one
query each at most, and only MISS_RATE of those a second (bursts of MISS_BURST): past that a key never
seen live here is answered 429 without a query of its own, while keys known live are still looked up again
when their entry expires. So that such a flood cannot lock out a real key this process has not seen yet
(after a start, or a key just created), a throttled selector is looked for in the list of every live key's
selector, read at most once every SELECTORS_MAX_AGE seconds (and again after any key change): one there is
looked up as usual. A flood uses at most LOOKUP_CONCURRENCY connections while it lasts. Every change to a key
sends a NOTIFY (app/db/keys.py) that app/maintenance/listener.py turns into invalidate() in every process; the TTL
only bounds what a listener that was disconnected might have missed (it also invalidates on reconnect).
A lookup that raced an invalidation returns its answer to its own request but does not cache it.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from app.auth.keys import digest, parse_key
from app.auth.policy import ENV_KEY, Principal
from app.db import keys as store_keys
from app.db.pool import Database
from app.errors import KeyLookupsThrottled

log = logging.getLogger("jobq.auth")

LIVE_ENTRIES = 10_000  # live keys cached per process; past it the least recently used goes
UNKNOWN_ENTRIES = 10_000  # unknown selectors cached per process, apart from the live ones
MISS_RATE = 20.0  # lookups of selectors never seen live here, per second...
MISS_BURST = 50  # ...after a burst of this many
LOOKUP_CONCURRENCY = 4
SELECTORS_MAX_AGE = 1.0  # seconds: how often, at most, a flood of made-up keys has the live selectors read


@dataclass(frozen=True, slots=True)
class _Entry:
    expires: float  # monotonic
    principal: Principal | None  # None: no live key has this selector
    key_hash: bytes


class Lru:
    """A bounded map that forgets its least recently used entry first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, _Entry] = OrderedDict()

    def get(self, key: str) -> _Entry | None:
        entry = self._items.get(key)
        if entry is not None:
            self._items.move_to_end(key)
        return entry

    def put(self, key: str, entry: _Entry) -> None:
        self._items[key] = entry
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def pop(self, key: str) -> None:
        self._items.pop(key, None)

    def clear(self) -> None:
        self._items.clear()

    def expire_all(self) -> None:
        """Keep every entry, due for a new lookup."""
        for key, entry in list(self._items.items()):
            self._items[key] = _Entry(0.0, entry.principal, entry.key_hash)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items


class TokenBucket:
    """`rate` events a second on average, `burst` at once."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self._tokens = float(burst)
        self._at = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class KeyRing:
    def __init__(
        self,
        db: Database,
        ttl: float,
        env_key: str | None = None,
        *,
        live_entries: int = LIVE_ENTRIES,
        unknown_entries: int = UNKNOWN_ENTRIES,
        miss_rate: float = MISS_RATE,
        miss_burst: int = MISS_BURST,
    ) -> None:
        self.db = db
        self.ttl = ttl
        self._env = digest(env_key) if env_key else None
        self._live = Lru(live_entries)
        self._unknown = Lru(unknown_entries)
        self._misses = TokenBucket(miss_rate, miss_burst)
        self._loading: dict[str, asyncio.Future[_Entry]] = {}
        self.generation = 0  # bumped by every invalidation
        self._used: set[int] = set()
        self._lookup_slots = asyncio.Semaphore(LOOKUP_CONCURRENCY)
        self._selectors: frozenset[str] = frozenset()  # of every live key, as last read
        self._selectors_read = -float("inf")  # monotonic time of that read; -inf: read again before use
        self._selectors_loading: asyncio.Future[None] | None = None
        self.lookups = 0  # database lookups so far (tests, diagnostics)

    async def authenticate(self, token: str) -> Principal | None:
        """The principal of a valid, live key; None for anything else."""
        if self._env is not None and hmac.compare_digest(digest(token), self._env):
            return ENV_KEY
        parsed = parse_key(token)
        if parsed is None:
            return None
        selector, secret = parsed
        entry = self._live.get(selector) or self._unknown.get(selector)
        if entry is None or entry.expires < time.monotonic():
            entry = await self._refresh(selector)
        if entry.principal is None or not hmac.compare_digest(entry.key_hash, digest(secret)):
            return None
        if entry.principal.key_id is not None:
            self._used.add(entry.principal.key_id)
        return entry.principal

    __call__ = authenticate

    async def live_principal(self, selector: str) -> Principal | None:
        """The principal of the live key with this selector, WITHOUT checking any secret: for a caller that
        proves it holds the key another way (an SQS request's signature, app/auth/sigv4.py), which then
        reports the use with used(). Cached and throttled exactly as authenticate()."""
        entry = self._live.get(selector) or self._unknown.get(selector)
        if entry is None or entry.expires < time.monotonic():
            entry = await self._refresh(selector)
        return entry.principal

    def used(self, principal: Principal) -> None:
        """Record that a request proved it holds this key (its last use is stamped at the next flush)."""
        if principal.key_id is not None:
            self._used.add(principal.key_id)

    async def _refresh(self, selector: str) -> _Entry:
        # A key seen live before is looked up again whatever the rate of misses: a flood of made-up keys must
        # not lock out the real ones when their entries expire; nor one not seen here yet, which is among the
        # live selectors.
        throttled = selector not in self._live and selector not in self._loading and not self._misses.take()
        if throttled and not await self._may_be_live(selector):
            raise KeyLookupsThrottled()
        return await self._load(selector)

    def invalidate(self) -> None:
        """Forget every verdict (a key changed somewhere, or we may have missed that it did). Which selectors
        were live is kept, with entries that have expired, so that they are looked up again unthrottled."""
        self.generation += 1
        self._unknown.clear()
        self._live.expire_all()
        self._selectors_read = -float("inf")

    async def _may_be_live(self, selector: str) -> bool:
        """Whether a live key has this selector, from the list of every live key's selector: read once for
        any number of throttled selectors within SELECTORS_MAX_AGE, and again after any key change."""
        if time.monotonic() - self._selectors_read >= SELECTORS_MAX_AGE:
            if self._selectors_loading is None:
                self._selectors_loading = asyncio.ensure_future(self._read_selectors())
                self._selectors_loading.add_done_callback(lambda _: setattr(self, "_selectors_loading", None))
            await asyncio.shield(self._selectors_loading)
        return selector in self._selectors

    async def _read_selectors(self) -> None:
        generation, started = self.generation, time.monotonic()
        async with self._lookup_slots, self.db.connection() as conn:
            selectors = await store_keys.api_key_selectors(conn)
        self._selectors = selectors
        if generation == self.generation:  # else a key changed meanwhile: read again at the next need
            self._selectors_read = started

    async def _load(self, selector: str) -> _Entry:
        # Concurrent first uses of one key share one lookup.
        pending = self._loading.get(selector)
        if pending is None:
            pending = asyncio.ensure_future(self._fetch(selector))
            self._loading[selector] = pending
            pending.add_done_callback(lambda _: self._loading.pop(selector, None))
        return await asyncio.shield(pending)

    async def _fetch(self, selector: str) -> _Entry:
        generation = self.generation
        async with self._lookup_slots, self.db.connection() as conn:
            row = await store_keys.api_key_by_selector(conn, selector)
        self.lookups += 1
        principal = (
            None
            if row is None
            else Principal.of(
                row.name, row.scopes, row.queue_patterns, row.id, rate=row.rate_per_second, burst=row.rate_burst
            )
        )
        entry = _Entry(time.monotonic() + self.ttl, principal, row.key_hash if row else b"")
        if generation == self.generation:
            if principal is None:
                self._live.pop(selector)
                self._unknown.put(selector, entry)
            else:
                self._unknown.pop(selector)
                self._live.put(selector, entry)
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
