"""The SigV4 verifier's pure parts (app/auth/sigv4.py) against botocore's own signer: the same canonical request,
the same signature, in both forms; each malformed field refused with IncompleteSignature; the 5-minute window."""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from botocore.auth import SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from app.auth import sigv4
from app.auth.keys import sqs_access_key_id, sqs_secret, sqs_selector

SELECTOR = "0123456789ab"
SECRET = sqs_secret("s" * 40, SELECTOR, 7)
ACCESS_KEY = sqs_access_key_id(SELECTOR)
BODY = b'{"QueueUrl": "http://127.0.0.1:8000/000000000000/q", "MessageBody": "h\xc3\xa9 & = + %"}'


def signed(
    url: str = "http://127.0.0.1:8000/",
    body: bytes = BODY,
    headers: dict[str, str] | None = None,
    *,
    query: bool = False,
    region: str = "eu-west-1",
    secret: str = SECRET,
) -> AWSRequest:
    request = AWSRequest(
        method="POST",
        url=url,
        data=body,
        headers={"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.SendMessage",
                 **(headers or {})},
    )  # fmt: skip
    signer = SigV4QueryAuth if query else SigV4Auth
    signer(Credentials(ACCESS_KEY, secret), "sqs", region).add_auth(request)  # type: ignore[no-untyped-call]
    return request


def as_asgi(request: AWSRequest) -> tuple[str, str, list[tuple[bytes, bytes]], bytes]:
    """(raw path, query string, headers, body) as the server receives them."""
    parts = urlsplit(request.url)
    headers = [(name.lower().encode(), value.encode()) for name, value in request.headers.items()]
    headers.append((b"host", parts.netloc.encode()))
    body = request.body if isinstance(request.body, bytes) else (request.body or "").encode()
    return parts.path or "/", parts.query, headers, body


def expected(request: AWSRequest, body: bytes | None = None, secret: str = SECRET) -> tuple[str, str]:
    """(what the verifier computes, what the client sent)."""
    path, query, headers, sent_body = as_asgi(request)
    by_name = sigv4.header_map(headers)
    pairs = sigv4.query_pairs(query)
    sig = sigv4.parse_signature(by_name, pairs)
    assert sig is not None
    canonical = sigv4.canonical_request("POST", path, pairs, by_name, sent_body if body is None else body, sig)
    return sigv4.expected_signature(secret, sig, canonical), sig.signature


def test_the_access_key_id_names_the_selector_and_the_secret_is_derived() -> None:
    assert ACCESS_KEY == "JOBQ0123456789AB" and sqs_selector(ACCESS_KEY) == SELECTOR
    assert sqs_selector("AKIAIOSFODNN7EXAMPLE") is None and sqs_selector("JOBQ0123456789ab") is None
    # The derivation is a contract: changing it would change every pair already handed out.
    mac = hmac.new(b"s" * 40, b"jobq-sqs-v1\x000123456789ab\x007", hashlib.sha256).digest()
    assert base64.urlsafe_b64encode(mac).rstrip(b"=").decode() == SECRET and len(SECRET) == 43
    # Another server secret, selector or key id: another secret.
    assert len({SECRET, sqs_secret("t" * 40, SELECTOR, 7), sqs_secret("s" * 40, "0123456789ac", 7),
                sqs_secret("s" * 40, SELECTOR, 8)}) == 4  # fmt: skip


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/",
        "http://localhost:8000/000000000000/my-queue.fifo",
        "http://127.0.0.1:8000/a//b/./c/../d%20e/",
        "http://127.0.0.1:8000/?Action=SendMessage&MessageBody=a%20b%2Bc&Empty=&Z=1&A=2&A=1",
    ],
)
def test_the_verifier_computes_botocores_signature_in_the_header_form(url: str) -> None:
    ours, theirs = expected(signed(url))
    assert ours == theirs


def test_the_verifier_computes_botocores_signature_in_the_query_form() -> None:
    request = signed("http://127.0.0.1:8000/?Action=ListQueues", body=b"", query=True)
    assert "X-Amz-Signature=" in request.url and "Authorization" not in request.headers
    ours, theirs = expected(request)
    assert ours == theirs


