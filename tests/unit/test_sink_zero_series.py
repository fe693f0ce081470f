"""A fresh ``PrometheusSink`` exports, at 0, every series a dashboard panel reads before the
first event of its kind: each dead-letter reason, each skip reason, the abandoned-call counter
and each tier's due-lateness histogram. A quiet system's panels then show 0, not "No data"
(the dashboard side is checked on a real Prometheus in
tests/integration/test_dashboard_quiet.py)."""

from __future__ import annotations

from prometheus_client import REGISTRY

from retryd.metrics.sink import PrometheusSink
from retryd.policy.headers import DEAD_REASONS
from retryd.policy.key_order import DEAD_BLOCKED
from retryd.worker.events import SKIP_OTHER_GROUP


def test_series_of_events_not_yet_seen_exist_at_zero() -> None:
    PrometheusSink(["quiet.retry_1s", "quiet.retry_2s"])
    for reason in (*DEAD_REASONS, DEAD_BLOCKED):
        found = REGISTRY.get_sample_value("retryd_dead_letters_total", {"reason": reason})
        assert found is not None, reason
    assert (
        REGISTRY.get_sample_value("retryd_skipped_total", {"reason": SKIP_OTHER_GROUP}) is not None
    )
    assert REGISTRY.get_sample_value("retryd_abandoned_handlers_total") is not None
    for tier in ("quiet.retry_1s", "quiet.retry_2s"):
        count = REGISTRY.get_sample_value("retryd_due_lateness_seconds_count", {"topic": tier})
        assert count is not None, tier
