"""SQS requests with keys on (app/auth/sigv4.py): signed by botocore with a key's pair, verified against the real
key ring on PostgreSQL; each part tampered with gets SQS's own error code; revocation and the server secret;
`jobq keys create --sqs` and `jobq keys sqs` print a pair that verifies."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
from botocore.auth import SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from app.auth.keys import new_key, sqs_access_key_id, sqs_secret
from app.auth.policy import Principal
from app.auth.sigv4 import SqsAuthError, authenticate_sqs, signer_recheck, sqs_authenticator
from app.db import keys as store_keys
from app.runtime.cli import main as jobq
from tests.support import LiveServer, wait_until

SERVER_SECRET = "sqs-server-secret-" + "x" * 30
BODY = b'{"QueueName": "emails"}'


def create_pair(
    db: psycopg.Connection, name: str, scopes: list[str], queues: list[str] | None = None
) -> tuple[str, str]:
    _key, selector, key_hash = new_key()
    key_id = store_keys.api_key_insert(db, name, selector, key_hash, scopes, queues)
    return sqs_access_key_id(selector), sqs_secret(SERVER_SECRET, selector, key_id)


def sign(
    server: LiveServer, pair: tuple[str, str], body: bytes = BODY, *, query: bool = False, region: str = "us-east-1"
) -> AWSRequest:
    request = AWSRequest(
        method="POST",
        url=f"{server.url}/" + ("?Action=CreateQueue&QueueName=emails" if query else ""),
        data=b"" if query else body,
        headers={"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.CreateQueue"},
    )
    signer = SigV4QueryAuth if query else SigV4Auth
    signer(Credentials(*pair), "sqs", region).add_auth(request)  # type: ignore[no-untyped-call]
    return request


def verify(server: LiveServer, request: AWSRequest, body: bytes | None = None, now: float | None = None) -> Principal:
    parts = urlsplit(request.url)
    headers = [(k.lower().encode(), v.encode()) for k, v in request.headers.items()]
    headers.append((b"host", parts.netloc.encode()))
    sent = request.body if isinstance(request.body, bytes) else (request.body or "").encode()
    services = server.services
    return server.run(
        lambda: authenticate_sqs(
            "POST", parts.path, parts.query, headers, sent if body is None else body, services.keys, server.settings,
            now=now,
        )
    )  # fmt: skip


def refusal(call: Callable[[], Any]) -> tuple[str, int]:
    with pytest.raises(SqsAuthError) as err:
        call()
    return err.value.code, err.value.status


@pytest.fixture
def signed_server(server_factory) -> LiveServer:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(auth="on", sqs_server_secret=SERVER_SECRET)
    wait_until(lambda: server.services.wakeups.connected.is_set(), what="listening")
    return server


def test_a_signed_request_names_its_key_and_scopes(signed_server: LiveServer, db: psycopg.Connection) -> None:
    pair = create_pair(db, "mailer", ["produce"], ["emails", "sms.*"])
    for request in (sign(signed_server, pair), sign(signed_server, pair, query=True)):
        who = verify(signed_server, request)
        assert who.name == "mailer" and who.has("produce") and not who.has("consume")
        assert who.allows("emails") and who.allows("sms.eu") and not who.allows("other")


def test_each_part_tampered_with_gets_sqs_error_code(signed_server: LiveServer, db: psycopg.Connection) -> None:
    pair = create_pair(db, "mailer", ["produce"])
    good = sign(signed_server, pair)
    assert refusal(lambda: verify(signed_server, good, body=BODY + b" ")) == ("SignatureDoesNotMatch", 403)  # body

    header = sign(signed_server, pair)
    header.headers.replace_header("X-Amz-Target", "AmazonSQS.DeleteQueue")
    assert refusal(lambda: verify(signed_server, header)) == ("SignatureDoesNotMatch", 403)

    region = sign(signed_server, pair)
    region.headers.replace_header("Authorization", region.headers["Authorization"].replace("us-east-1", "eu-west-1"))
    assert refusal(lambda: verify(signed_server, region)) == ("SignatureDoesNotMatch", 403)

    other_service = sign(signed_server, pair)
    sns = other_service.headers["Authorization"].replace("/sqs/", "/sns/")
    other_service.headers.replace_header("Authorization", sns)
    assert refusal(lambda: verify(signed_server, other_service)) == ("SignatureDoesNotMatch", 403)

    wrong_secret = sign(signed_server, (pair[0], pair[1][:-1] + ("A" if pair[1][-1] != "A" else "B")))
    assert refusal(lambda: verify(signed_server, wrong_secret)) == ("SignatureDoesNotMatch", 403)

    # The date: signed now, checked 6 minutes later or earlier (the clock is the server's).
    later, earlier = time.time() + 360, time.time() - 360
    assert refusal(lambda: verify(signed_server, good, now=later)) == ("RequestExpired", 400)
    assert refusal(lambda: verify(signed_server, good, now=earlier)) == ("RequestExpired", 400)
    assert verify(signed_server, good, now=time.time() + 240).name == "mailer"

    unknown = sign(signed_server, ("JOBQ0123456789AB", pair[1]))  # no such selector
    assert refusal(lambda: verify(signed_server, unknown)) == ("InvalidClientTokenId", 403)
    not_ours = sign(signed_server, ("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"))
    assert refusal(lambda: verify(signed_server, not_ours)) == ("InvalidClientTokenId", 403)

    malformed = sign(signed_server, pair)
    malformed.headers.replace_header("Authorization", malformed.headers["Authorization"].replace("Signature=", "S="))
    assert refusal(lambda: verify(signed_server, malformed)) == ("IncompleteSignature", 400)

    unsigned = AWSRequest(method="POST", url=f"{signed_server.url}/", data=BODY, headers={})
    assert refusal(lambda: verify(signed_server, unsigned)) == ("MissingAuthenticationToken", 403)
    bearer = AWSRequest(method="POST", url=f"{signed_server.url}/", data=BODY, headers={"Authorization": "Bearer x"})
    assert refusal(lambda: verify(signed_server, bearer)) == ("InvalidClientTokenId", 403)  # no live key: else not here
    assert verify(signed_server, good).name == "mailer"  # and the untampered request still passes


def test_revoking_the_key_revokes_its_pair(signed_server: LiveServer, db: psycopg.Connection) -> None:
    pair = create_pair(db, "mailer", ["produce"])
    assert verify(signed_server, sign(signed_server, pair)).name == "mailer"
    ring = signed_server.services.keys
    generation = ring.generation
    assert store_keys.api_key_revoke(db, "mailer")
    wait_until(lambda: ring.generation > generation, what="the revocation heard")
    assert refusal(lambda: verify(signed_server, sign(signed_server, pair))) == ("InvalidClientTokenId", 403)


def test_another_server_secret_makes_every_pair_invalid(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    pair = create_pair(db, "mailer", ["produce"])
    rotated: LiveServer = server_factory(auth="on", sqs_server_secret="another-server-secret-" + "y" * 30)
    assert refusal(lambda: verify(rotated, sign(rotated, pair))) == ("SignatureDoesNotMatch", 403)
    unset: LiveServer = server_factory(auth="on")
    with pytest.raises(SqsAuthError) as err:
        verify(unset, sign(unset, pair))
    assert err.value.code == "InvalidClientTokenId" and "JOBQ_SQS_SERVER_SECRET" in err.value.message


@dataclass(frozen=True)
class Parts:
    method: str
    path: str
    query_string: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes


def test_the_sqs_endpoints_authenticator_verifies_its_parts(signed_server: LiveServer, db: psycopg.Connection) -> None:
    """sqs_authenticator(): the seam the SQS endpoint plugs in, given the request's parts as it read them."""
    pair = create_pair(db, "mailer", ["consume"])
    authenticate = sqs_authenticator(lambda: signed_server.services.keys, signed_server.settings)
    for request in (sign(signed_server, pair), sign(signed_server, pair, query=True)):
        url = urlsplit(request.url)
        headers = [(k.lower().encode(), v.encode()) for k, v in request.headers.items()]
        headers.append((b"host", url.netloc.encode()))
        body = request.body if isinstance(request.body, bytes) else (request.body or "").encode()
        parts = Parts("POST", url.path, url.query.encode(), headers, body)
        assert signed_server.run(lambda p=parts: authenticate(p)).name == "mailer"  # type: ignore[misc]
        tampered = Parts("POST", url.path, url.query.encode(), headers, body + b"x")
        with pytest.raises(SqsAuthError) as err:
            signed_server.run(lambda p=tampered: authenticate(p))  # type: ignore[misc]
        assert err.value.code == "SignatureDoesNotMatch"

    # The recheck a long-poll asks before it hands out messages: true while the key lives, false once revoked.
    still_valid = signer_recheck(signed_server.services.keys, parts, signed_server.run(lambda: authenticate(parts)))
    assert signed_server.run(still_valid) is True
    ring = signed_server.services.keys
    generation = ring.generation
    assert store_keys.api_key_revoke(db, "mailer")
    wait_until(lambda: ring.generation > generation, what="the revocation heard")
    assert signed_server.run(still_valid) is False