def test_the_date_header_form_and_the_content_sha256_header_are_followed() -> None:
    for extra in ({"Date": "Tue, 01 Dec 2026 20:00:00 GMT"}, {"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"}):
        ours, theirs = expected(signed(headers=extra))
        assert ours == theirs, extra
    # UNSIGNED-PAYLOAD: the body is not covered; a digest that is not the body's is refused.
    ours, theirs = expected(signed(headers={"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"}), body=b"other")
    assert ours == theirs
    with pytest.raises(sigv4.SqsAuthError) as err:
        expected(signed(headers={"X-Amz-Content-SHA256": "0" * 64}))
    assert err.value.code == "SignatureDoesNotMatch"


def test_any_change_to_what_was_signed_changes_the_signature() -> None:
    request = signed()
    assert expected(request, body=BODY + b" ")[0] != expected(request)[1]  # the body
    assert expected(request, secret=SECRET[:-1] + "x")[0] != expected(request)[1]  # the secret
    request.headers.replace_header("X-Amz-Target", "AmazonSQS.DeleteQueue")  # a signed header
    assert expected(request)[0] != expected(request)[1]
    for changed in ("eu-west-2", "us-east-1"):  # the region in the credential
        request = signed()
        request.headers.replace_header("Authorization", request.headers["Authorization"].replace("eu-west-1", changed))
        assert expected(request)[0] != expected(request)[1]


def refused(headers: dict[str, str], query: str = "") -> str:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    with pytest.raises(sigv4.SqsAuthError) as err:
        sigv4.parse_signature(sigv4.header_map(raw), sigv4.query_pairs(query))
    assert err.value.status == 400
    return err.value.code


def test_malformed_signatures_are_incomplete() -> None:
    good = signed().headers
    auth, date = good["Authorization"], good["X-Amz-Date"]
    cases = [
        {"Authorization": auth},  # no date
        {"Authorization": auth, "X-Amz-Date": "2026-12-01T20:00:00Z"},
        {"Authorization": auth.replace("AWS4-HMAC-SHA256", "AWS4-HMAC-SHA512"), "X-Amz-Date": date},
        {"Authorization": auth.replace("Signature=", "Sig="), "X-Amz-Date": date},
        {"Authorization": auth.replace("/aws4_request", ""), "X-Amz-Date": date},
        {"Authorization": auth.replace("SignedHeaders=", "SignedHeaders=host;host;"), "X-Amz-Date": date},
        {"Authorization": auth.replace("SignedHeaders=", "SignedHeaders=HOST;"), "X-Amz-Date": date},
        {"Authorization": auth.replace("host;", ""), "X-Amz-Date": date},  # the Host unsigned
        {"Authorization": auth[:-1], "X-Amz-Date": date},
        {"Authorization": "AWS AKIAIOSFODNN7EXAMPLE:frJIUN8DYpKDtOLCwo//yllqDzg=", "X-Amz-Date": date},
    ]
    assert "host;" in auth
    for headers in cases:
        assert refused(headers) == "IncompleteSignature", headers
    presigned = urlsplit(signed(query=True).url).query
    assert refused({}, presigned.replace("X-Amz-Expires=3600", "X-Amz-Expires=604801")) == "IncompleteSignature"
    assert refused({}, presigned.replace("X-Amz-Algorithm=", "X-Amz-Algorithmus=")) == "IncompleteSignature"
    assert refused({"Authorization": auth, "X-Amz-Date": date}, presigned) == "IncompleteSignature"
    assert sigv4.parse_signature({}, []) is None  # no signature at all: MissingAuthenticationToken, further on


def signature_at(when: datetime.datetime, expires: int | None = None) -> sigv4.Signature:
    stamp = when.strftime("%Y%m%dT%H%M%SZ")
    return sigv4.Signature(ACCESS_KEY, stamp[:8], "eu-west-1", "sqs", stamp, ("host",), "0" * 64, expires)


