"""Bad input and misbehaving handlers: the documented outcome, and the worker keeps running."""

from __future__ import annotations

from pathlib import Path

import pytest

from retryd.policy import headers as h
from tests.integration.worker_support import calls_for, deployment
from tests.support import produce, read_topic, wait_for


def test_malformed_tier_messages_are_dead_lettered_and_valid_ones_still_handled(
    bootstrap: str, tmp_path: Path
) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s")
    tier = dep.tier("1s")
    good = [
        (h.RETRY_NUMBER, b"1"),
        (h.RETRY_TIMESTAMP, b"0"),
        (h.ORIGINAL_TOPIC, dep.main.encode()),
        (h.ORIGINAL_PARTITION, b"0"),
        (h.ORIGINAL_OFFSET, b"7"),
    ]
    bad = {
        b"missing": [("user", b"x")],
        b"not-a-number": [(k, b"abc" if k == h.RETRY_NUMBER else v) for k, v in good],
        b"non-utf8": [(k, b"\xff\xfe" if k == h.RETRY_TIMESTAMP else v) for k, v in good],
        b"negative": [(k, b"-5" if k == h.ORIGINAL_OFFSET else v) for k, v in good],
        b"zero-retry": [(k, b"0" if k == h.RETRY_NUMBER else v) for k, v in good],
        b"none-value": [(k, None if k == h.ORIGINAL_TOPIC else v) for k, v in good],
    }
    records: list = [(key, b'{"id": "bad"}', hdrs) for key, hdrs in bad.items()]
    records.append((b"empty", b"", [*good, ("bin", b"\x80\x81")]))  # valid headers, empty value
    records.append((b"tomb", None, good))  # valid headers, null value
    records.append((b"ok", b'{"id": "tier-ok"}', good))
    produce(bootstrap, tier, records)
    dep.send([{"id": "main-ok"}], headers=[("bin", b"\xc3\x28")])

    summary = dep.run()

    dead = read_topic(bootstrap, dep.failed, expect=len(bad))
    assert sorted(r.key for r in dead) == sorted(bad)
    for rec in dead:
        assert rec.header(h.DEAD_REASON) == b"malformed"
        assert rec.header(h.ERROR_CLASS) == b"malformed_headers"
        assert tier.encode() in (rec.header(h.ERROR_MESSAGE) or b"")
        assert rec.value == b'{"id": "bad"}'
    by_key = {r.key: r for r in dead}
    assert by_key[b"missing"].header("user") == b"x"
    assert by_key[b"not-a-number"].header(h.ORIGINAL_OFFSET) == b"7"  # kept what parsed
    assert len(calls_for("tier-ok")) == 1 and len(calls_for("main-ok")) == 1
    assert len([c for c in calls_for(None) if c["topic"] == tier]) == 2  # empty and null values
    assert summary.dead_reasons == {"malformed": len(bad)}
    assert summary.total("success") == 4


def test_raising_base_exception_and_hanging_handlers_are_retried(
    bootstrap: str, tmp_path: Path
) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s", handler_timeout_s=1.0)
    dep.send(
        [
            {"id": "base", "mode": "base_exception"},
            {"id": "hang", "mode": "hang", "seconds": 30},
            {"id": "after", "mode": "ok"},
        ]
    )

    summary = dep.run()

    assert [c["retry_number"] for c in calls_for("base")] == [0, 1]
    assert [c["retry_number"] for c in calls_for("hang")] == [0, 1]
    assert [c["retry_number"] for c in calls_for("after")] == [0]
    hops = read_topic(bootstrap, dep.tier("1s"), expect=2)
    classes = {r.key: r.header(h.ERROR_CLASS) for r in hops}
    assert classes == {b"base": b"tests.integration.handlers.Unusual", b"hang": b"timeout"}
    assert read_topic(bootstrap, dep.failed) == []
    assert summary.total("success") == 3


def _kept_membership(rebalances: dict[str, int]) -> None:
    """Nothing was given back or lost: only assignments, one per member (role ``all`` has a
    main member and a tiers member) plus the empty one a member gets when the other joins."""
    assert set(rebalances) == {"assign"}, rebalances
    assert rebalances["assign"] <= 3, rebalances


def test_tier_wait_of_three_poll_intervals_keeps_membership(bootstrap: str, tmp_path: Path) -> None:
    # 18 s wait = 3 x max.poll.interval.ms (6 s, the smallest librdkafka allows with a 6 s session).
    dep = deployment(bootstrap, tmp_path, sequence="18s", max_poll_interval_ms=6000)
    dep.send([{"id": "wait", "mode": "fail_k", "k": 1}])

    summary = dep.run()

    calls = calls_for("wait")
    assert [c["retry_number"] for c in calls] == [0, 1], "no duplicate, no loss"
    assert calls[1]["called_ms"] >= calls[1]["retry_timestamp"]
    assert calls[1]["retry_timestamp"] - calls[0]["called_ms"] >= 18_000
    _kept_membership(summary.rebalances)


