"""The token bucket per API key (app/http/quotas.py KeyRates), with the clock passed in."""

from __future__ import annotations

from app.auth.policy import ENV_KEY, OPEN, Principal
from app.http.quotas import KeyRates


def key(key_id: int, rate: float | None = None, burst: int | None = None) -> Principal:
    return Principal.of(f"k{key_id}", ["admin"], None, key_id, rate=rate, burst=burst)


def test_a_burst_then_the_rate_and_a_retry_after_that_fits() -> None:
    rates = KeyRates(rate=2, burst=4)
    k = key(1)
    assert [rates.take(k, now=0.0) is None for _ in range(5)] == [True] * 4 + [False]
    refused = rates.take(k, now=0.1)
    assert refused is not None and refused.status == 429 and refused.slug == "rate-limited"
    assert refused.headers() == {"retry-after": "1", "ratelimit-policy": '"key";q=4;w=2', "ratelimit": '"key";r=0;t=1'}
    assert rates.take(k, now=0.6) is None  # half a second at 2/s: one request
    assert rates.take(k, now=0.6) is not None
    assert all(rates.take(k, now=100.0 + i / 10) is None for i in range(4))  # refilled to the burst, not beyond


def test_each_key_has_its_own_bucket_and_may_have_its_own_rate() -> None:
    rates = KeyRates(rate=1, burst=1)
    assert rates.take(key(1), now=0.0) is None and rates.take(key(1), now=0.0) is not None
    assert rates.take(key(2), now=0.0) is None
    own = key(3, rate=10)  # its own rate; its burst: twice it
    assert sum(rates.take(own, now=0.0) is None for _ in range(30)) == 20
    unlimited = key(4, rate=0)
    assert all(rates.take(unlimited, now=0.0) is None for _ in range(1000))


def test_the_operators_key_and_an_open_service_are_not_limited() -> None:
    rates = KeyRates(rate=1, burst=1)
    assert all(rates.take(who, now=0.0) is None for who in (ENV_KEY, OPEN) for _ in range(100))
