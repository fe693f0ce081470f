"""``retryd spark replay``: exactly the filtered set, rate limited, one ledger with the sidecar."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from retryd.pipeline.progress import JobProgress
from retryd.pipeline.replay import ReplayInputError, ReplaySpec, run_replay
from retryd.policy import headers as h
from retryd.replay.errors import AlreadyReplayed, InvalidTarget
from retryd.replay.ledger import ReplayLedger
from retryd.replay.records import FailedRecord
from retryd.replay.replayer import Replayer, TargetPolicy
from tests.integration.spark_support import dead_letter, spark  # noqa: F401
from tests.support import create_topics, produce, read_topic, unique

pytestmark = pytest.mark.spark


@pytest.fixture()
def world(bootstrap: str) -> dict:
    prefix = unique("rpl")
    orders, payments = f"{prefix}.orders", f"{prefix}.payments"
    failed, ledger = f"{prefix}.failed", f"{prefix}.ledger"
    create_topics(bootstrap, [failed, orders], partitions=2)
    create_topics(bootstrap, [payments], partitions=1)
    records = []
    for i in range(16):
        cls = "Timeout" if i % 2 == 0 else "ValueError"
        env = dead_letter(
            orders, i, partition=i % 2, error_class=cls, user_headers=[("trace", b"t%d" % i)]
        )
        records.append((b"o%d" % i, b"order-%d" % i, env))
    for j in range(8):
        records.append((b"p%d" % j, b"pay-%d" % j, dead_letter(payments, j, error_class="Timeout")))
    produce(bootstrap, failed, records)
    common = {"bootstrap.servers": bootstrap}
    side_ledger = ReplayLedger(common, ledger)
    side_ledger.ensure_topic()
    replayer = Replayer(common, side_ledger, TargetPolicy(common, [orders, payments]), by="sidecar")
    failed_records = {
        (r.header(h.ORIGINAL_TOPIC).decode(), int(r.header(h.ORIGINAL_OFFSET))): FailedRecord(
            r.topic, r.partition, r.offset, r.timestamp, r.key, r.value, r.headers
        )
        for r in read_topic(bootstrap, failed, expect=24)
    }
    try:
        yield {
            "common": common, "orders": orders, "payments": payments, "failed": failed,
            "ledger": ledger, "replayer": replayer, "records": failed_records,
        }  # fmt: skip
    finally:
        replayer.close()
        side_ledger.close()


def spark_replay(spark, world: dict, **kw):  # type: ignore[no-untyped-def]  # noqa: F811
    kw.setdefault("allowlist", (world["orders"], world["payments"]))
    kw.setdefault("max_per_second", 1000.0)
    spec = ReplaySpec(
        kafka_conf=world["common"],
        failed_topic=world["failed"],
        ledger_topic=world["ledger"],
        **kw,
    )
    with JobProgress(spark, Console(file=io.StringIO())) as progress:
        return run_replay(spark, spec, progress)


def test_replay_filtered_set_with_ledger_both_ways(spark, world: dict) -> None:  # noqa: F811
    orders, records = world["orders"], world["records"]
    replayer: Replayer = world["replayer"]
    # the sidecar replays one record of the set first
    replayer.replay(records[(orders, 0)])

    where = f"original_topic = '{orders}' AND error_class = 'Timeout'"
    rate = 4.0
    result = spark_replay(spark, world, where=where, max_per_second=rate)
    assert (result.matched, result.to_replay, result.replayed, result.failed) == (8, 7, 7, 0)
    assert result.skipped == {"already_replayed": 1}
    assert result.seconds >= 7 / rate * 0.95  # the global rate limit held
    copies = read_topic(world["common"]["bootstrap.servers"], orders, expect=8)
    assert len(copies) == 8
    expected = {str(records[(orders, i)].coord): i for i in range(0, 16, 2)}
    by_source = {c.header(h.REPLAYED_FROM).decode(): c for c in copies}
    assert set(by_source) == set(expected)  # exactly the filtered set, each once
    for coord, i in expected.items():
        copy = by_source[coord]
        assert (copy.key, copy.value) == (b"o%d" % i, b"order-%d" % i)
        assert copy.partition == i % 2  # back to the original partition
        assert copy.header("trace") == b"t%d" % i
        assert copy.header(h.RETRY_NUMBER) is None and copy.header(h.DEAD_REASON) is None
        if i != 0:
            assert copy.header(h.REPLAY_ID).decode() == result.replay_id

    # the sidecar now refuses what Spark replayed
    with pytest.raises(AlreadyReplayed):
        replayer.replay(records[(orders, 2)])
    # Spark again: everything is in the ledger
    again = spark_replay(spark, world, where=where)
    assert (again.matched, again.replayed) == (8, 0)
    assert again.skipped == {"already_replayed": 8}
    # forced: replayed again, marked forced in the ledger
    forced = spark_replay(spark, world, where=f"{where} AND original_offset = 4", force=True)
    assert (forced.matched, forced.replayed) == (1, 1)
    ledger = ReplayLedger(world["common"], world["ledger"])
    try:
        ledger.refresh()
        entry = ledger.get(records[(orders, 4)].coord)
        assert entry is not None and entry.forced and entry.replay_id == forced.replay_id
        assert len(ledger) == 8
    finally:
        ledger.close()
    assert len(read_topic(world["common"]["bootstrap.servers"], orders, expect=9)) == 9


def test_dry_run_limits_and_bad_input(spark, world: dict) -> None:  # noqa: F811
    payments = world["payments"]
    where = f"original_topic = '{payments}'"
    dry = spark_replay(spark, world, where=where, dry_run=True)
    assert (dry.matched, dry.to_replay, dry.replayed) == (8, 8, 0)
    assert dry.by_target == {payments: 8}
    limited = spark_replay(spark, world, where=where, max_messages=3)
    assert (limited.to_replay, limited.replayed) == (3, 3)
    assert limited.skipped == {"max_messages": 5}
    copies = read_topic(world["common"]["bootstrap.servers"], payments, expect=3)
    sources = sorted(int(c.header(h.REPLAYED_FROM).decode().rsplit("/", 1)[1]) for c in copies)
    expected = sorted(r.offset for k, r in world["records"].items() if k[0] == payments)[:3]
    assert sources == expected  # the lowest offsets, deterministically
    # no allowed target: skipped with the reason, nothing produced
    orders_where = f"original_topic = '{world['orders']}' AND error_class = 'ValueError'"
    refused = spark_replay(spark, world, where=orders_where, allowlist=(payments,))
    assert (refused.matched, refused.to_replay, refused.replayed) == (8, 0, 0)
    assert refused.skipped == {"target_not_allowed": 8}
    with pytest.raises(ReplayInputError, match="is not a valid filter"):
        spark_replay(spark, world, where="no_such_column = 1")
    with pytest.raises(InvalidTarget, match="target_not_allowed"):
        spark_replay(spark, world, target=world["failed"])


def test_a_record_too_large_for_its_target_is_skipped(spark, bootstrap: str) -> None:  # noqa: F811
    """Issue 23: a 200 KB dead letter among small ones, for a topic that takes 100 KB. The
    Spark replay skips it with reason too_large (no ledger entry) and replays the others."""
    prefix = unique("rpl-big")
    orders, failed, ledger_topic = f"{prefix}.orders", f"{prefix}.failed", f"{prefix}.ledger"
    create_topics(bootstrap, [orders], 1, {"max.message.bytes": "100000"})
    create_topics(bootstrap, [failed], 1)
    records = [(b"s%d" % i, b"small-%d" % i, dead_letter(orders, i)) for i in range(12)]
    records.insert(5, (b"big", b"B" * 200_000, dead_letter(orders, 99)))
    produce(bootstrap, failed, records)
    common = {"bootstrap.servers": bootstrap}
    spec = ReplaySpec(
        kafka_conf=common,
        failed_topic=failed,
        ledger_topic=ledger_topic,
        allowlist=(orders,),
        max_per_second=1000.0,
    )
    with JobProgress(spark, Console(file=io.StringIO())) as progress:
        result = run_replay(spark, spec, progress)
    assert (result.matched, result.to_replay, result.replayed, result.failed) == (13, 13, 12, 0)
    assert result.skipped == {"too_large": 1}, result
    assert result.errors == [], result.errors
    copies = read_topic(bootstrap, orders)  # every copy was acknowledged: read to the end
    assert sorted(c.value or b"" for c in copies) == sorted(b"small-%d" % i for i in range(12))
    ledger = ReplayLedger(common, ledger_topic)
    try:
        ledger.refresh()
        assert len(ledger) == 12 and not ledger.is_replayed(f"{failed}/0/5")
    finally:
        ledger.close()
