"""Test helpers that talk to a real broker: topics, producing, reading back, waiting."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

T = TypeVar("T")

# Which broker the suite starts (tests/conftest.py): Apache Kafka unless told otherwise.
TEST_BROKER = os.environ.get("RETRYD_TEST_BROKER", "kafka").lower()
# The test broker accepts sessions down to 1 s, so a test that kills a member sees its
# partitions move in seconds. An external cluster keeps Kafka's own minimum, 6000 ms. (Tansu
# holds a group's first JoinGroup for about half of session.timeout.ms: 2000 there too.)
TEST_KAFKA_OVERRIDES = {
    "group.min.session.timeout.ms": "1000",
    # groups on the broker-driven protocol (group_protocol=consumer): the broker's own timing
    "group.consumer.min.session.timeout.ms": "6000",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.heartbeat.interval.ms": "500",
    "group.consumer.heartbeat.interval.ms": "1000",
    # Tests write records with fixed timestamps years in the past (dates in archives, time
    # windows): with the default 7-day retention the broker's 5-minute retention check deleted
    # them when it ran between a test's produce and its read (an archive found nothing new).
    "log.retention.ms": "-1",
}
TEST_SESSION_TIMEOUT_MS = 6000 if os.environ.get("RETRYD_TEST_BOOTSTRAP") else 2000
ON_TANSU = TEST_BROKER == "tansu" and not os.environ.get("RETRYD_TEST_BOOTSTRAP")


def broker_older_than(major: int, minor: int) -> bool:
    """The Apache Kafka this suite starts predates ``major.minor`` (an external cluster
    (``RETRYD_TEST_BOOTSTRAP``) is taken as new enough: what it lacks fails or skips later)."""
    if os.environ.get("RETRYD_TEST_BOOTSTRAP"):
        return False
    from retryd.kafka.apache import resolve_version

    found = tuple(int(part) for part in resolve_version().split(".")[:2])
    return found < (major, minor)


def set_group_configs(
    bootstrap: str, group: str, entries: dict[str, str], timeout: float = 30
) -> None:
    """Set a (share) group's dynamic configs, e.g. its record lock and delivery limit, before
    its first member joins (``kafka-configs --alter --entity-type groups``)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    resource = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in entries.items()
        ],
    )
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout)


def dedicated_broker(log_file: Path, port: int | None = None, advertised: str | None = None) -> Any:
    """A broker of the suite's kind for one test that stops, pauses or proxies it: Apache
    Kafka (one KRaft node), or the embedded Tansu with ``RETRYD_TEST_BROKER=tansu``. Not
    started; both have ``start()``, ``stop()``, ``pid`` and ``bootstrap``."""
    if ON_TANSU:
        from retryd.kafka.embedded import EmbeddedBroker

        return EmbeddedBroker(port=port, log_file=log_file, advertised=advertised)
    from retryd.kafka.apache import ApacheKafkaBroker

    return ApacheKafkaBroker(
        port=port, log_file=log_file, overrides=TEST_KAFKA_OVERRIDES, advertised=advertised
    )


def json_lines(path: Path) -> list[Any]:
    """The complete JSON lines of a log other processes may be appending to (a writer may be
    halfway through its last line: only lines ended by a newline are read)."""
    if not path.exists():
        return []
    complete = path.read_text().rpartition("\n")[0]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_for(
    cond: Callable[[], T], timeout: float, interval: float = 0.05, what: str = "condition"
) -> T:
    """Poll ``cond`` until it returns something truthy, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def create_topics(
    bootstrap: str, names: Iterable[str], partitions: int = 1, config: dict[str, str] | None = None
) -> None:
    names = list(names)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(n, partitions, 1, config=config or {}) for n in names], operation_timeout=10
    )
    for name, fut in futures.items():
        try:
            fut.result(15)
        except Exception as exc:  # topic may already exist from an idempotent create
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise AssertionError(f"creating {name}: {exc}") from exc
    wait_for_topics(admin, names)


def wait_for_topics(admin: AdminClient, names: Iterable[str], timeout: float = 30.0) -> None:
    """Wait until the broker's metadata lists each topic with its partitions and their leaders.

    CreateTopics answers once the controller recorded a topic; the broker's metadata can lag
    behind it, and a client that asks in between gets the topic without partitions. A reader
    that assigns "every partition" then assigns none and reads nothing, for good (a chaos
    scenario's dead-letter reader did that, about once in thirty runs).
    """
    pending = set(names)

    def listed() -> bool:
        for name in list(pending):
            md = admin.list_topics(name, timeout=10).topics.get(name)
            if (
                md is not None
                and md.error is None
                and md.partitions
                and all(p.leader >= 0 for p in md.partitions.values())
            ):
                pending.discard(name)
        return not pending

    wait_for(listed, timeout, what=f"topics {sorted(pending)} in the broker's metadata")


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes | None] | tuple[bytes | None, bytes | None, list]],
    partition: int | None = None,
) -> list[tuple[int, int]]:
    """Produce and wait for every ack; returns (partition, offset) per record."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    acks: list[tuple[int, int]] = []
    errors: list[KafkaError] = []

    def done(err: KafkaError | None, msg) -> None:  # type: ignore[no-untyped-def]
        if err is not None:
            errors.append(err)
        else:
            acks.append((msg.partition(), msg.offset()))

    for rec in records:
        key, value, *rest = rec
        kwargs = {"key": key, "value": value, "on_delivery": done}
        if rest:
            kwargs["headers"] = rest[0]
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(30)
    assert remaining == 0 and not errors, f"produce failed: {errors[:3]} remaining={remaining}"
    return acks


@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]

    def header(self, name: str) -> bytes | None:
        found = None
        for k, v in self.headers:
            if k == name:
                found = v
        return found


def read_topic(
    bootstrap: str, topic: str, expect: int | None = None, timeout: float = 20.0
) -> list[Record]:
    """Read a whole topic without a consumer group.

    With ``expect``, reads until that many records arrived (or fails at ``timeout``);
    otherwise reads until every partition reports end-of-partition.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(topic, timeout=10).topics[topic]
    assert md.error is None, f"topic {topic}: {md.error}"
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("reader"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    parts = sorted(md.partitions)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    out: list[Record] = []
    eof: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if expect is None and len(eof) == len(parts):
                break
            if expect is not None and len(out) >= expect:
                break
            for msg in consumer.consume(1000, 0.2):
                if msg.error():
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        eof.add(msg.partition())
                        continue
                    raise AssertionError(f"read {topic}: {msg.error()}")
                eof.discard(msg.partition())
                out.append(
                    Record(
                        msg.topic(),
                        msg.partition(),
                        msg.offset(),
                        msg.timestamp()[1],
                        msg.key(),
                        msg.value(),
                        list(msg.headers() or []),
                    )
                )
        else:
            raise AssertionError(
                f"timed out reading {topic}: got {len(out)} records, expected {expect}"
            )
    finally:
        consumer.close()
    return out


@contextlib.contextmanager
def http_service(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A real HTTP business service on a free loopback port, serving ``handler`` in threads;
    yields its ``/handle`` URL and stops it (and its thread) on exit."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/handle"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
