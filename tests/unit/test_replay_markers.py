"""Job markers in the replay ledger: their JSON, and that they never pass for entries."""

from __future__ import annotations

from retryd.replay.ledger import MARKER_PREFIX
from retryd.replay.recovery import JobMarker


def test_marker_json_roundtrip() -> None:
    marker = JobMarker("job-1", {"orders": {0: 12, 3: 0}, "payments": {}}, 1_700_000_000_000)
    assert JobMarker.from_json(marker.to_json()) == marker


def test_unreadable_marker_is_none() -> None:
    for raw in (b"", b"{}", b"[]", b'{"job_id": "j", "starts": {"t": {"x": 1}}, "beat_ms": 1}'):
        assert JobMarker.from_json(raw) is None


def test_marker_keys_are_never_record_coordinates() -> None:
    # a coordinate is "<topic>/<partition>/<offset>"; '#' is not allowed in a topic name
    from retryd.policy.sequence import is_topic_name

    assert not is_topic_name(MARKER_PREFIX.split("/")[0])