def test_a_signed_request_to_a_jobq_route_is_refused(signed_server: LiveServer, db: psycopg.Connection) -> None:
    """The Authenticate layer lets a signed request on for the SQS endpoint to check; every other route still
    wants a bearer key (401), whatever the signature."""
    pair = create_pair(db, "admin", ["admin"])
    request = AWSRequest(method="GET", url=f"{signed_server.url}/queues", headers={})
    SigV4Auth(Credentials(*pair), "sqs", "us-east-1").add_auth(request)  # type: ignore[no-untyped-call]
    r = httpx.get(f"{signed_server.url}/queues", headers=dict(request.headers.items()))
    assert r.status_code == 401, r.text


# --- the CLI -------------------------------------------------------------------------------------------------


def test_keys_create_prints_the_pair_an_aws_sdk_needs(  # type: ignore[no-untyped-def]
    signed_server: LiveServer, database_url: str, monkeypatch, capsys
) -> None:
    monkeypatch.delenv("JOBQ_SQS_SERVER_SECRET", raising=False)
    args = ["keys", "create", "--database-url", database_url, "--name", "mailer", "--scope", "produce", "--sqs"]
    assert jobq(args) == 2  # no server secret to derive from: said, and no key made
    assert "JOBQ_SQS_SERVER_SECRET" in capsys.readouterr().err
    monkeypatch.setenv("JOBQ_SQS_SERVER_SECRET", SERVER_SECRET)
    assert jobq(args) == 0
    out = capsys.readouterr()
    key, access, secret = out.out.splitlines()
    assert key.startswith("jobq_") and access.startswith("AWS_ACCESS_KEY_ID=JOBQ")
    assert secret.startswith("AWS_SECRET_ACCESS_KEY=")
    assert key not in out.err and secret.partition("=")[2] not in out.err
    pair = (access.partition("=")[2], secret.partition("=")[2])
    assert verify(signed_server, sign(signed_server, pair)).name == "mailer"

    assert jobq(["keys", "sqs", "--database-url", database_url, "mailer"]) == 0  # again, derived again
    assert capsys.readouterr().out.splitlines() == [access, secret]
    assert jobq(["keys", "sqs", "--database-url", database_url, "nobody"]) == 1
    assert jobq(["keys", "create", "--database-url", database_url, "--name", "plain", "--scope", "consume"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1  # without --sqs: the key alone, as before
