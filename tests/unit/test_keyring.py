"""The key cache's parts (app/auth/keyring.py): a bounded LRU and the token bucket that rate-limits misses."""

from __future__ import annotations

import time

from app.auth.keyring import Lru, TokenBucket, _Entry


def entry(n: int) -> _Entry:
    return _Entry(float(n), None, b"")


def test_the_lru_forgets_the_least_recently_used_first() -> None:
    lru = Lru(3)
    for key in "abc":
        lru.put(key, entry(1))
    assert lru.get("a") is not None  # a is now the most recent
    lru.put("d", entry(1))
    assert "b" not in lru and {"a", "c", "d"} == {k for k in "abcd" if k in lru}
    assert len(lru) == 3
    lru.expire_all()
    assert lru.get("a") == _Entry(0.0, None, b"")


def test_the_bucket_allows_a_burst_then_the_rate() -> None:
    bucket = TokenBucket(rate=1000.0, burst=5)
    assert [bucket.take() for _ in range(6)] == [True] * 5 + [False]
    deadline = time.monotonic() + 5
    while not bucket.take():  # refilled at the rate
        assert time.monotonic() < deadline