def expired(sig: sigv4.Signature, now: float) -> Iterator[str]:
    try:
        sigv4.check_time(sig, now)
    except sigv4.SqsAuthError as exc:
        assert exc.status == 400
        yield exc.code


def test_a_request_dated_more_than_five_minutes_off_has_expired() -> None:
    now = time.time()
    at = datetime.datetime.fromtimestamp(now, datetime.UTC)
    for offset, codes in ((0, []), (290, []), (-290, []), (310, ["RequestExpired"]), (-310, ["RequestExpired"])):
        assert list(expired(signature_at(at + datetime.timedelta(seconds=offset)), now)) == codes, offset
    # Presigned: valid for X-Amz-Expires after its date, and not dated ahead.
    assert list(expired(signature_at(at - datetime.timedelta(seconds=3000), 3600), now)) == []
    assert list(expired(signature_at(at - datetime.timedelta(seconds=3700), 3600), now)) == ["RequestExpired"]
    assert list(expired(signature_at(at + datetime.timedelta(seconds=310), 3600), now)) == ["RequestExpired"]


def test_whatever_a_client_sends_is_a_verdict_never_a_crash() -> None:
    """Malformed and mangled signatures end in an SqsAuthError (or a signature that does not match), never in
    another exception, which would be a 500; nor does any refusal echo what the client sent."""
    import random

    good = signed()
    path, query, headers, body = as_asgi(good)
    presigned = urlsplit(signed(query=True).url).query
    bad_credential = "AWS4-HMAC-SHA256 Credential=a/b/c/d/aws4_request, SignedHeaders=host, Signature=" + "g" * 64
    oddities = [
        {"x-amz-date": "20261301T250000Z"}, {"x-amz-date": "2026121T1Z"}, {"x-amz-date": "²⁰²⁶¹²⁰¹T000000Z"},
        {"date": "Mon, 01 Jan 0001 00:00:00 +0100"}, {"date": "not a date"}, {"date": ""},
        {"x-amz-content-sha256": "zz"}, {"authorization": "AWS4-HMAC-SHA256"},
        {"authorization": "AWS4-HMAC-SHA256 ,,,"}, {"authorization": bad_credential},
    ]  # fmt: skip
    queries = [
        presigned.replace("X-Amz-Expires=3600", "X-Amz-Expires=%C2%B2"),
        presigned.replace("X-Amz-Expires=3600", "X-Amz-Expires=99999999999999999999"),
        presigned.replace("X-Amz-Date=", "X-Amz-Date=9"),
        "X-Amz-Credential=%ff%fe",
        "X-Amz-Algorithm=&&&=",
    ]
    rng = random.Random(23)
    auth = dict(headers)[b"authorization"].decode()
    mangled = []
    for _ in range(300):
        chars = list(auth)
        for _ in range(rng.randint(1, 4)):
            chars[rng.randrange(len(chars))] = rng.choice("=,/; ;aZ09\x00é")
        mangled.append({"authorization": "".join(chars)})
    cases = [(h, query) for h in oddities + mangled] + [({}, q) for q in queries]
    for extra, q in cases:
        dropped = {*extra, "x-amz-date"} if "date" in extra else set(extra)  # a Date counts only without X-Amz-Date
        if q is not query:
            dropped.add("authorization")  # the presigned form alone
        raw = [(k, v) for k, v in headers if k.decode() not in dropped]
        raw += [(k.encode(), v.encode("utf-8", "surrogateescape")) for k, v in extra.items()]
        by_name, pairs = sigv4.header_map(raw), sigv4.query_pairs(q)
        try:
            sig = sigv4.parse_signature(by_name, pairs)
            if sig is None:
                continue
            sigv4.check_time(sig, time.time())
            canonical = sigv4.canonical_request("POST", path, pairs, by_name, body, sig)
            sigv4.expected_signature(SECRET, sig, canonical)
        except sigv4.SqsAuthError as exc:
            assert exc.code in {"IncompleteSignature", "RequestExpired", "SignatureDoesNotMatch"}, exc.code
            for value in [*extra.values(), q]:
                assert len(value) < 24 or value not in exc.message
