"""Pure logic of the sidecar's bounds: metric label values, route groups, reserved replay
targets, the shared rate ceiling, the shutdown fence."""

from __future__ import annotations

import threading

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from retryd.api.limits import route_group
from retryd.metrics.http import method_label, sanitize, status_label
from retryd.replay.errors import ShuttingDown
from retryd.replay.fence import Fence
from retryd.replay.ratelimit import SharedRateLimit
from retryd.replay.replayer import TargetPolicy, effective_delivery_timeout_s


def test_label_values_come_from_bounded_sets() -> None:
    assert method_label("get") == "GET" and method_label("PROPFIND") == "other"
    assert method_label("X" * 1000) == "other"
    assert status_label(404) == "404" and status_label(418) == "4xx"
    assert status_label(299) == "2xx" and status_label(999) == "other"
    fam = Metric("retryd_http_requests", "doc", "counter")
    fam.samples = [
        Sample("retryd_http_requests_total", {"method": "GET", "route": "/a", "status": "200"}, 1),
        Sample("retryd_http_requests_total", {"method": "M1", "route": "/a", "status": "200"}, 1),
        Sample("retryd_http_requests_total", {"method": "GET", "route": "/x1", "status": "200"}, 1),
        Sample("retryd_http_requests_total", {"method": "GET", "route": "/a", "status": "299"}, 1),
    ]
    (kept,) = sanitize([fam], frozenset({"/a"}))
    assert [s.labels for s in kept.samples] == [{"method": "GET", "route": "/a", "status": "200"}]


@pytest.mark.parametrize(
    ("method", "path", "group"),
    [
        ("GET", "/v1/failed", "browse"),
        ("GET", "/v1/failed/0/12", "browse"),
        ("POST", "/v1/failed/0/12/replay", "replay"),
        ("POST", "/v1/replays", "replay"),
        ("GET", "/v1/replays", None),
        ("DELETE", "/v1/replays/job-1", None),
        ("GET", "/metrics", "metrics"),
        ("GET", "/healthz", None),
        ("GET", "/readyz", None),
        ("PUT", "/v1/failed", None),
    ],
)
def test_route_groups(method: str, path: str, group: str | None) -> None:
    assert route_group(method, path) == group


def test_reserved_targets_are_refused_whatever_the_allow_list() -> None:
    policy = TargetPolicy(
        {},
        ["orders", "failed", "ledger", "__consumer_offsets"],
        reserved={"failed": "this deployment's failed_topic", "ledger": "the replay ledger"},
    )
    assert policy.allowed == {"orders"}
    assert policy.refusal("orders") is None
    assert "failed_topic" in (policy.refusal("failed") or "")
    assert "Kafka-internal" in (policy.refusal("__transaction_state") or "")
    policy.require_allowed("orders")


def test_delivery_timeout_is_read_from_the_config() -> None:
    assert effective_delivery_timeout_s({"message.timeout.ms": "15000"}) == 15
    assert effective_delivery_timeout_s({"delivery.timeout.ms": 2000}) == 2
    assert effective_delivery_timeout_s({}) == 300


def test_shared_rate_limit_serves_many_threads_at_one_rate() -> None:
    now = [0.0]
    limit = SharedRateLimit(100, clock=lambda: now[0])
    taken = 0
    while taken < 1000:
        wait = limit.try_take()
        if wait:
            now[0] += wait
        else:
            taken += 1
    assert now[0] == pytest.approx(10.0, rel=1e-6)


def test_fence_waits_for_work_in_progress_and_refuses_new_work() -> None:
    fence = Fence()
    entered, release = threading.Event(), threading.Event()

    def work() -> None:
        with fence.enter("replay"):
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=work)
    thread.start()
    assert entered.wait(10)
    assert fence.close(0.05) == 1  # still running: close reports it
    with pytest.raises(ShuttingDown), fence.enter("replay"):
        pass
    release.set()
    thread.join(10)
    assert fence.close(1) == 0
