"""``delay=`` (the delay before the first attempt) in share mode on a real Apache Kafka 4.4
broker, run as users run it (``python -m retryd worker``): a record waits in hand until its
timestamp plus the delay, under its record lock (``retryd.share.delay``), and a delay the lock
cannot hold with a call is refused at start-up. Set up as ``test_share_mode`` sets up: a
15 s lock, the broker's minimum."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.test_share_mode import (
    _exit,
    calls,
    left_in_group,
    share_deployment,
    spawn,
)
from tests.integration.worker_support import stop_process
from tests.support import ON_TANSU, broker_older_than, read_topic, wait_for

pytestmark = pytest.mark.skipif(
    ON_TANSU or broker_older_than(4, 2),
    reason="share groups (KIP-932) need Apache Kafka 4.2 or newer",
)

DELAY_MS = 3_000


def test_no_call_before_the_timestamp_plus_the_delay(bootstrap: str, tmp_path: Path) -> None:
    # 3 s + handler_timeout_s 2 s + 2 s fits in the 15 s lock
    d = share_deployment(bootstrap, tmp_path, sequence="1s, delay=3s")
    log = tmp_path / "calls.jsonl"
    worker = spawn(d, log)
    try:
        ids = [f"d{i}" for i in range(6)]
        d.send([{"id": i} for i in ids[:3]])  # while the worker joins
        d.send([{"id": i} for i in ids[3:]] + [{"id": "again", "mode": "fail_k", "k": 1}])
        wait_for(
            lambda: all(calls(log, i) for i in ids) and len(calls(log, "again")) == 2,
            60,
            what="every record called, and the failed one back from its tier",
        )
        written = {
            json.loads(r.value or b"{}")["id"]: r.timestamp
            for r in read_topic(bootstrap, d.main, expect=7)
        }
        for ident in [*ids, "again"]:
            first = calls(log, ident)[0]
            assert first["topic"] == d.main
            assert first["called_ms"] >= written[ident] + DELAY_MS, (ident, first, written)
        retry = calls(log, "again")[1]
        assert retry["topic"] == d.tier("1s")  # the delay is the first attempt's only
        assert retry["called_ms"] >= retry["retry_timestamp"]
    finally:
        assert stop_process(worker) == 0
    assert left_in_group(d, "sentinel") == []  # held, not released: every record acknowledged


def test_a_delay_the_lock_cannot_hold_is_refused(bootstrap: str, tmp_path: Path) -> None:
    d = share_deployment(bootstrap, tmp_path)
    # 12 s + handler_timeout_s 2 s + 2 s is not below the 15 s lock
    code, text = _exit(d, tmp_path, "delay", RETRYD_RETRY_SEQUENCE="1s, delay=12s")
    assert code == 4, text
    assert (
        "retry_sequence delay=12s: in share mode a record waits for its first attempt under its "
        "record lock, so the delay plus a whole call (2s) plus 2s must stay below share group "
        f"{d.settings.share_group_id}'s share.record.lock.duration.ms=15000 (the delay must "
        "stay below 11s)"
    ) in text
