"""The Spark jobs on the embedded broker of ``./scripts/dev`` (Tansu), whose ListOffsets answers
a partition's end wrongly (the base offset of its last batch + 1): ``retryd spark report``,
``archive`` and ``replay`` still read every dead letter (issue 23: they read 2 of 40, without a
word). The jobs' test runs on Tansu and on the suite's broker (Apache Kafka by default) with the
same assertions.

Tansu is this module's own (started here, stopped by PID), or the suite's when the suite runs
on it (``RETRYD_TEST_BROKER=tansu``), so the test runs in the default Apache Kafka run too.
"""

from __future__ import annotations

import csv
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition

from retryd.kafka.embedded import EmbeddedBroker
from retryd.pipeline.kafka_io import KafkaReadError, read_range, resolve_ranges
from retryd.pipeline.offsets import OffsetRange
from retryd.pipeline.options import SourceOptions
from retryd.pipeline.stream import RetrydKafkaStreamReader
from tests.integration.spark_support import assert_exactly_once, dead_letter, spark  # noqa: F401
from tests.support import ON_TANSU, create_topics, read_topic, unique

pytestmark = pytest.mark.spark
DEAD = 40
PARTITIONS = 2


@pytest.fixture(scope="module")
def tansu(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Bootstrap of an embedded Tansu broker: the suite's, or one started for this module."""
    if ON_TANSU:
        yield request.getfixturevalue("bootstrap")
        return
    broker = EmbeddedBroker(log_file=tmp_path_factory.mktemp("tansu") / "tansu.log").start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(params=["tansu", "suite-broker"])
def broker(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(name, bootstrap) of the broker a job test runs on."""
    if request.param == "tansu":
        return "tansu", request.getfixturevalue("tansu")
    if ON_TANSU:
        pytest.skip("the suite's broker is Tansu: the tansu case is this case")
    return "suite-broker", request.getfixturevalue("bootstrap")


def seed(bootstrap: str) -> dict[str, str]:
    """40 dead letters of ``orders`` in a 2-partition failed topic, a few records per batch
    (one produce call, batched by linger.ms), as a worker writes them. The CLI's settings."""
    prefix = unique("tansu23")
    orders, failed = f"{prefix}.orders", f"{prefix}.failed"
    create_topics(bootstrap, [orders, failed], partitions=PARTITIONS)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(DEAD):
        producer.produce(
            failed,
            key=b"k%d" % i,
            value=b"value-%d" % i,
            headers=dead_letter(orders, i, partition=i % PARTITIONS),
            partition=i % PARTITIONS,
        )
    assert producer.flush(30) == 0
    return {
        "RETRYD_BOOTSTRAP_SERVERS": bootstrap,
        "RETRYD_FAILED_TOPIC": failed,
        "RETRYD_MAIN_TOPICS": orders,
        "RETRYD_TIER_TEMPLATE": prefix + ".retry_{delay}",
        "RETRYD_LEDGER_TOPIC": f"{prefix}.ledger",
    }


def listed_ends(bootstrap: str, topic: str) -> int:
    """The records ListOffsets 'latest' claims a topic holds (its partitions' ends, summed)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("ends")})
    try:
        query = [TopicPartition(topic, p, OFFSET_END) for p in range(PARTITIONS)]
        return sum(tp.offset for tp in consumer.offsets_for_times(query, timeout=15))
    finally:
        consumer.close()


def cell(output: str, item: str) -> int:
    """A number of the replay summary's table (``item │ value``)."""
    found = re.search(rf"{re.escape(item)}\s*│\s*(\d+)\s*│", output)
    assert found, f"no {item!r} in:\n{output}"
    return int(found.group(1))


def test_report_archive_and_replay_read_every_dead_letter(
    spark,  # noqa: F811 - the commands reuse the test session
    broker: tuple[str, str],
    tmp_path: Path,
) -> None:
    from typer.testing import CliRunner

    from retryd.cli import app

    name, bootstrap = broker
    env = seed(bootstrap)
    failed, orders = env["RETRYD_FAILED_TOPIC"], env["RETRYD_MAIN_TOPICS"]
    if name == "tansu":  # the broker's wrong answer is what this case exercises
        assert listed_ends(bootstrap, failed) < DEAD, (
            "Tansu's ListOffsets now answers a partition's end correctly: this case no longer "
            "exercises the fetch-checked ends (issue 23)"
        )
    runner = CliRunner()

    report = tmp_path / "report"
    done = runner.invoke(app, ["spark", "report", "--out", str(report)], env=env)
    assert done.exit_code == 0, done.output
    assert f"{DEAD} dead letters" in done.output, done.output
    with (report / "dead_letters.csv").open() as fh:
        assert sum(int(row["count"]) for row in csv.DictReader(fh)) == DEAD

    archive = tmp_path / "archive"
    done = runner.invoke(app, ["spark", "archive", "--out", str(archive)], env=env)
    assert done.exit_code == 0, done.output
    assert json.loads(done.output[done.output.index("{") :])["records"] == DEAD
    assert_exactly_once(spark, archive, DEAD)

    done = runner.invoke(app, ["spark", "replay", "--rate", "1000"], env=env)
    assert done.exit_code == 0, done.output
    assert (cell(done.output, "matched"), cell(done.output, "replayed")) == (DEAD, DEAD)
    copies = read_topic(bootstrap, orders, expect=DEAD)
    assert sorted(r.value for r in copies) == sorted(b"value-%d" % i for i in range(DEAD))
    # The ledger is read through the same planning: all 40 are found replayed, none twice.
    again = runner.invoke(app, ["spark", "replay", "--rate", "1000"], env=env)
    assert again.exit_code == 0, again.output
    assert cell(again.output, "replayed") == 0
    assert cell(again.output, "skipped: already_replayed") == DEAD
    assert len(read_topic(bootstrap, orders)) == DEAD


def test_planning_reads_to_the_fetched_end_and_names_the_broker(
    tansu: str, caplog: pytest.LogCaptureFixture
) -> None:
    env = seed(tansu)
    failed = env["RETRYD_FAILED_TOPIC"]
    opts = SourceOptions.parse({"kafka.bootstrap.servers": tansu, "topics": failed})
    with caplog.at_level(logging.INFO, logger="retryd.pipeline.kafka_io"):
        ranges = resolve_ranges(opts)
    assert sorted((r.partition, r.start, r.end) for r in ranges) == [(0, 0, 20), (1, 0, 20)]
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "answers ListOffsets 'latest' wrongly" in said and "'tansu_cluster'" in said, said
    assert f"{failed}[0]: ListOffsets answered end offset" in said
    stream = RetrydKafkaStreamReader(opts)  # --continuous plans its micro-batches the same way
    try:
        assert stream.latestOffset() == {failed: {"0": 20, "1": 20}}
    finally:
        stream.stop()


def test_timestamp_options_are_refused_where_the_broker_ignores_timestamps(tansu: str) -> None:
    """Tansu answers offset 0 for every timestamp: an endingTimestamp an hour ahead would have
    read nothing. The data source's *Timestamp options have no filter-after-read fallback."""
    failed = seed(tansu)["RETRYD_FAILED_TOPIC"]
    ahead = str(int(time.time() * 1000) + 3_600_000)
    opts = SourceOptions.parse(
        {"kafka.bootstrap.servers": tansu, "topics": failed, "endingTimestamp": ahead}
    )
    with pytest.raises(KafkaReadError) as caught:
        resolve_ranges(opts)
    text = str(caught.value)
    assert "'tansu_cluster'" in text and "does not honour record timestamps" in text, text
    assert "endingTimestamp" in text


@pytest.mark.parametrize("where", ["tansu", "suite-broker"])
def test_a_read_never_ends_short_of_its_range(where: str, request: pytest.FixtureRequest) -> None:
    """Whatever planned it, a range whose records the broker does not have fails naming the
    broker's end of partition; it used to end there, returning fewer records without a word."""
    if where == "suite-broker" and ON_TANSU:
        pytest.skip("the suite's broker is Tansu: the tansu case is this case")
    bootstrap = request.getfixturevalue("tansu" if where == "tansu" else "bootstrap")
    failed = seed(bootstrap)["RETRYD_FAILED_TOPIC"]
    conf = {"bootstrap.servers": bootstrap}
    whole = OffsetRange(failed, 0, 0, DEAD // PARTITIONS)
    assert sum(b.num_rows for b in read_range(conf, whole, 1000, 30)) == DEAD // PARTITIONS
    beyond = OffsetRange(failed, 0, 0, DEAD // PARTITIONS + 5)
    with pytest.raises(KafkaReadError) as caught:
        list(read_range(conf, beyond, 1000, 2))
    text = str(caught.value)
    assert f"{failed}[0]@{DEAD // PARTITIONS}" in text and "end offset 25" in text, text
    assert f"ends the partition at {DEAD // PARTITIONS}: the planned offsets 20..24" in text, text
    assert "cluster id" in text, text
