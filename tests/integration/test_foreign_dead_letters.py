"""Other systems' dead letters on a real broker, each with its system's exact header encoding:
Spring for Apache Kafka (binary numbers), Karafka and Kafka Connect (text), Kafka 4.4 share
groups (KIP-1191), and a topic of mixed records read with ``auto``. Browsed, read and replayed
(one record and a bulk job) through a real `retryd sidecar`, replayed with `retryd replay`,
and reported and replayed with Spark."""

from __future__ import annotations

import io
import json
import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from retryd.policy.headers import REPLAY_ID, REPLAYED_FROM
from tests.integration.sidecar_support import (
    TOKEN,
    Env,
    SidecarProcess,
    pretty,
    replay_cli,
    seed,
    sign_in,
    wait_job,
)
from tests.support import create_topics, read_topic, unique, wait_for

Headers = list[tuple[str, bytes | None]]
NOT_ALLOWED = "elsewhere"  # an original topic retryd does not own (not in the allow-list)


def spring(topic: str, partition: int, offset: int) -> Headers:
    """DeadLetterPublishingRecoverer's headers: ByteBuffer.putInt / putLong (big-endian)."""
    return [
        ("trace", b"s%d" % offset),
        ("kafka_dlt-original-topic", topic.encode()),
        ("kafka_dlt-original-partition", struct.pack(">i", partition)),
        ("kafka_dlt-original-offset", struct.pack(">q", offset)),
        ("kafka_dlt-original-timestamp", struct.pack(">q", 1_700_000_000_000 + offset)),
        ("kafka_dlt-original-timestamp-type", b"CreateTime"),
        ("kafka_dlt-original-consumer-group", b"spring-app"),
        (
            "kafka_dlt-exception-fqcn",
            b"org.springframework.kafka.listener.ListenerExecutionFailedException",
        ),
        ("kafka_dlt-exception-cause-fqcn", b"java.lang.IllegalStateException"),
        ("kafka_dlt-exception-message", b"Listener method threw: order %d" % offset),
        ("kafka_dlt-exception-stacktrace", b"java.lang.IllegalStateException\n\tat A.b(A.java:1)"),
    ]


def karafka(topic: str, partition: int, offset: int) -> Headers:
    """Karafka's build_dlq_message: the original headers merged with source_* strings."""
    return [
        ("trace", b"k%d" % offset),
        ("source_topic", topic.encode()),
        ("source_partition", str(partition).encode()),
        ("source_offset", str(offset).encode()),
        ("source_consumer_group", b"karafka_app"),
        ("source_attempts", b"3"),
        ("source_trace_id", b"0b7f3c1e-5a3e-4bd0-9a4b-1d5b1e0b7f00"),
    ]


def connect(topic: str, partition: int, offset: int) -> Headers:
    """DeadLetterQueueReporter.populateContextHeaders: __connect.errors.* UTF-8 strings."""
    return [
        ("trace", b"c%d" % offset),
        ("__connect.errors.topic", topic.encode()),
        ("__connect.errors.partition", str(partition).encode()),
        ("__connect.errors.offset", str(offset).encode()),
        ("__connect.errors.connector.name", b"orders-sink"),
        ("__connect.errors.task.id", b"0"),
        ("__connect.errors.stage", b"VALUE_CONVERTER"),
        ("__connect.errors.class.name", b"org.apache.kafka.connect.json.JsonConverter"),
        ("__connect.errors.exception.class.name", b"org.apache.kafka.connect.errors.DataException"),
        ("__connect.errors.exception.message", b"Converting byte[] to Kafka Connect data failed"),
        ("__connect.errors.exception.stacktrace", b"org.apache.kafka.connect.errors.DataException"),
    ]


def share(topic: str, partition: int, offset: int) -> Headers:
    """ShareGroupDLQStateManager's headers (the broker copies no original header)."""
    return [
        ("__dlq.errors.topic", topic.encode()),
        ("__dlq.errors.partition", str(partition).encode()),
        ("__dlq.errors.offset", str(offset).encode()),
        ("__dlq.errors.group", b"job-workers"),
        ("__dlq.errors.delivery.count", b"5"),
        ("__dlq.errors.message", b"Offset delivery count exceeded the threshold."),
    ]


