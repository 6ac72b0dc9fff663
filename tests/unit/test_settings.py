"""Settings parsing (app/settings.py): JOBQ_* variables, their bounds, and the rules across them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.auth.exposure import is_loopback
from app.settings import Settings, derived_caps


def test_defaults_ignore_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBQ_PORT", "9999")
    assert Settings().port == 9999
    assert Settings.defaults().port == 8000


@pytest.mark.parametrize(
    ("variable", "value"),
    [("JOBQ_PORT", "0"), ("JOBQ_POOL_MAX_SIZE", "many"), ("JOBQ_AUTH", "maybe"), ("JOBQ_MAX_WAITERS", "-1")],
)
def test_a_value_out_of_range_is_refused(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError):
        Settings()


@pytest.mark.parametrize(
    "values",
    [
        {"pool_min_size": 5, "pool_max_size": 2},
        {"lease_default_seconds": 100, "lease_max_seconds": 10},
        {"backoff_base_seconds": 10, "backoff_cap_seconds": 1},
        {"max_payload_bytes": 2_000_000, "max_request_bytes": 1_048_576},
        {"api_key": "too short"},
    ],
)
def test_rules_across_settings(values: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Settings.defaults(**values)


def test_a_bad_api_key_never_appears_in_the_error() -> None:
    with pytest.raises(ValidationError) as info:
        Settings.defaults(api_key="s3cret-but-short")
    assert "s3cret" not in str(info.value)


def test_booleans_take_the_usual_spellings(monkeypatch: pytest.MonkeyPatch) -> None:
    for text, value in (("true", True), ("0", False), ("yes", True), ("off", False)):
        monkeypatch.setenv("JOBQ_FAST_PATH", text)
        assert Settings().fast_path is value


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("example.com", False)],
)  # fmt: skip
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("open_files", "connections", "waiters"),
    [(1024, 949, 711), (20_000, 19_925, 10_000), (100, 25, 18), (40, 16, 12)],
)
def test_caps_derive_from_the_open_file_limit(open_files: int, connections: int, waiters: int) -> None:
    """Every connection is a file: the cap leaves the pool (10), the listener and 64 files free, and waiters
    are three quarters of the connections (at most 10,000), so a 429 comes before EMFILE."""
    assert derived_caps(open_files, pool_max_size=10) == (connections, waiters)


def test_waiter_caps_follow_what_is_set() -> None:
    s = Settings.defaults(max_connections=400)
    assert (s.connection_cap, s.waiter_cap, s.waiter_cap_per_client) == (400, 300, 150)
    s = Settings.defaults(max_waiters=10, max_waiters_per_client=3)
    assert (s.waiter_cap, s.waiter_cap_per_client) == (10, 3)
    with pytest.raises(ValidationError):
        Settings.defaults(max_waiters=100, max_connections=100)
    with pytest.raises(ValidationError):
        Settings.defaults(max_waiters=10, max_waiters_per_client=11)


def test_lists_are_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBQ_ALLOWED_HOSTS", "devbox, Jobq.LAN,")
    monkeypatch.setenv("JOBQ_TRUSTED_PROXIES", "10.0.0.0/8,::1")
    s = Settings()
    assert (s.allowed_hosts, s.trusted_proxies) == (("devbox", "jobq.lan"), ("10.0.0.0/8", "::1"))
    monkeypatch.setenv("JOBQ_TRUSTED_PROXIES", "proxy.internal")
    with pytest.raises(ValidationError):
        Settings()
