"""The dead-letter explorer (``/ui`` of the sidecar) in a real browser: headless Debian
chromium driven by Playwright, against real ``retryd sidecar`` processes on the suite's broker.

One browser per session and a fresh context (cookies, storage) per test. Three sidecars start
together once per session:

- ``explorer``: realistic dead letters plus hostile ones (markup, RTL overrides, a 1 MB value,
  bytes that are not UTF-8 in keys, values and headers), a replay token and a read token;
- ``expiring``: the same deployment with a 3 s absolute session lifetime (the expiry test);
- ``showcase``: realistic dead letters only, for the README's screenshots.

Every test's last page is saved as a screenshot under ``RETRYD_TEST_ARTIFACTS`` (default
``test-artifacts/browser/`` in the repository, ignored by git), whether it passed or not, and
every page carries a guard that records dialogs, page errors, console errors and requests that
markup injected by a record could make (``window.__pwned`` is the canary hostile payloads set).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from retryd.policy.headers import Envelope, routed_headers
from tests.integration.sidecar_support import REPO, TOKEN, Env, SidecarProcess
from tests.support import create_topics, unique

READ_TOKEN = "explorer-read-token-0123456789abcdef-xyz"
REPLAY_TOKEN = TOKEN  # RETRYD_API_TOKEN: replay scope
SESSION_MAX_S = 3  # the expiring sidecar's absolute session lifetime
NO_CHROMIUM = "chromium is not installed (apt-get install chromium; scripts/test does)"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
ONE_MB = 1_000_000

# Hostile payloads: each sets the canary or opens a dialog if a page ever runs it.
SCRIPT = "<script>window.__pwned=1;alert(1)</script>"
IMG = '"><img src=x onerror=window.__pwned=1>'
SVG = "'><svg onload=window.__pwned=1>"
RLO = "invoice\u202egnp.exe"  # shows as "invoiceexe.png" if the override acts
NOT_UTF8 = b"\xc3\x28\xa0\xa1\xff\xfe\xed\xa0\x80"  # invalid sequences, a lone surrogate
BINARY = bytes(range(256))


def chromium_path() -> str | None:
    """Debian's chromium (scripts/test installs it); Playwright's own download is not used."""
    found = shutil.which("chromium")
    if found:
        return found
    return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


def artifacts_dir() -> Path:
    path = Path(os.environ.get("RETRYD_TEST_ARTIFACTS") or REPO / "test-artifacts" / "browser")
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- dead letters ------------------------------------------------------------------------------


def dead_letter(
    original_topic: str,
    *,
    error_class: str,
    message: str,
    reason: str = "exhausted",
    partition: int = 0,
    offset: int = 0,
    retries: int = 3,
    age_s: float = 600,
    user: list[tuple[str, bytes | None]] | None = None,
) -> list[tuple[str, bytes | None]]:
    """retryd's headers of a dead letter that failed ``age_s`` ago (recent timestamps, so the
    overview's first/last seen and sparklines look like a live deployment's)."""
    now = int(time.time() * 1000)
    env = Envelope(
        original_topic=original_topic,
        original_partition=partition,
        original_offset=offset,
        original_timestamp=now - int(age_s * 1000) - 60_000,
        retry_number=retries,
        first_failure_timestamp=now - int(age_s * 1000),
        error_class=error_class,
        error_message=message,
        dead_reason=reason,
    )
    return routed_headers(user or [], env)


@dataclass
class DeadLetter:
    """One seeded dead letter: what it carries, when it was dead-lettered (Kafka timestamp),
    and where it landed."""

    name: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp_ms: int = 0  # 0: the producer's clock
    partition: int = -1
    offset: int = -1

    @property
    def coordinates(self) -> tuple[int, int]:
        return self.partition, self.offset


def realistic(env: Env, n: int = 12) -> list[DeadLetter]:
    """Dead letters as a checkout deployment has them over a day: a burst of payment-service
    timeouts two hours ago, inventory 503s and bad payloads spread over the day, a few
    refused orders. Oldest first, as they were written."""
    now = int(time.time() * 1000)
    kinds = [
        ("TimeoutError", "payments-api did not answer within 5000 ms", "exhausted", env.main),
        ("HTTPError", "HTTP 503 from inventory-api for sku {i}", "exhausted", env.main),
        (
            "ValidationError",
            "field 'amount' must be positive, got -{i}",
            "non_retryable",
            env.other,
        ),
        ("JSONDecodeError", "Expecting value: line 1 column {i} (char 0)", "malformed", env.other),
    ]
    out: list[DeadLetter] = []
    for i in range(n):
        error_class, template, reason, topic = kinds[i % len(kinds)]
        # seconds ago: the timeouts within 30 minutes two hours ago, the rest over the day
        age_s = 7200 + (i * 97) % 1800 if i % 4 == 0 else 300 + (i * 7919) % 86_000
        body = (
            b'{"order_id": "ord-%d", "customer": "c-%04d", "amount": %d.50, "currency": "EUR",'
            b' "items": [{"sku": "sku-%d", "qty": %d}]}'
            % (4400 + i, 17 * i, 10 + i, 300 + i, i % 3 + 1)
        )
        headers = dead_letter(
            topic,
            error_class=error_class,
            message=template.format(i=100 + i),
            reason=reason,
            partition=i % 2,
            offset=1000 + i,
            age_s=age_s + 95,
            user=[("content-type", b"application/json"), ("trace-id", b"%032x" % (0xABC0 + i))],
        )
        key = f"ord-{4400 + i}".encode()
        out.append(DeadLetter(key.decode(), key, body, headers, now - age_s * 1000))
    return sorted(out, key=lambda d: d.timestamp_ms)


def hostile(env: Env) -> list[DeadLetter]:
    """Dead letters whose keys, values and headers try to break out of the page."""

    def headers(**kw: Any) -> list[tuple[str, bytes | None]]:
        kw.setdefault("error_class", "HostileContent")
        kw.setdefault("message", "a record that carries markup")
        return dead_letter(env.main, reason="non_retryable", **kw)

    return [
        DeadLetter("script-key", SCRIPT.encode(), b'{"ok": true}', headers()),
        DeadLetter("img-value", b"img", IMG.encode() * 3, headers()),
        DeadLetter(
            "markup-headers",
            b"hdr",
            b"v",
            headers(
                user=[("x-evil", SCRIPT.encode()), (IMG, SVG.encode()), ("x-rlo", RLO.encode())]
            ),
        ),
        DeadLetter(
            "markup-error",
            b"err",
            b"v",
            headers(error_class=f"Evil{IMG}", message=f"{SCRIPT} {SVG} {RLO}"),
        ),
        DeadLetter("rtl-key", RLO.encode(), RLO.encode(), headers()),
        DeadLetter("one-mb", b"big", b"A" * ONE_MB, headers()),
        DeadLetter("long-line", b"long", ("x" * 5000 + IMG).encode(), headers()),
        DeadLetter(
            "not-utf8",
            NOT_UTF8,
            NOT_UTF8 + b"<script>window.__pwned=1</script>" + NOT_UTF8,
            headers(user=[("x-bin", BINARY), ("x-bad", NOT_UTF8), ("x-null", None)]),
        ),
    ]


def produce_dead_letters(bootstrap: str, topic: str, records: list[DeadLetter]) -> None:
    """Raw confluent-kafka (timestamps of the past, messages up to just over 1 MB); fills in
    each record's partition and offset."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "message.max.bytes": 1_048_000}
    )
    errors: list[Any] = []

    def ack(rec: DeadLetter) -> Any:
        def done(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                rec.partition, rec.offset = msg.partition(), msg.offset()

        return done

    for rec in records:
        producer.produce(
            topic,
            key=rec.key,
            value=rec.value,
            headers=rec.headers,
            timestamp=rec.timestamp_ms,
            on_delivery=ack(rec),
        )
        producer.poll(0)
    assert producer.flush(30) == 0 and not errors, errors


# --- sidecars ----------------------------------------------------------------------------------


@dataclass
class Explorer:
    """One running sidecar and what was seeded into its failed topic."""

    sidecar: SidecarProcess
    env: Env
    realistic: list[DeadLetter] = field(default_factory=list)
    hostile: list[DeadLetter] = field(default_factory=list)
    # A third main topic with one dead letter of its own, for a replay no other test counts.
    spare_topic: str = ""

    @property
    def url(self) -> str:
        return self.sidecar.url + "/ui"

    def record(self, name: str) -> DeadLetter:
        return next(d for d in self.realistic + self.hostile if d.name == name)


@pytest.fixture(scope="package")
def sidecars(
    bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Explorer]]:
    """The session's three sidecars, seeded and started concurrently, stopped by PID."""
    if chromium_path() is None:
        pytest.skip(NO_CHROMIUM)
    base = tmp_path_factory.mktemp("explorer")
    tokens = {"RETRYD_API_TOKENS": f"viewer:read:{READ_TOKEN}"}
    main = Env(bootstrap, base / "state")
    spare = unique("spare")
    main.extra = {
        **tokens,
        # One replay a second: a job of two records runs long enough for its page to watch it.
        "RETRYD_REPLAY_MAX_PER_SECOND": "1",
        "RETRYD_MAIN_TOPICS": f"{main.main},{main.other},{spare}",
    }
    main.create(failed_partitions=2)
    create_topics(bootstrap, [spare])
    shown = Env(
        bootstrap,
        base / "showcase-state",
        main=unique("orders"),
        other=unique("payments"),
        group=unique("checkout"),
    )
    shown.create(failed_partitions=2)
    expiring = Env(
        bootstrap, base / "expiring-state", main=main.main, other=main.other, group=main.group
    )
    expiring.extra = {**tokens, "RETRYD_EXPLORER_SESSION_MAX_S": str(SESSION_MAX_S)}

    explorer = Explorer(SidecarProcess(main, base / "explorer.log"), main)
    explorer.realistic = realistic(main)
    explorer.realistic.append(
        DeadLetter(
            "spare-1",
            b"spare-1",
            b'{"order_id": "ord-9001"}',
            dead_letter(spare, error_class="ConnectionError", message="ledger-api refused"),
        )
    )
    explorer.spare_topic = spare
    explorer.hostile = hostile(main)
    produce_dead_letters(bootstrap, main.failed, explorer.realistic + explorer.hostile)
    showcase = Explorer(SidecarProcess(shown, base / "showcase.log"), shown)
    showcase.realistic = realistic(shown, 40)
    produce_dead_letters(bootstrap, shown.failed, showcase.realistic)
    expiry = Explorer(SidecarProcess(expiring, base / "expiring.log"), expiring)

    running = {"explorer": explorer, "showcase": showcase, "expiring": expiry}
    try:
        with ThreadPoolExecutor(3) as pool:
            for fut in [pool.submit(e.sidecar.start, 60) for e in running.values()]:
                fut.result()
        yield running
    finally:
        for e in running.values():
            e.sidecar.stop()


