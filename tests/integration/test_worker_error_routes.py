"""Error routes end to end on a real broker: Python (def and async def) and HTTP handlers whose
failures take different sequences or go straight to a named dead-letter topic, and a worker
that refuses to start without a route's dead-letter topic."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from retryd.errors import KafkaSetupError
from retryd.handlers.loader import load_handler
from retryd.policy import headers as h
from retryd.worker.assembly import build_worker
from tests.integration import route_handlers
from tests.integration.worker_support import deployment
from tests.support import Record, create_topics, http_service, produce, read_topic, unique

MODULE = "python:tests.integration.route_handlers"


def _by_key(records: list[Record]) -> dict[bytes | None, Record]:
    return {r.key: r for r in records}


@pytest.mark.parametrize("handler", ["sync_handler", "async_handler"])
def test_python_failures_take_their_class_routes(
    bootstrap: str, tmp_path: Path, handler: str
) -> None:
    dlt = unique("declined")
    create_topics(bootstrap, [dlt], 1)
    route_handlers.CALLS.clear()
    dep = deployment(
        bootstrap,
        tmp_path,
        sequence="2s",
        handler=f"{MODULE}:{handler}",
        # retry_2s is shared by retry_sequence and the RateLimited route
        error_routes={"RateLimited": "1s,1s,2s", "Declined": f"dlt:{dlt}"},
    )
    assert dep.settings.plan.tier_topics == [dep.tier("2s"), dep.tier("1s")]
    specs = {
        "rl": {"raise": ["RateLimited"] * 3},  # its route's 3 retries, then success
        "slow": {"always": "SlowDown"},  # a subclass: the base's route, then exhausted
        "dec": {"raise": ["Declined"]},  # straight to the named DLT
        "switch": {"raise": ["RateLimited", "Declined"]},  # switches route in a tier
        "plain": {"always": "RuntimeError"},  # no route: retry_sequence
    }
    produce(
        bootstrap,
        dep.main,
        [(k.encode(), json.dumps({"id": k, **v}).encode()) for k, v in specs.items()],
    )

    summary = dep.run()

    def retries(ident: str) -> list[tuple[int, str]]:
        return [(n, topic) for i, n, topic in route_handlers.CALLS if i == ident]

    t1, t2 = dep.tier("1s"), dep.tier("2s")
    assert retries("rl") == [(0, dep.main), (1, t1), (2, t1), (3, t2)]
    assert retries("slow") == [(0, dep.main), (1, t1), (2, t1), (3, t2)]
    assert retries("dec") == [(0, dep.main)]
    assert retries("switch") == [(0, dep.main), (1, t1)]
    assert retries("plain") == [(0, dep.main), (1, t2)]

    failed = _by_key(read_topic(bootstrap, dep.failed, expect=2))
    assert set(failed) == {b"slow", b"plain"}
    slow = failed[b"slow"]
    assert slow.header(h.DEAD_REASON) == b"exhausted" and slow.header(h.RETRY_NUMBER) == b"3"
    assert slow.header(h.ROUTE) == b"RateLimited"
    assert slow.header(h.ERROR_CLASS) == b"tests.integration.route_handlers.SlowDown"
    plain = failed[b"plain"]
    assert plain.header(h.RETRY_NUMBER) == b"1" and plain.header(h.ROUTE) is None

    routed = _by_key(read_topic(bootstrap, dlt, expect=2))
    assert set(routed) == {b"dec", b"switch"}
    for key, retry_number in ((b"dec", b"0"), (b"switch", b"1")):
        rec = routed[key]
        assert rec.header(h.DEAD_REASON) == b"routed"
        assert rec.header(h.ROUTE) == b"Declined"
        assert rec.header(h.RETRY_NUMBER) == retry_number
        assert rec.header(h.ERROR_CLASS) == b"tests.integration.route_handlers.Declined"
        assert rec.header(h.ORIGINAL_TOPIC) == dep.main.encode()
        assert rec.header(h.ORIGINAL_PARTITION) == b"0"
        assert rec.header(h.GROUP) == dep.settings.group_id.encode()
        assert rec.header(h.RETRY_TIMESTAMP) is None
        assert rec.value == json.dumps({"id": key.decode(), **specs[key.decode()]}).encode()

    hops_1s = read_topic(bootstrap, t1, expect=5)
    assert sorted(r.key or b"" for r in hops_1s) == [b"rl", b"rl", b"slow", b"slow", b"switch"]
    assert all(r.header(h.ROUTE) == b"RateLimited" for r in hops_1s)
    hops_2s = _by_key(read_topic(bootstrap, t2, expect=3))
    assert hops_2s[b"rl"].header(h.ROUTE) == b"RateLimited"
    assert hops_2s[b"plain"].header(h.ROUTE) is None
    assert summary.dead_reasons == {"exhausted": 2, "routed": 2}
    assert summary.total("success") == 1


def test_worker_refuses_to_start_without_a_routes_dead_letter_topic(
    bootstrap: str, tmp_path: Path
) -> None:
    missing = unique("never-created")
    dep = deployment(
        bootstrap, tmp_path, handler=f"{MODULE}:sync_handler", error_routes={"E": f"dlt:{missing}"}
    )
    s = dep.settings
    handler = load_handler(s.handler, timeout_s=s.handler_timeout_s)
    with pytest.raises(KafkaSetupError, match=f"missing topics: {missing}"):
        build_worker(s, handler)


# --- HTTP -------------------------------------------------------------------------------------


class _Business(BaseHTTPRequestHandler):
    """Answers by body: ``busy`` 429 for its first two calls; ``locked`` 503 naming
    InventoryLocked; ``down`` 500; ``gone`` 404 naming Declined; ``odd`` 502 with an
    X-Retryd-Error no route could be named by."""

    seen: list[tuple[str, str]] = []  # (body, X-Retryd-Retry-Number)
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        with self.lock:
            self.seen.append((body, self.headers.get("X-Retryd-Retry-Number", "")))
            calls = sum(1 for b, _ in self.seen if b == body)
        status, named = 200, None
        if body == "busy" and calls <= 2:
            status = 429
        elif body == "locked":
            status, named = 503, "InventoryLocked"
        elif body == "down":
            status = 500
        elif body == "gone":
            status, named = 404, "Declined"
        elif body == "odd":
            status, named = 502, "InventoryLocked " + "x" * 300 + "\u00e9"
        self.send_response(status)
        if named is not None:
            self.send_header("X-Retryd-Error", named)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def business() -> Iterator[str]:
    _Business.seen = []
    with http_service(_Business) as url:
        yield url


def test_http_statuses_and_named_classes_take_their_routes(
    bootstrap: str, tmp_path: Path, business: str
) -> None:
    dlt = unique("http-dlt")
    create_topics(bootstrap, [dlt], 1)
    dep = deployment(
        bootstrap,
        tmp_path,
        sequence="2s",
        handler=business,
        error_routes={
            "http_429": "1s,1s",
            "http_5xx": f"dlt:{dlt}",
            "InventoryLocked": "1s",  # named class: wins over http_5xx
            "Declined": f"dlt:{dlt}",  # takes a non-retryable 404 too
        },
    )
    produce(
        bootstrap,
        dep.main,
        [(k.encode(), k.encode()) for k in ("busy", "locked", "down", "gone", "odd")],
    )

    summary = dep.run()

    assert sorted(_Business.seen) == sorted(
        [
            ("busy", "0"),
            ("busy", "1"),
            ("busy", "2"),
            ("locked", "0"),
            ("locked", "1"),
            ("down", "0"),
            ("gone", "0"),
            ("odd", "0"),
        ]
    )
    failed = read_topic(bootstrap, dep.failed, expect=1)
    assert [r.key for r in failed] == [b"locked"]
    assert failed[0].header(h.ROUTE) == b"InventoryLocked"
    assert failed[0].header(h.DEAD_REASON) == b"exhausted"
    assert failed[0].header(h.ERROR_CLASS) == b"http_503"

    routed = _by_key(read_topic(bootstrap, dlt, expect=3))
    assert set(routed) == {b"down", b"gone", b"odd"}
    assert routed[b"down"].header(h.ROUTE) == b"http_5xx"
    assert routed[b"gone"].header(h.ROUTE) == b"Declined"
    assert routed[b"gone"].header(h.ERROR_CLASS) == b"http_404"
    assert routed[b"odd"].header(h.ROUTE) == b"http_5xx"  # the odd header was ignored
    assert all(r.header(h.DEAD_REASON) == b"routed" for r in routed.values())

    hops = read_topic(bootstrap, dep.tier("1s"), expect=3)
    assert sorted((r.key, r.header(h.ROUTE)) for r in hops) == [
        (b"busy", b"http_429"),
        (b"busy", b"http_429"),
        (b"locked", b"InventoryLocked"),
    ]
    assert read_topic(bootstrap, dep.tier("2s")) == []
    assert summary.dead_reasons == {"exhausted": 1, "routed": 3}
    assert summary.total("success") == 1
