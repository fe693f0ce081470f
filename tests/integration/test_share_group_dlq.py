"""A dead letter the real Kafka 4.4 broker writes for a share group (KIP-1191), read and
replayed by retryd.

The other foreign-format tests write the share-group headers by hand; here the broker writes
them. What a share group needs for a dead-letter queue (read in the 4.4 broker): the group
config ``errors.deadletterqueue.topic.name`` names a topic that starts with the broker's
``errors.deadletterqueue.topic.name.prefix`` (``dlq.`` by default) and carries the topic config
``errors.deadletterqueue.group.enable=true`` (the broker creates it only when
``errors.deadletterqueue.auto.create.topics.enable``, off by default, so the test creates it);
``share.version`` 2 is the default feature level of a cluster formatted by 4.4. Without
``errors.deadletterqueue.copy.record.enable=true`` the broker writes headers only (no key, no
value): the test turns it on for one group so the replayed copy carries the original record,
and keeps the default for a second group, whose headers-only dead letter retryd refuses to
replay (422 ``nothing_to_replay``: the copy would be an empty record). A record goes
to the DLQ when a consumer acknowledges it REJECT, or when its delivery count reaches
``share.delivery.count.limit`` (here 2: released twice).

The share consumer is confluent-kafka's ``ShareConsumer`` (KIP-932, explicit acknowledgement).
The session broker needs no extra config; joining a share group takes a few seconds there
(5 s heartbeats by default)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import AcknowledgeType, KafkaException, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from retryd.policy.headers import REPLAY_ID, REPLAYED_FROM
from tests.integration.sidecar_support import Env, SidecarProcess, pretty, wait_job
from tests.support import (
    ON_TANSU,
    Record,
    broker_older_than,
    create_topics,
    produce,
    read_topic,
    wait_for,
)

pytestmark = pytest.mark.skipif(
    ON_TANSU or broker_older_than(4, 4),
    reason="share-group dead-letter queues (KIP-1191) need Apache Kafka 4.4 or newer",
)

REJECTED = b"Offset rejected by client."
LIMIT = b"Offset delivery count exceeded the threshold."
DLQ_HEADERS = [
    "__dlq.errors.topic",
    "__dlq.errors.partition",
    "__dlq.errors.offset",
    "__dlq.errors.group",
    "__dlq.errors.delivery.count",
    "__dlq.errors.message",
]


def configure_share_group(bootstrap: str, group: str, dlq: str, *, copy: bool = True) -> None:
    """The group's configs (IncrementalAlterConfigs on the GROUP resource); a broker that does
    not know them (older than 4.4) skips the test. ``copy=False`` keeps the broker's default:
    dead letters of headers only."""
    entries = {
        "errors.deadletterqueue.topic.name": dlq,
        "errors.deadletterqueue.copy.record.enable": "true" if copy else "false",
        "share.auto.offset.reset": "earliest",  # the records are produced before the join
        "share.delivery.count.limit": "2",
    }
    resource = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in entries.items()
        ],
    )
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(15)
    except KafkaException as exc:
        if "errors.deadletterqueue" in str(exc) or "INVALID_CONFIG" in str(exc):
            pytest.skip(f"the broker has no share-group dead-letter queues: {exc}")
        raise


def share_consume(
    consumer: ShareConsumer, decide: Callable[[int], AcknowledgeType]
) -> list[tuple[int, AcknowledgeType]]:
    """One poll, each record acknowledged as ``decide(offset)`` says, the acknowledgements
    committed; returns the (offset, ack) pairs handled."""
    handled: list[tuple[int, AcknowledgeType]] = []
    for msg in consumer.poll(0.5):
        offset = msg.offset()
        if msg.error() or offset is None:
            raise AssertionError(f"share consumer: {msg.error()}")
        ack = decide(offset)
        consumer.acknowledge(msg, ack)
        handled.append((offset, ack))
    if handled:
        consumer.commit_sync(10)
    return handled


def new_share_consumer(bootstrap: str, group: str) -> ShareConsumer:
    return ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
        }
    )


def dead_letter_by_share_group(bootstrap: str, group: str, topic: str) -> list[tuple[int, str]]:
    """Offsets 0 and 1 rejected; offset 2 released until the delivery limit archives it."""
    consumer = new_share_consumer(bootstrap, group)
    seen: list[tuple[int, str]] = []
    try:
        consumer.subscribe([topic])

        def settled() -> bool:
            for offset, ack in share_consume(
                consumer,
                lambda offset: AcknowledgeType.REJECT if offset < 2 else AcknowledgeType.RELEASE,
            ):
                seen.append((offset, "reject" if ack == AcknowledgeType.REJECT else "release"))
            return sorted(seen) == [(0, "reject"), (1, "reject"), (2, "release"), (2, "release")]

        wait_for(settled, 25, 0, f"share group {group} to reject and release its records")
    finally:
        consumer.close()
    return seen


def test_the_broker_dead_letters_a_share_groups_records_and_retryd_replays_one(
    bootstrap: str, tmp_path: Path
) -> None:
    env = Env(bootstrap, tmp_path / "state")
    env.create(main_partitions=2)
    dlq, share_group = f"dlq.{env.group}", f"{env.group}.workers"
    create_topics(bootstrap, [dlq], 1, config={"errors.deadletterqueue.group.enable": "true"})
    configure_share_group(bootstrap, share_group, dlq)
    rows = [(b"k%d" % i, b"v%d" % i, [("trace", b"t%d" % i)]) for i in range(3)]
    assert produce(bootstrap, env.main, rows, partition=1) == [(1, 0), (1, 1), (1, 2)]
    originals = read_topic(bootstrap, env.main, expect=3)

    dead_letter_by_share_group(bootstrap, share_group, env.main)
    # A second group keeps the broker's default (no copy of the record): it rejects offset 0,
    # whose dead letter then holds the headers only, and accepts the rest.
    bare_group = f"{env.group}.auditors"
    configure_share_group(bootstrap, bare_group, dlq, copy=False)
    bare = new_share_consumer(bootstrap, bare_group)
    try:
        bare.subscribe([env.main])
        acked: set[int] = set()

        def rejected_first() -> bool:
            acked.update(
                offset
                for offset, _ in share_consume(
                    bare,
                    lambda o: AcknowledgeType.REJECT if o == 0 else AcknowledgeType.ACCEPT,
                )
            )
            return acked == {0, 1, 2}

        wait_for(rejected_first, 25, 0, f"share group {bare_group} to reject offset 0")
    finally:
        bare.close()

    every: list[Record] = read_topic(bootstrap, dlq, expect=4)
    assert len(every) == 4
    (headers_only,) = [r for r in every if r.header("__dlq.errors.group") == bare_group.encode()]
    assert (headers_only.key, headers_only.value) == (None, None)
    assert [name for name, _ in headers_only.headers] == DLQ_HEADERS, headers_only.headers
    dead = [r for r in every if r is not headers_only]
    for i, rec in enumerate(sorted(dead, key=lambda r: int(r.header("__dlq.errors.offset") or 0))):
        # exactly these headers, in this order, all UTF-8 text; the original "trace" is gone
        assert [name for name, _ in rec.headers] == DLQ_HEADERS, rec.headers
        assert dict(rec.headers) == {
            "__dlq.errors.topic": env.main.encode(),
            "__dlq.errors.partition": b"1",
            "__dlq.errors.offset": str(i).encode(),
            "__dlq.errors.group": share_group.encode(),
            "__dlq.errors.delivery.count": b"2" if i == 2 else b"1",
            "__dlq.errors.message": LIMIT if i == 2 else REJECTED,
        }, rec.headers
        assert (rec.key, rec.value) == (b"k%d" % i, b"v%d" % i)  # copy.record.enable
        assert rec.timestamp >= originals[i].timestamp  # the DLQ write time, not the original's

    env.extra = {"RETRYD_FOREIGN_DEAD_LETTERS": json.dumps({dlq: "share_group"})}
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log").start()
    try:
        with sidecar.client() as c:
            page = c.get("/v1/failed", params={"topic": dlq, "limit": 10}).json()
            assert len(page["items"]) == 4 and not page["has_more"], pretty(page)
            (bare_item,) = [i for i in page["items"] if i["retryd"]["retryd_group"] == bare_group]
            # headers only: browsable, but a replay would send an empty record, so none is made
            refused = c.post(
                f"/v1/failed/{bare_item['partition']}/{bare_item['offset']}/replay",
                params={"topic": dlq},
            )
            assert refused.status_code == 422, refused.text
            assert refused.json()["error"] == "nothing_to_replay", refused.text
            assert "errors.deadletterqueue.copy.record.enable" in refused.json()["detail"]
            job = c.post(
                "/v1/replays",
                json={"topic": dlq, "filter": {"since_ms": bare_item["timestamp"]}},
            )
            assert job.status_code in (200, 201, 202), job.text
            ended = wait_job(c, job.json()["id"])
            assert ended["state"] == "completed", pretty(ended)
            assert ended["replayed"] == 0, pretty(ended)
            assert ended["skipped_reasons"] == {"no_payload": 1}, pretty(ended)
            page["items"].remove(bare_item)
            by_offset = {item["retryd"]["retryd_original_offset"]: item for item in page["items"]}
            assert sorted(by_offset) == [0, 1, 2], pretty(page)
            for offset, item in by_offset.items():
                assert item["format"] == "share_group" and item["mapping_problems"] == []
                mapped = item["retryd"]
                expected = {
                    "retryd_original_topic": env.main,
                    "retryd_original_partition": 1,
                    "retryd_group": share_group,
                    "retry_number": 1 if offset == 2 else 0,
                    "retryd_dead_reason": "exhausted" if offset == 2 else "non_retryable",
                    "retryd_error_message": (LIMIT if offset == 2 else REJECTED).decode(),
                }
                assert expected.items() <= mapped.items(), pretty(item)
                assert mapped.get("retryd_original_timestamp") is None, pretty(item)
                assert not [h for h in item["headers"] if h["name"].startswith("__dlq.")]
            rejected = c.get("/v1/failed", params={"topic": dlq, "dead_reason": "non_retryable"})
            assert len(rejected.json()["items"]) == 3, rejected.text  # both groups' rejects

            source = by_offset[0]
            done = c.post(
                f"/v1/failed/{source['partition']}/{source['offset']}/replay",
                params={"topic": dlq},
            )
            assert done.status_code == 200, done.text
            assert (done.json()["target_topic"], done.json()["target_partition"]) == (env.main, 1)
    finally:
        sidecar.stop()

    coordinate = f"{dlq}/{source['partition']}/{source['offset']}"
    copies = [
        r for r in read_topic(bootstrap, env.main, expect=4) if r.header(REPLAYED_FROM) is not None
    ]
    assert len(copies) == 1, copies
    (copy,) = copies
    assert (copy.partition, copy.key, copy.value) == (1, b"k0", b"v0")
    assert copy.header(REPLAYED_FROM) == coordinate.encode()
    names = [name for name, _ in copy.headers]
    assert REPLAY_ID in names and not [n for n in names if n.startswith("__dlq.")], names