@pytest.fixture(scope="package")
def explorer(sidecars: dict[str, Explorer]) -> Explorer:
    return sidecars["explorer"]


# --- the browser -------------------------------------------------------------------------------


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """One chromium for the browser tests. Package scope, not session: Playwright's sync API
    keeps an asyncio loop running in the main thread while it is open, and a later test's
    ``asyncio.run`` (tests/integration/test_sidecar_liveness.py) would fail on it."""
    path = chromium_path()
    if path is None:
        pytest.skip(NO_CHROMIUM)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


# The canary: hostile payloads assign window.__pwned; the trap records every assignment (so a
# payload that resets it cannot hide), and alert/confirm/prompt are counted besides the
# browser's own dialog events.
TRAP = """
(() => {
  const hits = [];
  Object.defineProperty(window, '__pwnedHits', { value: hits });
  Object.defineProperty(window, '__pwned', {
    configurable: false,
    get() { return undefined; },
    set(v) { hits.push(String(v)); },
  });
})();
"""


@dataclass
class Guard:
    """What a page did that it should not: dialogs, uncaught errors, console errors, requests
    an injected ``<img src=x>`` would make."""

    dialogs: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    stray_requests: list[str] = field(default_factory=list)

    def watch(self, page: Any) -> None:
        def on_dialog(d: Any) -> None:
            self.dialogs.append(f"{d.type}: {d.message}")
            d.dismiss()

        page.on("dialog", on_dialog)
        page.on("pageerror", lambda exc: self.page_errors.append(str(exc)))
        page.on(
            "console",
            lambda m: self.console_errors.append(m.text) if m.type == "error" else None,
        )
        page.on(
            "request",
            lambda r: self.stray_requests.append(r.url) if re.search(r"/x(\?|$)", r.url) else None,
        )

    def pwned(self, page: Any) -> list[str]:
        hits: list[str] = page.evaluate("window.__pwnedHits ? [...window.__pwnedHits] : []")
        return hits

    def assert_inert(self, page: Any) -> None:
        """Nothing a record carried ran, opened or loaded anything."""
        assert self.pwned(page) == [], "a hostile payload ran"
        assert self.dialogs == [], self.dialogs
        assert self.page_errors == [], self.page_errors
        assert self.stray_requests == [], self.stray_requests
        # No console error at all: one from the CSP would mean markup got through escaping
        # (and the policy stopped it), one from a failed load a reference that should not be.
        assert self.console_errors == [], self.console_errors