FORMATS = {"spring": spring, "karafka": karafka, "connect": connect, "share_group": share}
FOREIGN_PREFIXES = ("kafka_dlt-", "retry_topic-", "source_", "__connect.errors.", "__dlq.errors.")


class World:
    """One deployment with a foreign dead-letter topic per format and one read with ``auto``."""

    def __init__(self, bootstrap: str, state_dir: Path) -> None:
        self.env = Env(bootstrap, state_dir)
        self.topics = {fmt: f"{self.env.group}.{fmt}.dlt" for fmt in FORMATS}
        self.mixed = f"{self.env.group}.mixed.dlt"
        mapping = {**{t: f for f, t in self.topics.items()}, self.mixed: "auto"}
        self.env.extra = {
            "RETRYD_FOREIGN_DEAD_LETTERS": json.dumps(mapping),
            "RETRYD_METRICS_INTERVAL_S": "1",
        }

    def seed(self) -> World:
        bootstrap, main = self.env.bootstrap, self.env.main
        self.env.create(main_partitions=2)
        create_topics(bootstrap, [*self.topics.values(), self.mixed], 1)
        for fmt, headers in FORMATS.items():
            # offsets 0-2 come from partition 1 of the main topic, 3 from a topic not retryd's
            rows = [
                (b"%s-%d" % (fmt.encode(), i), b"v%d" % i, headers(main, 1, i)) for i in range(3)
            ]
            rows.append((b"x", b"x", headers(NOT_ALLOWED, 0, 3)))
            seed(bootstrap, self.topics[fmt], rows)
        mixed = [
            (b"m0", b"m0", spring(main, 0, 10)),
            (b"m1", b"m1", karafka(main, 0, 11)),
            (b"m2", b"m2", [("plain", b"nothing known")]),
        ]
        seed(bootstrap, self.mixed, mixed)
        return self