def test_slow_batch_goes_back_to_polling_before_max_poll_interval(
    bootstrap: str, tmp_path: Path
) -> None:
    # 24 messages x 0.5 s = 12 s in one batch, twice max.poll.interval.ms: the worker must
    # interleave consume() calls (seeking back to the unprocessed rest), not leave the group.
    dep = deployment(bootstrap, tmp_path, sequence="1s", max_poll_interval_ms=6000)
    dep.send([{"id": f"s{i}", "mode": "slow", "seconds": 0.5} for i in range(24)])

    summary = dep.run()

    for i in range(24):
        assert [c["retry_number"] for c in calls_for(f"s{i}")] == [0], f"s{i}"
    _kept_membership(summary.rebalances)
    assert summary.total("success") == 24


def test_copy_too_large_to_route_is_dead_lettered_without_payload(
    bootstrap: str, tmp_path: Path
) -> None:
    """The routed copy adds retryd headers; with a 2,000-byte producer limit it no longer
    fits. It used to stop the worker (exit 3) and a restart ran into the same record forever:
    now the record ends in failed_topic as ``too_large``, naming its original coordinates."""
    from confluent_kafka import Consumer, TopicPartition

    dep = deployment(bootstrap, tmp_path, sequence="1s", kafka={"message.max.bytes": "2000"})
    dep.send([{"id": "small", "mode": "ok"}, {"id": "big", "mode": "always", "pad": "x" * 1850}])

    summary = dep.run()

    assert [c["retry_number"] for c in calls_for("big")] == [0]
    assert summary.dead_reasons == {"too_large": 1}
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": dep.settings.group_id})
    try:
        [committed] = reader.committed([TopicPartition(dep.main, 0)], timeout=10)
    finally:
        reader.close()
    assert committed.offset == 2, "both inputs are committed: each ended in one place"
    assert read_topic(bootstrap, dep.tier("1s")) == []
    [dead] = read_topic(bootstrap, dep.settings.failed_topic)
    hdrs = dict(dead.headers)
    assert hdrs[h.DEAD_REASON] == b"too_large"
    assert hdrs[h.ORIGINAL_TOPIC] == dep.main.encode() and hdrs[h.ORIGINAL_OFFSET] == b"1"
    assert dead.value is None


def test_header_names_that_are_not_utf8_never_crash_the_worker(
    bootstrap: str, tmp_path: Path
) -> None:
    """confluent-kafka raises on a header name that is not UTF-8, and asked again hands back
    tuples holding NULL that crash the interpreter when touched: a worker that read such a
    record's headers twice died with a segfault. Produced with librdkafka's C API (no Python
    client writes such names): a failing main record and a tier record, both dead-lettered as
    malformed with what was readable; a good record after them is handled."""
    from tests.integration.test_header_fuzz_sidecar import keys_in, produce_raw

    dep = deployment(bootstrap, tmp_path, sequence="1s")
    tier = dep.tier("1s")
    envelope = [
        (h.RETRY_NUMBER.encode(), b"1"),
        (h.RETRY_TIMESTAMP.encode(), b"0"),
        (h.ORIGINAL_TOPIC.encode(), dep.main.encode()),
        (h.ORIGINAL_PARTITION.encode(), b"0"),
        (h.ORIGINAL_OFFSET.encode(), b"3"),
        (h.GROUP.encode(), dep.settings.group_id.encode()),
    ]
    bad_name = [(b"\xff\xfe-name", b"v"), (b"kept", b"yes")]
    produce_raw(
        bootstrap, dep.main, [(b"main-bad", b'{"id": "main-bad", "mode": "always"}', bad_name)]
    )
    produce_raw(bootstrap, tier, [(b"tier-bad", b'{"id": "tier-bad"}', envelope + bad_name)])
    dep.send([{"id": "after"}])

    summary = dep.run()

    assert sorted(keys_in(bootstrap, dep.failed)) == [b"main-bad", b"tier-bad"]
    assert summary.dead_reasons == {"malformed": 2}
    assert len(calls_for("after")) == 1


def test_headers_read_after_another_read_raised_are_still_checked(bootstrap: str) -> None:
    """The race behind a segfault seen in CI: a handler thread's first ``headers()`` call
    raises on a name that is not UTF-8 and, before its result is kept, the poll thread asks
    the client again and is handed the cached list holding NULL without an exception. Whoever
    asks second must still see the problem and get only the readable headers."""
    from confluent_kafka import Consumer, TopicPartition

    from retryd.policy.headers import message_headers
    from tests.integration.test_header_fuzz_sidecar import produce_raw
    from tests.support import create_topics, unique

    topic = unique("hdr-race")
    create_topics(bootstrap, [topic], 1)
    produce_raw(bootstrap, topic, [(b"k", b"v", [(b"\xff\xfe-name", b"v"), (b"kept", b"yes")])])
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader")})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        raw = wait_for(
            lambda: next((m for m in consumer.consume(10, 0.5) if not m.error()), None),
            30,
            what="the record",
        )
        with pytest.raises(SystemError):
            raw.headers()  # the other thread's read
        headers, problem = message_headers(raw)
    finally:
        consumer.close()
    assert headers == [("kept", b"yes")]
    assert problem is not None and "not UTF-8" in problem