@dataclass
class Tab:
    """A fresh context's page and its guard."""

    page: Any
    guard: Guard


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def _new_tab(browser: Any, viewport: dict[str, int], **context_opts: Any) -> tuple[Any, Tab]:
    context = browser.new_context(viewport=viewport, **context_opts)
    context.set_default_timeout(15_000)
    context.add_init_script(TRAP)
    page = context.new_page()
    guard = Guard()
    guard.watch(page)
    return context, Tab(page, guard)


def _screenshot(page: Any, request: pytest.FixtureRequest, suffix: str = "") -> None:
    failed = any(
        getattr(getattr(request.node, f"rep_{when}", None), "failed", False)
        for when in ("setup", "call")
    )
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid.split("tests/browser/")[-1])
    path = artifacts_dir() / f"{name}{suffix}{'-FAILED' if failed else ''}.png"
    try:
        page.screenshot(path=str(path), full_page=False)
    except Exception as exc:  # a closed page: the test's own failure says why
        print(f"no screenshot for {request.node.nodeid}: {exc}")


@pytest.fixture
def tab(browser: Any, request: pytest.FixtureRequest) -> Iterator[Tab]:
    """A fresh 1280x800 context; its page is saved as a screenshot at the end, and no page
    error and no dialog may have happened in it."""
    context, t = _new_tab(browser, DESKTOP)
    try:
        yield t
        assert t.guard.page_errors == [], t.guard.page_errors
        assert t.guard.dialogs == [], t.guard.dialogs
    finally:
        _screenshot(t.page, request)
        context.close()


@pytest.fixture
def open_tab(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Opens more contexts (another viewport, CSP bypassed): ``open_tab(viewport, **opts)``;
    each is saved as a screenshot and closed at the end."""
    made: list[tuple[Any, Tab]] = []

    def opener(viewport: dict[str, int] = DESKTOP, **opts: Any) -> Tab:
        made.append(_new_tab(browser, viewport, **opts))
        return made[-1][1]

    try:
        yield opener
    finally:
        for i, (context, t) in enumerate(made):
            _screenshot(t.page, request, f"-{i + 1}")
            context.close()


# --- page helpers ------------------------------------------------------------------------------


def sign_in(page: Any, base: str, token: str, next_path: str | None = None) -> None:
    """Through the sign-in form, as a person does it; ends on the page it lands on."""
    url = f"{base}/login" + (f"?next={next_path}" if next_path else "")
    page.goto(url)
    page.fill("input#token", token)
    with page.expect_navigation():
        page.click("button#sign-in")


def layout_fits(page: Any) -> bool:
    """Nothing overflows the viewport horizontally."""
    fits: bool = page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    return fits
