"""The Quotas ASGI layer, right inside Authenticate: each request counts against its client's share of the
process, before its body is read or any route runs.

  * Requests in flight: one client (an API key; without one, the client address, through trusted proxies
    as the access log names it) holds at most JOBQ_MAX_CONNECTIONS_PER_CLIENT requests at once in this
    process (by default half of JOBQ_MAX_CONNECTIONS): a request in flight holds a connection, and one
    client's slow requests (long-polls, slow bodies, slow searches) must leave the other half to others.
    Past it: 429 `too-many-requests-in-flight`. Idle connections are the connection layer's business
    (app/runtime/connections.py): at the cap, an idle one gives up its place.
  * Request rate: a token bucket per API key, JOBQ_KEY_RATE_PER_SECOND with bursts of JOBQ_KEY_RATE_BURST, or
    the key's own (`jobq keys create --rate`). Past it: 429 `rate-limited` with Retry-After and the IETF
    RateLimit and RateLimit-Policy fields (draft-ietf-httpapi-ratelimit-headers), on that answer only.
    The buckets are this process's: N replicas (or --workers N) let a key send N times its rate in all,
    so divide by the number of processes when one total matters. JOBQ_API_KEY (the operator's own) and a
    service running without keys are not rate-limited; SQS requests signed with a key's AWS pair are not
    either (their key is known only inside the SQS endpoint).

Both cost a few dictionary operations per request: no lock, no database, no timer."""

from __future__ import annotations

import math
import time

from starlette.types import ASGIApp, Receive, Scope, Send

from app.auth.policy import OPEN, Principal
from app.errors import RateLimited, TooManyInFlight
from app.observability.clients import ClientAddress
from app.problems import problem_response
from app.settings import Settings


class KeyRates:
    """A token bucket per API key: `rate` requests a second on average, `burst` at once (a key's own rate and
    burst replace them; a rate of 0 is no limit)."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self._buckets: dict[int, list[float]] = {}  # key id -> [tokens, monotonic time of that count]

    def take(self, who: Principal, now: float | None = None) -> RateLimited | None:
        """Take one request from the key's bucket; the refusal when it is empty. Keys without an id (the
        JOBQ_API_KEY principal, the open service's) are not limited."""
        if who.key_id is None:
            return None
        rate = self.rate if who.rate is None else who.rate
        if rate <= 0:
            return None
        burst = float(who.burst or (self.burst if who.rate is None else max(1, int(rate * 2))))
        now = time.monotonic() if now is None else now
        bucket = self._buckets.get(who.key_id)
        if bucket is None:
            bucket = self._buckets[who.key_id] = [burst, now]
        tokens = min(burst, bucket[0] + (now - bucket[1]) * rate)
        bucket[1] = now
        if tokens >= 1:
            bucket[0] = tokens - 1
            return None
        bucket[0] = tokens
        wait = max(1, math.ceil((1 - tokens) / rate))
        window = max(1, math.ceil(burst / rate))
        return RateLimited(
            f"This API key may send {rate:g} requests a second to this server, {burst:g} at once; retry after "
            f"{wait} s.",
            retry_after=wait,
            headers={"ratelimit-policy": f'"key";q={int(burst)};w={window}', "ratelimit": f'"key";r=0;t={wait}'},
        )


class Quotas:
    def __init__(self, app: ASGIApp, settings: Settings, clients: ClientAddress) -> None:
        self.app = app
        self.rates = KeyRates(settings.key_rate_per_second, settings.key_burst)
        self.share = settings.connection_cap_per_client
        self.clients = clients
        self.in_flight: dict[str, int] = {}  # client -> requests in flight (absent: none)

    def client(self, scope: Scope, who: Principal | None) -> str:
        """Whose share a request counts against: its key, or without one its client address. The same name
        as app/auth/policy.py client_identity gives the waiting places."""
        if who is not None and who is not OPEN:
            return f"key {who.key_id if who.key_id is not None else who.name}"
        return f"address {self.clients.of(scope) or 'unknown'}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        who: Principal | None = scope["state"].get("principal")
        if who is not None and (refused := self.rates.take(who)) is not None:
            await problem_response(refused, scope["path"])(scope, receive, send)
            return
        client = self.client(scope, who)
        held = self.in_flight.get(client, 0)
        if held >= self.share:
            err = TooManyInFlight(
                f"This client already has {held} requests in flight on this server, its share of the connections; "
                "retry after a pause, or send fewer at once."
            )
            await problem_response(err, scope["path"])(scope, receive, send)
            return
        self.in_flight[client] = held + 1
        try:
            await self.app(scope, receive, send)
        finally:
            left = self.in_flight[client] - 1
            if left:
                self.in_flight[client] = left
            else:
                del self.in_flight[client]
