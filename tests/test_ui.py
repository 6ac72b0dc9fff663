"""The dashboard at /ui: how it is served (headers, open routes, no file outside app/http/ui/ reachable), and
what an operator does with it in a real browser (Debian's Chromium driven by Playwright)."""

from __future__ import annotations

import http.client
import os
import re
import struct
import zlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.support import LiveServer, problem
from tests.test_operations import flush
from tests.test_security import create_key

# The dashboard in a browser: what it checks is the page's, not the major's.
# CI runs this file on its first major only (JOBQ_SKIP_ONE_MAJOR).
pytestmark = pytest.mark.one_major

ROOT = Path(__file__).parent.parent
UI = ROOT / "app" / "http" / "ui"
CHROMIUM = Path("/usr/bin/chromium")
XSS = "<img src=x onerror=alert(1)>"
FILES = {
    "/ui": ("index.html", "text/html; charset=utf-8"),
    "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/ui/app.css": ("app.css", "text/css; charset=utf-8"),
}


def csp_directives(response: httpx.Response) -> dict[str, str]:
    policy = response.headers["content-security-policy"]
    return {d.split()[0]: d.strip() for d in policy.split(";") if d.strip()}


# --- HTTP -----------------------------------------------------------------------------------------------------


def test_dashboard_page_is_served_with_strict_headers(server: LiveServer) -> None:
    r = server.client.get("/ui")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert r.content == (UI / "index.html").read_bytes()
    csp = csp_directives(r)
    assert csp["default-src"] == "default-src 'self'"
    assert csp["script-src"] == "script-src 'self'"  # no inline script, no eval
    assert csp["frame-ancestors"] == "frame-ancestors 'none'"
    assert csp["object-src"] == "object-src 'none'"
    assert "unsafe" not in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["referrer-policy"] == "no-referrer"
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["cache-control"] == "no-cache"
    # The page itself runs nothing inline: its only scripts are files of this origin.
    assert re.findall(r"<script\b[^>]*>", r.text) == ['<script src="ui/app.js" defer>']
    assert not re.search(r"\son[a-z]+\s*=", r.text), "inline event handler"
    assert "http://" not in r.text and "https://" not in r.text  # nothing from another host

    again = server.client.get("/ui", headers={"if-none-match": r.headers["etag"]})
    assert (again.status_code, again.content) == (304, b"")
    assert again.headers["content-security-policy"] == r.headers["content-security-policy"]


def test_dashboard_files_have_their_content_types(server: LiveServer) -> None:
    for path, (name, media_type) in FILES.items():
        r = server.client.get(path)
        assert r.status_code == 200, path
        assert r.headers["content-type"] == media_type
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.content == (UI / name).read_bytes()
        assert r.headers["etag"]
    script = (UI / "app.js").read_text()
    assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function", script)


