"""--since/--until: the records of the window exactly, narrowed through offsets-for-times where
the broker honours record timestamps, filtered after the read where it does not (and said)."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from retryd.pipeline.timefilter import plan_time_window, read_window
from retryd.policy.timespec import TimeWindow
from tests.integration.spark_support import spark  # noqa: F401
from tests.support import create_topics, unique

pytestmark = pytest.mark.spark
# The embedded broker answers offsets-for-times without looking at CreateTime.
from tests.support import ON_TANSU  # noqa: E402

BASE = 1_700_000_000_000
MINUTE = 60_000


def test_window_is_exact_and_the_method_is_named(spark, bootstrap: str) -> None:  # noqa: F811
    topic = unique("tw")
    create_topics(bootstrap, [topic], partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(60):  # one record a minute for an hour, spread over two partitions
        producer.produce(topic, value=b"%d" % i, partition=i % 2, timestamp=BASE + i * MINUTE)
    assert producer.flush(30) == 0
    conf = {"bootstrap.servers": bootstrap}

    window = TimeWindow(BASE + 10 * MINUTE, BASE + 25 * MINUTE)
    df, plan = read_window(spark, conf, [topic], window, max_records_per_partition=7)
    assert sorted(int(r["value"]) for r in df.select("value").collect()) == list(range(10, 25))
    tail = TimeWindow(BASE + 50 * MINUTE, None)
    df_tail, plan_tail = read_window(spark, conf, [topic], tail)
    assert sorted(int(r["value"]) for r in df_tail.select("value").collect()) == list(range(50, 60))
    empty = TimeWindow(BASE + 90 * MINUTE, None)
    assert plan_time_window(conf, [topic], empty).ranges.keys() == {(topic, 0), (topic, 1)}

    if ON_TANSU:
        for p in (plan, plan_tail):
            assert not p.narrowed and p.method == "filter-after-read"
            assert "not supported by this broker" in p.note and "filtering after the read" in p.note
            assert p.ranges == {(topic, 0): (0, 30), (topic, 1): (0, 30)}
    else:  # a broker that honours timestamps: only the window's offsets (+ until margin)
        assert plan.narrowed and "offsets-for-times: reading" in plan.note
        assert plan.ranges == {(topic, 0): (5, 15), (topic, 1): (5, 15)}
        assert plan_tail.ranges == {(topic, 0): (25, 30), (topic, 1): (25, 30)}
        assert plan_time_window(conf, [topic], empty).ranges == {
            (topic, 0): (30, 30),
            (topic, 1): (30, 30),
        }