@pytest.fixture(scope="module")
def world(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> World:
    return World(bootstrap, tmp_path_factory.mktemp("foreign") / "state").seed()


@pytest.fixture(scope="module")
def sidecar(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    log = tmp_path_factory.mktemp("foreign-log") / "sidecar.log"
    proc = SidecarProcess(world.env, log).start()
    try:
        yield proc
    finally:
        proc.stop()


def assert_clean_copy(copy_headers: Headers, coordinate: str, trace: bytes | None) -> None:
    names = [name for name, _ in copy_headers]
    assert not [n for n in names if n.startswith(FOREIGN_PREFIXES)], names
    assert dict(copy_headers)[REPLAYED_FROM] == coordinate.encode()
    assert REPLAY_ID in names and "retry_number" not in names
    assert dict(copy_headers).get("trace") == trace


def test_browse_and_read_each_format_mapped(world: World, sidecar: SidecarProcess) -> None:
    main = world.env.main
    with sidecar.client() as c:
        for fmt, topic in world.topics.items():
            page = c.get("/v1/failed", params={"topic": topic, "limit": 50}).json()
            assert len(page["items"]) == 4 and not page["has_more"], pretty(page)
            first = page["items"][0]
            assert first["format"] == fmt and first["mapping_problems"] == [], pretty(first)
            env = first["retryd"]
            assert (env["retryd_original_topic"], env["retryd_original_partition"]) == (main, 1)
            assert env["retryd_original_offset"] == 0
            assert not [h for h in first["headers"] if h["name"].startswith(FOREIGN_PREFIXES)]
            # filters work on the mapped fields
            mine = c.get("/v1/failed", params={"topic": topic, "original_topic": main}).json()
            assert len(mine["items"]) == 3, fmt
            one = c.get("/v1/failed/0/2", params={"topic": topic}).json()
            assert one["retryd"]["retryd_original_offset"] == 2 and one["format"] == fmt
        spring_rec = c.get("/v1/failed/0/1", params={"topic": world.topics["spring"]}).json()
        expected = {
            "retryd_error_class": "java.lang.IllegalStateException",
            "retryd_error_message": "Listener method threw: order 1",
            "retryd_original_timestamp": 1_700_000_000_001,
            "retryd_group": "spring-app",
        }
        assert expected.items() <= spring_rec["retryd"].items(), pretty(spring_rec)
        assert [h["name"] for h in spring_rec["headers"]] == ["trace"]
        connect_page = c.get(
            "/v1/failed",
            params={"topic": world.topics["connect"], "dead_reason": "malformed"},
        ).json()
        assert len(connect_page["items"]) == 4
        assert connect_page["items"][0]["retryd"]["retryd_group"] == "connect-orders-sink"
        share_rec = c.get("/v1/failed/0/0", params={"topic": world.topics["share_group"]}).json()
        assert share_rec["retryd"]["retryd_dead_reason"] == "exhausted"
        assert share_rec["retryd"]["retry_number"] == 4
        karafka_rec = c.get("/v1/failed/0/0", params={"topic": world.topics["karafka"]}).json()
        assert karafka_rec["retryd"]["retryd_group"] == "karafka_app"
        # auto: each record detected from its own headers
        mixed = c.get("/v1/failed", params={"topic": world.mixed}).json()["items"]
        assert [i["format"] for i in mixed] == ["spring", "karafka", "retryd"], pretty(mixed)
        assert [i["retryd"].get("retryd_original_offset") for i in mixed] == [10, 11, None]
        # a topic that is not configured is still refused
        refused = c.get("/v1/failed", params={"topic": f"{world.env.group}.unknown.dlt"})
        assert refused.status_code == 400, refused.text
        assert world.topics["spring"] in refused.json()["detail"]


def test_replay_one_and_a_bulk_job_through_the_sidecar(
    world: World, sidecar: SidecarProcess
) -> None:
    env, spring_topic = world.env, world.topics["spring"]
    with sidecar.client() as c:
        done = c.post("/v1/failed/0/0/replay", params={"topic": spring_topic})
        assert done.status_code == 200, done.text
        out = done.json()
        assert out["target_topic"] == env.main and out["target_partition"] == 1, out
        # the original topic of a foreign record must be allowed: this one is not retryd's
        refused = c.post("/v1/failed/0/3/replay", params={"topic": spring_topic})
        assert refused.status_code == 403 and "allow-list" in refused.json()["detail"]
        # a foreign dead-letter topic is never a target
        reserved = c.post(
            "/v1/failed/0/1/replay", params={"topic": spring_topic}, json={"target": spring_topic}
        )
        assert reserved.status_code == 403 and reserved.json()["error"] == "target_reserved"

        job = c.post("/v1/replays", json={"topic": world.topics["share_group"]}).json()
        snap = wait_job(c, job["id"])
        assert snap["state"] == "completed", pretty(snap)
        assert (snap["replayed"], snap["skipped"]) == (3, 1), pretty(snap)
        assert snap["skipped_reasons"] == {"target_not_allowed": 1}
        assert snap["by_dead_reason"] == {"exhausted": 4}
        assert snap["by_target"] == {env.main: 3}

    copies = read_topic(env.bootstrap, env.main, expect=4)
    by_source = {dict(r.headers)[REPLAYED_FROM].decode(): r for r in copies}
    spring_copy = by_source[f"{spring_topic}/0/0"]
    assert (spring_copy.partition, spring_copy.key, spring_copy.value) == (1, b"spring-0", b"v0")
    assert_clean_copy(spring_copy.headers, f"{spring_topic}/0/0", b"s0")
    for i in range(3):
        coordinate = f"{world.topics['share_group']}/0/{i}"
        assert_clean_copy(by_source[coordinate].headers, coordinate, None)
        assert by_source[coordinate].partition == 1


def test_replay_with_the_cli(world: World, sidecar: SidecarProcess) -> None:
    topic = world.topics["karafka"]
    done = replay_cli(world.env, "--topic", topic, "--original-topic", world.env.main, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    snap = json.loads(done.stdout.strip().splitlines()[-1])
    assert (snap["replayed"], snap["topic"]) == (3, topic), snap
    copies = [
        r
        for r in read_topic(world.env.bootstrap, world.env.main)
        if dict(r.headers)[REPLAYED_FROM].startswith(topic.encode())
    ]
    assert sorted(r.key for r in copies) == [b"karafka-0", b"karafka-1", b"karafka-2"]
    for r in copies:
        source = dict(r.headers)[REPLAYED_FROM].decode()
        assert_clean_copy(r.headers, source, b"k" + source.rpartition("/")[2].encode())
    # the sidecar sees the CLI's replays in the shared ledger
    with sidecar.client() as c:
        rec = c.get("/v1/failed/0/1", params={"topic": topic}).json()
        assert rec["replayed"] is not None and rec["replayed"]["by"].startswith("cli:")


@pytest.fixture(scope="session")
def spark_session() -> Iterator[Any]:
    """The test run's shared SparkSession (tests.integration.spark_support), imported only
    here so that the sidecar tests above run without PySpark; stopped (JVM by PID) at the end."""
    pytest.importorskip("pyspark", reason="PySpark is not installed")
    from tests.integration import spark_support

    try:
        yield spark_support.shared_spark()
    finally:
        spark_support.stop_shared()


@pytest.mark.spark
def test_spark_report_and_replay_read_every_format(
    spark_session: Any, bootstrap: str, tmp_path: Path
) -> None:
    """One report over the four foreign topics (same columns as retryd's dead letters, a
    funnel row each), then a Spark replay of one of them (clean copies, one ledger)."""
    from rich.console import Console

    from retryd.pipeline.progress import JobProgress
    from retryd.pipeline.replay import ReplaySpec, run_replay
    from retryd.pipeline.report import ReportSpec, run_report

    prefix = unique("fspark")
    orders, failed, ledger = f"{prefix}.orders", f"{prefix}.failed", f"{prefix}.ledger"
    topics = {fmt: f"{prefix}.{fmt}" for fmt in FORMATS}
    create_topics(bootstrap, [orders], 2)
    create_topics(bootstrap, [failed, *topics.values()], 1)
    for fmt, headers in FORMATS.items():
        seed(bootstrap, topics[fmt], [(b"%d" % i, b"v", headers(orders, 1, i)) for i in range(2)])
    spark = spark_session
    conf = {"bootstrap.servers": bootstrap}
    quiet = Console(file=io.StringIO())
    spec = ReportSpec(
        kafka_conf=conf,
        failed_topic=failed,
        tier_topics=(),
        out_dir=tmp_path / "report",
        foreign={t: f for f, t in topics.items()},
    )
    with JobProgress(spark, quiet) as progress:
        result = run_report(spark, spec, progress, quiet)
    dead = {
        (r.original_topic, r.error_class, r.dead_reason): int(r.count)
        for r in result.tables["dead_letters"].itertuples(index=False)
    }
    assert dead == {
        (orders, "java.lang.IllegalStateException", None): 2,
        (orders, None, "exhausted"): 2,  # karafka
        (orders, "org.apache.kafka.connect.errors.DataException", "malformed"): 2,
        (orders, "ShareGroupDLQ", "exhausted"): 2,
    }, dead
    funnel = {r.tier: int(r.messages) for r in result.tables["funnel"].itertuples(index=False)}
    assert funnel == {failed: 0, **{t: 2 for t in topics.values()}}, funnel

    replay = ReplaySpec(
        kafka_conf=conf,
        failed_topic=failed,
        ledger_topic=ledger,
        allowlist=(orders,),
        topic=topics["connect"],
        foreign="connect",
        where=f"original_topic = '{orders}' AND original_offset = 1",
        max_per_second=1000.0,
    )
    with JobProgress(spark, quiet) as progress:
        done = run_replay(spark, replay, progress)
    assert (done.matched, done.replayed, done.failed) == (1, 1, 0), done
    (copy,) = read_topic(bootstrap, orders, expect=1)
    assert copy.partition == 1 and copy.key == b"1"
    assert_clean_copy(copy.headers, f"{topics['connect']}/0/1", b"c1")


def test_explorer_and_backlog_show_the_foreign_topics(
    world: World, sidecar: SidecarProcess
) -> None:
    """The explorer reads them through the same mapping; the backlog has a series each."""
    with httpx.Client(base_url=sidecar.url, timeout=60, follow_redirects=False) as ui:
        sign_in(ui, TOKEN)
        overview = ui.get("/ui/")
        assert overview.status_code == 200
        assert all(topic in overview.text for topic in world.topics.values())
        page = ui.get("/ui/dead-letters", params={"topic": world.topics["spring"]})
        assert page.status_code == 200, page.text[-800:]
        assert "java.lang.IllegalStateException" in page.text
        assert world.env.main in page.text

    def backlog() -> dict[str, float] | None:
        text = httpx.get(sidecar.url + "/metrics", timeout=10).text
        found = {
            s.labels["topic"]: s.value
            for family in text_string_to_metric_families(text)
            if family.name == "retryd_failed_backlog"
            for s in family.samples
        }
        wanted = {*world.topics.values(), world.mixed}
        return found if wanted <= set(found) else None

    found = wait_for(backlog, 30, 0.2, "a backlog series per foreign topic")
    assert all(found[t] == 4 for t in world.topics.values()), found
    assert found[world.mixed] == 3


NOT_UTF8 = b"caf\xe9 \xff\xfe"  # Latin-1 and stray bytes: no UTF-8 decoder reads them
UNREADABLE = ("kafka_dlt-exception-fqcn", "kafka_dlt-exception-message")


def test_text_that_is_not_utf8_is_null_in_the_api_and_on_the_pages(
    bootstrap: str, tmp_path: Path
) -> None:
    """Issue 23 item 14, as README and the spec say: a Spring dead letter whose exception
    class and message are not UTF-8 shows both fields null in /v1 (list and one record), with
    each header named in mapping_problems; the explorer's pages show no U+FFFD for them (the
    raw header rows show the bytes as hex). Its own deployment and sidecar."""
    env = Env(bootstrap, tmp_path / "state")
    topic = f"{env.group}.spring.dlt"
    env.extra = {"RETRYD_FOREIGN_DEAD_LETTERS": json.dumps({topic: "spring"})}
    env.create()
    create_topics(bootstrap, [topic], 1)
    headers = [(n, NOT_UTF8 if n in UNREADABLE else v) for n, v in spring(env.main, 1, 0)]
    seed(bootstrap, topic, [(b"k", b"v", headers)])
    replacement = ("\ufffd", "\\ufffd")  # as a character, or as JSON's escape of it
    with SidecarProcess(env, tmp_path / "sidecar.log") as sidecar:
        with sidecar.client() as c:
            listed = c.get("/v1/failed", params={"topic": topic})
            one = c.get("/v1/failed/0/0", params={"topic": topic})
            for r in (listed, one):
                assert r.status_code == 200, r.text
                assert not any(x in r.text for x in replacement), r.text
            (item,) = listed.json()["items"]
            for rec in (item, one.json()):
                fields = rec["retryd"]
                assert fields["retryd_error_class"] is None, pretty(rec)
                assert fields["retryd_error_message"] is None, pretty(rec)
                assert fields["retryd_original_topic"] == env.main  # the rest is read
                assert fields["retryd_group"] == "spring-app"
                for name in UNREADABLE:
                    assert [p for p in rec["mapping_problems"] if name in p], pretty(rec)
        with httpx.Client(base_url=sidecar.url, timeout=60, follow_redirects=False) as ui:
            sign_in(ui, TOKEN)
            pages = [
                ui.get("/ui/dead-letters", params={"topic": topic}),
                ui.get("/ui/dead-letters/0/0", params={"topic": topic}),
            ]
            for page in pages:
                assert page.status_code == 200, page.text[-2000:]
                assert not any(x in page.text for x in replacement), page.text[-4000:]
            assert NOT_UTF8.hex(" ") in pages[1].text  # the bytes as sent, in hex
            assert "spring-app" in pages[1].text
            # the record page says what it could not read: a "Not read" row per problem
            not_read = re.findall(
                r'<tr class="mapping-problem"><th scope="row">Not read</th>'
                r'<td class="wrap">([^<]*)</td>',
                pages[1].text,
            )
            assert len(not_read) == len(one.json()["mapping_problems"]), not_read
            for name in UNREADABLE:
                assert [p for p in not_read if name in p and "not valid UTF-8" in p], not_read