def test_dashboard_needs_no_key_while_the_api_does(server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    server: LiveServer = server_factory(auth="on")
    produce = create_key(db, "producer", ["produce"])
    for path in FILES:
        assert server.client.get(path).status_code == 200, path
        # A bad key changes nothing on an open path (the layer only refuses it where a key is needed).
        assert server.client.get(path, headers={"authorization": "Bearer nonsense"}).status_code == 200
    problem(server.client.get("/queues"), 401, "unauthorized")
    problem(server.client.get("/queues", headers={"authorization": f"Bearer {produce}"}), 403, "forbidden")
    # Paths under /ui that are not the dashboard's files are not open.
    problem(server.client.get("/ui/settings.py"), 401, "unauthorized")
    assert "/ui" not in server.client.get("/openapi.json").text


def test_unknown_dashboard_path_is_a_404_problem(server: LiveServer) -> None:
    for path in ("/ui/nope.js", "/ui/index.html", "/ui/app.js/x", "/ui/APP.JS", "/ui/app.css.map"):
        problem(server.client.get(path), 404, "not-found")


def raw_get(server: LiveServer, path: str) -> tuple[int, bytes]:
    """GET with the path exactly as written: httpx would resolve `..` and re-encode before sending."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("GET", path, skip_accept_encoding=True)
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_no_path_under_ui_reaches_another_file(server: LiveServer) -> None:
    settings_py = (ROOT / "app" / "settings.py").read_bytes()
    secrets = [settings_py[:200], b"class Settings", b"root:x:0:0"]
    paths = [
        "/ui/../app/settings.py",
        "/ui/%2e%2e/app/settings.py",
        "/ui/%2E%2E%2Fapp%2Fsettings.py",
        "/ui/..%2fapp%2fsettings.py",
        "/ui/..%5capp%5csettings.py",
        "/ui/%252e%252e/app/settings.py",
        "/ui/app.js/../../app/settings.py",
        "/ui/..%2f..%2f..%2f..%2fetc%2fpasswd",
        "/ui/%2e%2e/%2e%2e/dashboard.py",
        "/ui//app/settings.py",
        "/ui/./../settings.py",
    ]
    for path in paths:
        status, body = raw_get(server, path)
        assert status in (400, 404), (path, status)
        assert not any(s in body for s in secrets), path
    assert raw_get(server, "/ui/./app.js")[0] in (400, 404)  # even a harmless dot segment is not resolved


# --- a real browser -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        if os.environ.get("JOBQ_REQUIRE_BROWSER"):
            pytest.fail(f"JOBQ_REQUIRE_BROWSER is set but {CHROMIUM} is missing (apt-get install chromium)")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium; set JOBQ_REQUIRE_BROWSER to insist)")
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=30_000)  # a noisy 2-core machine: wait generously, never assert timing
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


class Page:
    """A browser tab on the dashboard that records what must never happen: a dialog (alert, confirm),
    an uncaught error, or a Content-Security-Policy / Trusted Types violation."""

    def __init__(self, browser: Any, url: str) -> None:
        self.context = browser.new_context()
        self.page = self.context.new_page()
        self.page.set_default_timeout(30_000)
        self.dialogs: list[str] = []
        self.errors: list[str] = []

        def on_dialog(dialog: Any) -> None:
            self.dialogs.append(dialog.message)
            dialog.dismiss()

        def on_console(message: Any) -> None:
            if re.search(r"Content Security Policy|Trusted Type", message.text):
                self.errors.append(message.text)

        self.page.on("dialog", on_dialog)
        self.page.on("pageerror", lambda err: self.errors.append(str(err)))
        self.page.on("console", on_console)
        self.page.goto(url + "/ui")

    def close(self) -> None:
        self.context.close()
        assert self.dialogs == [], self.dialogs
        assert self.errors == [], self.errors


def fail_for_good(server: LiveServer, queue: str, error: str, headers: dict[str, str] | None = None) -> int:
    claim = server.client.post(f"/queues/{queue}/claim", json={"worker": "w"}, headers=headers).json()["jobs"][0]
    body = {"claim_token": claim["claim_token"], "error": error, "retry": False}
    r = server.client.post(f"/jobs/{claim['id']}/fail", json=body, headers=headers)
    assert r.json()["status"] == "failed", r.text
    return int(claim["id"])


def test_dashboard_shows_queues_and_acts_on_them_in_a_browser(browser: Any, server: LiveServer) -> None:
    from playwright.sync_api import expect

    for i in range(3):
        server.enqueue("emails", {"to": i})
    leaving = server.claim_one("emails")  # handed back untried: shown with the window's figures
    body = {"claim_token": leaving["claim_token"]}
    assert server.client.post(f"/jobs/{leaving['id']}/release", json=body).status_code == 200
    flush(server)
    doomed = server.enqueue("reports", {"html": XSS}, priority=10, max_attempts=1)
    server.enqueue("reports", {"n": 1})
    assert fail_for_good(server, "reports", f"boom {XSS}") == doomed["id"]

    tab = Page(browser, server.url)
    page = tab.page
    emails = page.locator('#queues tr[data-queue="emails"]')
    reports = page.locator('#queues tr[data-queue="reports"]')
    expect(emails.locator('[data-col="ready"]')).to_have_text("3")
    expect(reports.locator('[data-col="ready"]')).to_have_text("1")
    expect(reports.locator('[data-col="failed"]')).to_have_text("1")
    expect(emails.locator('[data-col="state"]')).to_have_text("active")

    # Pause and resume a queue; the API confirms each.
    emails.get_by_role("link", name="emails").click()
    expect(page.get_by_role("heading", name="Queue emails")).to_be_visible()
    expect(page.get_by_role("table", name="Jobs by status")).to_contain_text("pending3")
    window = page.get_by_role("table", name=re.compile(r"^Last \d+ minutes$"))
    expect(window).to_contain_text("released untried1")
    expect(window).to_contain_text("retries0")
    page.locator("#pause").click()
    expect(page.locator("#pause")).to_have_text("Resume")
    expect(page.locator("#banner")).to_contain_text("Queue emails paused")
    assert server.client.get("/queues/emails/stats").json()["paused"] is True
    page.locator("#pause").click()
    expect(page.locator("#pause")).to_have_text("Pause")
    assert server.client.get("/queues/emails/stats").json()["paused"] is False

    # A job that failed for good, whose error and payload hold markup: shown as text, retried.
    page.get_by_role("link", name="All queues").click()
    reports.get_by_role("link", name="reports").click()
    page.get_by_role("button", name="failed", exact=True).click()
    row = page.locator(f'#job-list tr[data-job="{doomed["id"]}"]')
    expect(row).to_contain_text(f"boom {XSS}")
    row.get_by_role("link", name=str(doomed["id"])).click()
    expect(page.locator("#last-error")).to_have_text(f"boom {XSS}")
    expect(page.locator("#payload")).to_contain_text(XSS)
    assert page.locator("img").count() == 0
    page.locator("#retry").click()
    expect(page.locator("#banner")).to_contain_text(f"Job {doomed['id']} is pending again")
    assert server.job(doomed["id"])["status"] == "pending"
    expect(page.locator("#retry")).to_be_hidden()

    # Redrive: the dry run's count first, then the real thing after confirming.
    late = server.enqueue("reports", {"n": 2}, priority=100, max_attempts=1)
    second = fail_for_good(server, "reports", "timeout")
    assert second == late["id"]
    page.get_by_role("link", name="Queue reports").click()
    page.locator("#redrive").click()
    expect(page.locator("#confirm")).to_contain_text("1 failed job would go back to pending")
    assert server.job(second)["status"] == "failed"  # nothing moved by the dry run
    page.get_by_role("button", name="Redrive 1 job").click()
    expect(page.locator("#banner")).to_contain_text("1 job sent back to pending")
    assert server.job(second)["status"] == "pending"

    # A refused action shows the problem's detail: cancel a job that finished meanwhile.
    # Keep the page as it was before the job finished: automatic refresh off before the job is shown, so
    # that no refresh that started before the checkbox was cleared can still show the cancelled job.
    pending = server.enqueue("emails", {"to": "late"})
    page.locator("#auto-refresh").uncheck()
    page.goto(f"{server.url}/ui#/jobs/{pending['id']}")
    expect(page.locator("#cancel")).to_be_visible()
    assert server.client.post(f"/jobs/{pending['id']}/cancel", json={}).json()["status"] == "cancelled"
    page.locator("#cancel").click()
    page.get_by_role("button", name="Cancel job", exact=True).click()
    expect(page.locator("#banner")).to_contain_text("(409)")
    expect(page.locator("#retry")).to_be_visible()  # the page reloaded the job after the refusal
    tab.close()


def test_dashboard_shows_a_running_jobs_progress_in_a_browser(browser: Any, server: LiveServer) -> None:
    from playwright.sync_api import expect

    job = server.enqueue("uploads", {"file": "a.bin"})
    claim = server.claim_one("uploads")
    beat = {"claim_token": claim["claim_token"], "progress": {"done": 40, "total": 100, "step": XSS}}
    assert server.client.post(f"/jobs/{job['id']}/heartbeat", json=beat).status_code == 200

    tab = Page(browser, server.url)
    page = tab.page
    page.goto(f"{server.url}/ui#/jobs/{job['id']}")
    expect(page.locator("#progress-bar")).to_have_attribute("value", "40")
    expect(page.locator("#progress")).to_contain_text("40 of 100 (40%)")
    expect(page.locator("#progress-value")).to_contain_text(XSS)  # shown as text, never as markup
    assert page.locator("img").count() == 0
    # Progress that is not {done, total} is shown as JSON alone; a job with none shows no section.
    beat["progress"] = "resizing"
    assert server.client.post(f"/jobs/{job['id']}/heartbeat", json=beat).status_code == 200
    page.reload()
    expect(page.locator("#progress-value")).to_have_text('"resizing"')
    expect(page.locator("#progress-bar")).to_have_count(0)
    other = server.enqueue("uploads", {"file": "b.bin"})
    page.goto(f"{server.url}/ui#/jobs/{other['id']}")
    expect(page.locator("#payload")).to_contain_text("b.bin")
    expect(page.locator("#progress")).to_be_hidden()
    tab.close()


def test_dashboard_configures_a_queues_limits_in_a_browser(browser: Any, server: LiveServer) -> None:
    from playwright.sync_api import expect

    for i in range(3):
        server.enqueue("partners", {"n": i}, group="customer-7")
    server.enqueue("partners", {"n": 9}, group="customer-1042")

    tab = Page(browser, server.url)
    page = tab.page
    page.goto(f"{server.url}/ui#/queues/partners")
    form = page.locator("#queue-config")
    expect(form.get_by_role("table", name="Groups with the most ready jobs")).to_contain_text("customer-7")
    expect(form.get_by_role("table", name="Groups with the most ready jobs")).to_contain_text("3 ready, 0 running")
    page.locator("#auto-refresh").uncheck()  # the form is being edited; keep the page still

    form.get_by_label("concurrency (running jobs)").fill("3")
    form.get_by_label("rate: claims", exact=True).fill("100")
    form.get_by_label("rate: per seconds", exact=True).fill("60")
    form.get_by_label("fair").check()
    page.locator("#config-save").click()
    expect(page.locator("#banner")).to_contain_text("configuration saved")
    config = server.client.get("/queues/partners/config").json()
    assert (config["concurrency"], config["rate"], config["fair"]) == (3, {"limit": 100, "per_seconds": 60}, True)
    assert config["group_concurrency"] is None and config["ordered"] is None

    # A value the API refuses shows its problem, and changes nothing; an emptied field goes back to the global.
    form.get_by_label("concurrency (running jobs)").fill("0")
    page.locator("#config-save").click()
    expect(page.locator("#banner")).to_contain_text("(422)")
    assert server.client.get("/queues/partners/config").json()["concurrency"] == 3
    form.get_by_label("concurrency (running jobs)").fill("")
    page.locator("#config-save").click()
    expect(page.locator("#banner")).to_contain_text("configuration saved")
    config = server.client.get("/queues/partners/config").json()
    assert (config["concurrency"], config["rate"], config["fair"]) == (None, {"limit": 100, "per_seconds": 60}, True)
    tab.close()


def test_dashboard_asks_for_a_key_when_auth_is_on(browser: Any, server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    server: LiveServer = server_factory(auth="on")
    admin = create_key(db, "ops", ["admin"])
    produce = create_key(db, "mailer", ["produce"])
    r = server.client.post(
        "/queues/secret-q/jobs", json={"payload": XSS}, headers={"authorization": f"Bearer {produce}"}
    )
    assert r.status_code == 201, r.text

    tab = Page(browser, server.url)
    page = tab.page
    expect(page.locator("#login")).to_be_visible()
    expect(page.locator("#login-message")).to_contain_text("requires an API key")
    expect(page.locator("#queues")).to_have_count(0)

    page.get_by_label("Admin API key").fill(produce)
    page.get_by_role("button", name="Use key").click()
    expect(page.locator("#banner")).to_contain_text("lacks the `admin` scope")
    expect(page.locator("#login-message")).to_contain_text("lacks the admin scope")

    page.get_by_label("Admin API key").fill("jobq_000000000000_" + "A" * 43)
    page.get_by_role("button", name="Use key").click()
    expect(page.locator("#login-message")).to_contain_text("That key was refused")

    page.get_by_label("Admin API key").fill(admin)
    page.get_by_role("button", name="Use key").click()
    expect(page.locator('#queues tr[data-queue="secret-q"] [data-col="ready"]')).to_have_text("1")
    expect(page.locator("#login")).to_be_hidden()
    # The key lives in this tab's sessionStorage only: not in localStorage, a cookie or the address.
    assert page.evaluate("sessionStorage.getItem('jobq.apiKey')") == admin
    assert page.evaluate("localStorage.length") == 0
    assert tab.context.cookies() == []
    assert admin not in page.url

    page.get_by_role("button", name="Forget key").click()
    expect(page.locator("#login")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('jobq.apiKey')") is None
    tab.close()


# --- charts, search, bulk actions, enqueue -----------------------------------------------------------------


def png_pixels(data: bytes) -> list[tuple[int, int, int]]:
    """The RGB pixels of a PNG as Chromium writes screenshots (8-bit RGB or RGBA, not interlaced)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert (depth, interlace) == (8, 0) and color in (2, 6), (depth, color, interlace)
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    prev, pixels = bytearray(stride), []
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        pixels += [(line[i], line[i + 1], line[i + 2]) for i in range(0, stride, bpp)]
        prev = line
    return pixels


def near(pixel: tuple[int, int, int], colour: tuple[int, int, int]) -> bool:
    return sum(abs(a - b) for a, b in zip(pixel, colour, strict=True)) < 60


COMPLETED_GREEN = (0x2E, 0x8B, 0x57)  # --completed in app.css


def vertices(path_d: str | None) -> int:
    """Points of a chart line: each vertex is an M (a run starts) or an L (it goes on)."""
    return len(re.findall(r"[ML]", path_d or ""))


@pytest.mark.slow  # a real browser: charts are drawn by the page's script, so only a browser can check them
def test_dashboard_charts_draw_the_history_in_a_browser(
    browser: Any, server: LiveServer, db: psycopg.Connection
) -> None:
    from playwright.sync_api import expect

    server.enqueue("charted", {"n": 1})
    now = db.execute("SELECT date_trunc('minute', now())").fetchone()[0]  # type: ignore[index]
    completions = [now - timedelta(minutes=m) for m in (50, 40, 30, 20, 10)]  # a known series: five minutes
    for i, minute in enumerate(completions):
        durations = [0] * 19
        durations[4 + i % 3] = 20 + 10 * i
        db.execute(
            "INSERT INTO jobq.queue_stats (queue_name, minute, completed, durations_ms, duration_max_ms)"
            " VALUES ('charted', %s, %s, %s, 1000)",
            (minute, 20 + 10 * i, durations),
        )

    tab = Page(browser, server.url)
    page = tab.page
    # The overview: a sparkline per queue, a vertex per minute of the last hour.
    spark = page.locator('#queues tr[data-queue="charted"] svg.sparkline path[data-series="completed"]')
    expect(spark).to_have_count(1)
    assert vertices(spark.get_attribute("d")) == 60
    expect(page.locator("#chart-throughput")).to_be_visible()  # every queue's history

    page.locator('#queues tr[data-queue="charted"]').get_by_role("link", name="charted").click()
    throughput = page.locator("#chart-throughput")
    p95 = page.locator('#chart-durations path[data-series="p95_ms"]')
    expect(p95).to_have_attribute("d", re.compile(r"M"))
    assert vertices(p95.get_attribute("d")) == 5  # one per minute with completions, gaps elsewhere
    completed = throughput.locator('path[data-series="completed"]')
    assert vertices(completed.get_attribute("d")) == 60

    # The view is whole: the charts are drawn as soon as their history arrives, and the stats tables
    # above them come a moment later (with the jobs, in one task) and push them down, so a screenshot
    # taken before could catch another region.
    expect(page.locator("#stats table").first).to_be_visible()

    # Not blank: the completed line is drawn in its colour.
    pixels = png_pixels(throughput.screenshot())
    assert sum(near(p, COMPLETED_GREEN) for p in pixels) >= 50
    assert len(set(pixels)) > 5

    # Hovering shows a bucket's values; a week is drawn by the hour.
    box = throughput.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    expect(page.locator('[data-chart="throughput"] .when')).not_to_have_text("latest")
    page.get_by_role("button", name="last week").click()
    expect(throughput).to_have_attribute("data-buckets", "168")
    assert vertices(page.locator('#chart-throughput path[data-series="completed"]').get_attribute("d")) == 168
    tab.close()


@pytest.mark.slow  # a real browser: selection, confirmation and forms live in the page's script
def test_dashboard_searches_acts_in_bulk_and_enqueues_in_a_browser(browser: Any, server: LiveServer) -> None:
    from playwright.sync_api import expect

    dead = []
    for n in range(3):
        server.enqueue("reports", {"batch": 7, "n": n}, max_attempts=1)
        dead.append(fail_for_good(server, "reports", f"timeout {XSS}"))
    other = server.enqueue("reports", {"batch": 8}, max_attempts=1)
    assert fail_for_good(server, "reports", "timeout") == other["id"]

    tab = Page(browser, server.url)
    page = tab.page
    page.get_by_role("link", name="Search", exact=True).click()
    page.get_by_label("Payload contains (JSON)").fill('{"batch": 7}')
    page.get_by_label("Status").select_option("failed")
    page.get_by_role("button", name="Search", exact=True).click()
    results = page.locator("#search-results tbody tr")
    expect(results).to_have_count(3)
    expect(page.locator("#search-summary")).to_contain_text("3 jobs found")
    expect(results.first).to_contain_text(f"timeout {XSS}")  # as text
    assert page.locator("img").count() == 0

    page.get_by_label("Select every job on this page").check()
    expect(page.locator("#search-results-selected")).to_have_text("3 jobs selected")
    page.get_by_role("button", name="Retry selected…").click()
    expect(page.locator("#confirm")).to_contain_text("3 jobs would be retried.")
    assert server.job(dead[0])["status"] == "failed"  # the dry run moved nothing
    page.get_by_role("button", name="Retry 3 jobs").click()
    expect(page.locator("#banner")).to_contain_text("3 jobs retried.")
    assert [server.job(i)["status"] for i in dead] == ["pending"] * 3
    assert server.job(other["id"])["status"] == "failed"
    expect(page.locator("#search-summary")).to_contain_text("0 jobs found")  # the search ran again: none failed

    # Enqueue from the dashboard: a payload with a typo is pointed out before anything is sent.
    page.get_by_role("link", name="Queues", exact=True).click()
    page.get_by_role("button", name="Enqueue a job…").click()
    page.get_by_label("Queue", exact=True).fill("made-here")
    page.get_by_label("Payload (JSON)").fill('{"hello": ')
    page.get_by_role("button", name="Enqueue", exact=True).click()
    expect(page.locator("#banner")).to_contain_text("The payload is not valid JSON")
    page.get_by_label("Payload (JSON)").fill(f'{{"hello": "{XSS}"}}')
    page.get_by_label("Priority").fill("5")
    page.get_by_label("Delay (seconds)").fill("60")
    page.get_by_role("button", name="Enqueue", exact=True).click()
    expect(page.locator("#banner")).to_contain_text("enqueued on made-here")
    made = server.client.post("/jobs/search", json={"queue": "made-here"}).json()["jobs"]
    assert [(j["payload"], j["priority"], j["status"]) for j in made] == [({"hello": XSS}, 5, "pending")]
    assert server.client.get("/queues/made-here/stats").json()["counts"]["scheduled"] == 1  # the delay held

    # Select on a queue's page and cancel: the retried jobs are pending again.
    page.locator('#queues tr[data-queue="reports"]').get_by_role("link", name="reports").click()
    page.get_by_role("button", name="pending", exact=True).click()
    rows = page.locator("#job-list tbody tr")
    expect(rows).to_have_count(3)
    rows.nth(0).get_by_role("checkbox").check()
    rows.nth(1).get_by_role("checkbox").check()
    page.get_by_role("button", name="Cancel selected…").click()
    page.get_by_role("button", name="Cancel 2 jobs").click()
    expect(page.locator("#banner")).to_contain_text("2 jobs cancelled.")
    expect(rows).to_have_count(1)
    assert sorted(server.job(i)["status"] for i in dead) == ["cancelled", "cancelled", "pending"]


# --- schedules ---------------------------------------------------------------------------------------------------


def test_dashboard_shows_each_schedule_with_its_next_run(browser: Any, server_factory, db: psycopg.Connection) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import expect

    from tests.test_schedules import put, run_scheduler

    quiet: LiveServer = server_factory(schedule_interval_seconds=0, schedule_grace_seconds=3600)
    nightly = put(quiet, "nightly", {"queue": "reports", "cron": "0 3 * * *", "timezone": "Asia/Tokyo", "payload": 1})
    put(quiet, "weekly", {"queue": "mail", "cron": "@weekly", "payload": None, "paused": True})
    tab = Page(browser, quiet.url)
    page = tab.page
    row = page.locator('#schedules tr[data-schedule="nightly"]')
    expect(row).to_contain_text("reports")
    expect(row).to_contain_text("0 3 * * *")
    expect(row).to_contain_text("Asia/Tokyo")
    expect(row.locator('[data-col="next"] time')).to_have_attribute("datetime", nightly["next_run_at"])
    expect(row.locator('[data-col="state"]')).to_have_text("active")
    weekly = page.locator('#schedules tr[data-schedule="weekly"]')
    expect(weekly.locator('[data-col="state"]')).to_have_text("paused")
    expect(weekly.locator('[data-col="next"]')).to_have_text("—")  # paused: no next run
    # Paused through the API: the next refresh shows it.
    quiet.client.post("/schedules/nightly/pause")
    expect(row.locator('[data-col="state"]')).to_have_text("paused")

    # A job a schedule made names the schedule and its tick.
    put(quiet, "hourly", {"queue": "reports", "cron": "0 * * * *", "payload": 2})
    tick = db.execute("SELECT date_trunc('hour', now())").fetchone()[0]  # type: ignore[index]
    db.execute("UPDATE jobq.schedules SET next_run_at = %s WHERE name = 'hourly'", (tick,))
    assert run_scheduler(quiet).enqueued == 1
    job_id = db.execute("SELECT id FROM jobq.jobs WHERE schedule = 'hourly'").fetchone()[0]  # type: ignore[index]
    page.goto(f"{quiet.url}/ui#/jobs/{job_id}")
    expect(page.locator('[data-field="schedule"]')).to_have_text("hourly")
    expect(page.locator('[data-field="scheduled for"] time')).to_have_attribute(
        "datetime", quiet.job(job_id)["scheduled_for"]
    )
    tab.close()


def test_dashboard_shows_a_waiting_job_and_its_dependencies_in_a_browser(browser: Any, server: LiveServer) -> None:
    from playwright.sync_api import expect

    parent = server.enqueue("etl", {"step": "extract"})
    child = server.enqueue("etl", {"step": "load"}, depends_on=[parent["id"]])
    tab = Page(browser, server.url)
    page = tab.page
    etl = page.locator('#queues tr[data-queue="etl"]')
    expect(etl.locator('[data-col="waiting"]')).to_have_text("1")
    etl.get_by_role("link", name="etl").click()
    expect(page.get_by_role("table", name="Jobs by status")).to_contain_text("waiting1")
    page.get_by_role("button", name="waiting", exact=True).click()
    row = page.locator(f'#job-list tr[data-job="{child["id"]}"]')
    expect(row).to_contain_text("waiting")
    row.get_by_role("link", name=str(child["id"])).click()
    expect(page.locator('[data-field="status"]')).to_have_text("waiting")
    expect(page.locator('[data-field="waiting for"]')).to_have_text("1 of them")
    expect(page.locator('[data-field="if one fails"]')).to_have_text("cancel")
    expect(page.locator("#cancel")).to_be_visible()  # a waiting job can be cancelled
    page.locator('[data-field="depends on"]').get_by_role("link", name=str(parent["id"])).click()
    expect(page.locator('[data-field="status"]')).to_have_text("pending")
    tab.close()


def test_dashboard_shows_a_unique_jobs_key_and_window_in_a_browser(browser: Any, server: LiveServer) -> None:
    from playwright.sync_api import expect

    job = server.enqueue("digests", {"customer": 7}, unique={"key": "digest-7", "for_seconds": 3600})
    tab = Page(browser, server.url)
    page = tab.page
    page.goto(f"{server.url}/ui#/jobs/{job['id']}")
    expect(page.locator('[data-field="unique key"]')).to_have_text("digest-7")
    expect(page.locator('[data-field="unique while"]')).to_have_text("pending, running, completed")
    expect(page.locator('[data-field="unique window"]')).to_contain_text(" to ")
    tab.close()


def test_dashboard_shows_a_debounced_jobs_key_in_a_browser(browser: Any, server: LiveServer) -> None:
    from playwright.sync_api import expect

    job = server.enqueue("search", {"doc": 9}, debounce={"key": "reindex-9", "seconds": 10, "max_wait_seconds": 60})
    tab = Page(browser, server.url)
    page = tab.page
    page.goto(f"{server.url}/ui#/jobs/{job['id']}")
    expect(page.locator('[data-field="debounce key"]')).to_have_text("reindex-9")
    expect(page.locator('[data-field="debounce"]')).to_have_text("10 s after the latest enqueue")
    expect(page.locator('[data-field="runs by"]')).not_to_be_empty()
    tab.close()


def test_the_api_docs_run_under_a_strict_content_security_policy_in_a_browser(browser: Any, server: LiveServer) -> None:
    """/docs, where an operator pastes a key, had no Content-Security-Policy: a script injected into the page
    could have sent the key anywhere. Swagger UI now starts from a file of this origin, and the policy allows
    no inline script, no eval and no other origin; the page still renders every operation."""
    from playwright.sync_api import expect

    r = server.client.get("/docs")
    csp = csp_directives(r)
    assert csp["script-src"] == "script-src 'self'" and csp["default-src"] == "default-src 'none'"
    assert csp["connect-src"] == "connect-src 'self'" and csp["frame-ancestors"] == "frame-ancestors 'none'"
    assert "unsafe" not in r.headers["content-security-policy"]
    assert re.findall(r"<script\b[^>]*>", r.text) == [
        '<script src="/docs/swagger-ui-bundle.js">',
        '<script src="/docs/init.js">',
    ]
    context = browser.new_context()
    try:
        page = context.new_page()
        violations: list[str] = []
        page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
        page.on("pageerror", lambda err: violations.append(str(err)))
        page.goto(server.url + "/docs")
        expect(page.locator("#operations-producers-enqueueJob")).to_be_visible()
        page.locator("#operations-producers-enqueueJob").click()  # expands: examples, schemas
        expect(page.locator("#operations-producers-enqueueJob")).to_contain_text("Request body")
        assert violations == []
    finally:
        context.close()


def test_dashboard_pages_the_queues_and_asks_only_for_what_it_shows_in_a_browser(
    browser: Any, server: LiveServer
) -> None:
    """With thousands of queues the dashboard fetched every queue and 2.2 MB of sparklines every 3 s. It now
    shows a page of 50 queues, asks GET /queues for that page and /stats/sparklines for those queues only,
    pages on with the listing's cursor, and stops refreshing while its tab is hidden (refreshing at once when
    shown again)."""
    from urllib.parse import parse_qs, urlsplit

    from playwright.sync_api import expect

    names = [f"q{i:03}" for i in range(55)]
    for name in names:
        server.enqueue(name, 1)
    tab = Page(browser, server.url)
    page = tab.page
    asked: list[str] = []
    page.on("request", lambda request: asked.append(request.url))
    page.reload()
    rows = page.locator("#queues tbody tr")
    expect(rows).to_have_count(50)
    expect(rows.first).to_have_attribute("data-queue", "q000")
    expect(rows.last).to_have_attribute("data-queue", "q049")
    page.locator("#queues-next").click()
    expect(rows).to_have_count(5)
    expect(rows.first).to_have_attribute("data-queue", "q050")
    expect(page.locator("#queues-next")).to_be_disabled()
    page.locator("#queues-prev").click()
    expect(rows.first).to_have_attribute("data-queue", "q000")
    listings = [parse_qs(urlsplit(u).query) for u in asked if urlsplit(u).path == "/queues"]
    sparklines = [parse_qs(urlsplit(u).query) for u in asked if urlsplit(u).path == "/stats/sparklines"]
    assert listings and all(q["limit"] == ["50"] for q in listings), listings
    assert sparklines and all(q.get("queue") in (names[:50], names[50:]) for q in sparklines), sparklines

    def set_visibility(state: str) -> None:
        page.evaluate(
            """state => {
                Object.defineProperty(document, "visibilityState", { configurable: true, get: () => state });
                document.dispatchEvent(new Event("visibilitychange"));
            }""",
            state,
        )

    expect(page.locator("body")).to_have_attribute("data-refresh", re.compile(r"^[0-9]+$"))
    set_visibility("hidden")
    expect(page.locator("body")).to_have_attribute("data-refresh", "paused")
    server.enqueue("q000", 2)
    with page.expect_request(lambda r: urlsplit(r.url).path == "/queues"):
        set_visibility("visible")  # refreshed at once
    expect(rows.first.locator('[data-col="ready"]')).to_have_text("2")
    expect(page.locator("body")).to_have_attribute("data-refresh", re.compile(r"^[0-9]+$"))
    tab.close()


def test_dashboard_lists_live_and_gone_workers_with_their_jobs_in_a_browser(
    browser: Any, server: LiveServer, db: psycopg.Connection
) -> None:
    from playwright.sync_api import expect

    ua = {"user-agent": f"jobq-client-python/1.2.3 (host=box-{XSS[:4]})"}
    jobs = [server.enqueue("emails", {"n": i}) for i in range(2)]
    claimed = server.client.post("/queues/emails/claim", json={"worker": "alive", "limit": 2}, headers=ua).json()
    assert [j["id"] for j in claimed["jobs"]] == [j["id"] for j in jobs]
    server.enqueue("reports")
    gone = server.client.post("/queues/reports/claim", json={"worker": XSS}, headers=ua).json()["jobs"][0]
    server.run(server.services.maintenance["workers"].run_once)
    # The second worker vanished: not seen for an hour, and its lease lapsed.
    db.execute("UPDATE jobq.workers SET last_seen = now() - interval '1 hour' WHERE name = %s", (XSS,))
    db.execute("UPDATE jobq.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (gone["id"],))

    tab = Page(browser, server.url)
    page = tab.page
    page.click("nav >> text=Workers")
    live = page.locator('#live-workers tr[data-worker="alive"]')
    expect(live.locator('[data-col="queues"]')).to_have_text("emails")
    expect(live.locator('[data-col="sdk"]')).to_have_text("jobq-client-python 1.2.3")
    expect(live.locator('[data-col="jobs"]')).to_have_text(f"{jobs[0]['id']}, {jobs[1]['id']}")
    expect(page.locator("#gone-workers tbody tr")).to_have_count(1)
    expect(page.locator("#gone-workers tbody tr td").first).to_have_text(XSS)  # text, never markup
    assert page.locator("img").count() == 0
    # A held job's link leads to the job.
    live.locator('[data-col="jobs"] a').first.click()
    expect(page.locator("#payload")).to_contain_text('"n": 0')
    tab.close()


def test_dashboard_job_page_says_why_a_job_is_not_running_in_a_browser(browser: Any, server: LiveServer) -> None:
    from playwright.sync_api import expect

    assert server.client.patch("/queues/emails/config", json={"concurrency": 1}).status_code == 200
    first = server.enqueue("emails", {"n": 1})
    assert server.claim_one("emails")["id"] == first["id"]
    waiting = server.enqueue("emails", {"n": 2}, group=XSS, timeout_seconds=90)

    tab = Page(browser, server.url)
    page = tab.page
    page.goto(f"{server.url}/ui#/jobs/{waiting['id']}")
    reason = page.locator('#explain li[data-kind="concurrency"]')
    expect(reason).to_contain_text("The queue's concurrency (1) is full, held by")
    expect(page.locator('[data-field="timeout"]')).to_have_text("90 s")
    # The job holding the place is a link.
    reason.locator("a").click()
    expect(page.locator("#payload")).to_contain_text('"n": 1')
    expect(page.locator("#explain")).to_be_hidden()  # running: no explanation
    page.goto(f"{server.url}/ui#/jobs/{waiting['id']}")
    expect(reason).to_be_visible()
    assert server.client.patch("/queues/emails/config", json={"concurrency": None}).status_code == 200
    page.reload()
    expect(page.locator('#explain [data-kind="runnable"]')).to_be_visible()
    assert page.locator("img").count() == 0
    tab.close()
