"""Kafka Connect's own dead letters, read and replayed by retryd.

The other foreign-format tests write ``__connect.errors.*`` headers by hand, as retryd's
authors read them in Connect's source. Here a real Kafka Connect worker (standalone, the test
broker's release, tests/integration/connect_support.py) runs a sink connector with the JSON
converter, ``errors.tolerance=all`` and a dead letter queue with context headers: the records
that are not JSON fail in its VALUE_CONVERTER stage and Connect writes them to the DLQ. The
tests check those headers are the ones retryd maps, then browse and replay them through a real
``retryd sidecar`` configured with ``foreign_dead_letters = {<dlq> = "connect"}``.

One Connect run and one sidecar serve the module; Connect is stopped (by PID) as soon as its
dead letters are in, before the sidecar starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from retryd.kafka.apache import resolve_version
from retryd.policy import foreign as f
from retryd.policy import headers as h
from retryd.policy.headers import REPLAY_ID, REPLAYED_FROM
from tests.integration.connect_support import SINK_CONNECTOR, ConnectStandalone, has_javac
from tests.integration.sidecar_support import Env, SidecarProcess, pretty
from tests.support import ON_TANSU, Record, create_topics, produce, read_topic, unique, wait_for

VERSION = resolve_version(None)

pytestmark = [
    pytest.mark.skipif(ON_TANSU, reason="Kafka Connect needs Apache Kafka, not Tansu"),
    pytest.mark.skipif(
        not VERSION.startswith("4.4."),
        reason=f"the Connect worker is pinned to the 4.4 line; the broker is {VERSION}",
    ),
    pytest.mark.skipif(
        not has_javac(),
        reason="no JDK (javac) to build the test sink connector: scripts/test installs "
        "openjdk-17-jdk-headless as root, or set RETRYD_KAFKA_JAVA to a JDK's java",
    ),
]

# Connect's JSON converter, schemas.enable=false: these convert, these fail at VALUE_CONVERTER.
VALID = [b'{"id": 1}', b'{"id": 2}', b'{"id": 3}']
INVALID = [b"not json", b'{"id": 4']
CONNECT_HEADERS = [
    f.CONNECT_TOPIC,
    f.CONNECT_PARTITION,
    f.CONNECT_OFFSET,
    f.CONNECT_CONNECTOR,
    f.CONNECT_TASK,
    f.CONNECT_STAGE,
    f.CONNECT_CLASS,
    f.CONNECT_EXCEPTION,
    f.CONNECT_MESSAGE,
    f.CONNECT_STACKTRACE,
]
DATA_EXCEPTION = "org.apache.kafka.connect.errors.DataException"
JSON_CONVERTER = "org.apache.kafka.connect.json.JsonConverter"
CONVERTER_MESSAGE = "Converting byte[] to Kafka Connect data failed due to serialization error"


@dataclass
class ConnectRun:
    """What one Connect run left behind: the sources and the dead letters it wrote."""

    env: Env
    dlq: str
    connector: str
    originals: dict[tuple[int, int], Record]  # (partition, offset) in env.main -> record
    dead: list[Record]
    sink_lines: list[str]


@pytest.fixture(scope="module")
def run(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> ConnectRun:
    work = tmp_path_factory.mktemp("connect")
    env = Env(bootstrap, work / "state")
    env.create(main_partitions=2)
    dlq = f"{env.group}.connect-dlq"
    create_topics(bootstrap, [dlq], 1)
    # partition 0: valid, invalid (with a header of its own), valid; partition 1: the rest
    produce(
        bootstrap,
        env.main,
        [(b"k1", VALID[0]), (b"bad-1", INVALID[0], [("trace", b"t-1")]), (b"k2", VALID[1])],
        partition=0,
    )
    produce(bootstrap, env.main, [(b"bad-2", INVALID[1]), (b"k3", VALID[2])], partition=1)
    originals = {(r.partition, r.offset): r for r in read_topic(bootstrap, env.main, expect=5)}
    name = unique("orders-sink")
    sink = work / "sink.txt"
    connector = {
        "name": name,
        "connector.class": SINK_CONNECTOR,
        "tasks.max": "1",
        "topics": env.main,
        "file": str(sink),
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
        "errors.tolerance": "all",
        "errors.deadletterqueue.topic.name": dlq,
        "errors.deadletterqueue.topic.replication.factor": "1",
        "errors.deadletterqueue.context.headers.enable": "true",
    }
    with ConnectStandalone(bootstrap, work / "worker", connector, version=VERSION):
        dead = read_topic(bootstrap, dlq, expect=len(INVALID), timeout=30)

        def sunk() -> list[str]:
            lines = sink.read_text().splitlines() if sink.exists() else []
            return lines if len(lines) >= len(VALID) else []

        lines = wait_for(sunk, 30, 0.1, "the sink to write the valid records")
    env.extra = {"RETRYD_FOREIGN_DEAD_LETTERS": f"{dlq}=connect"}
    return ConnectRun(env, dlq, name, originals, dead, lines)


@pytest.fixture(scope="module")
def sidecar(run: ConnectRun, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    log = tmp_path_factory.mktemp("connect-sidecar") / "sidecar.log"
    proc = SidecarProcess(run.env, log).start()
    try:
        yield proc
    finally:
        proc.stop()


def test_real_connect_dead_letters_carry_the_headers_retryd_maps(run: ConnectRun) -> None:
    """Names, order and values of what Connect 4.4 writes, and retryd's reading of them."""
    assert sorted(run.sink_lines) == ["{id=1}", "{id=2}", "{id=3}"], run.sink_lines
    assert sorted(r.value or b"" for r in run.dead) == sorted(INVALID)
    for dead in run.dead:
        values = dict(dead.headers)
        position = (int(values[f.CONNECT_PARTITION] or b""), int(values[f.CONNECT_OFFSET] or b""))
        original = run.originals[position]
        own = [name for name, _ in original.headers]
        # the original's headers first, untouched, then Connect's context, each once
        assert [name for name, _ in dead.headers] == own + CONNECT_HEADERS, dead.headers
        assert dead.headers[: len(own)] == original.headers
        assert (dead.key, dead.value, dead.timestamp) == (
            original.key,
            original.value,
            original.timestamp,
        )
        assert {k: values[k] for k in CONNECT_HEADERS[:-1]} == {
            f.CONNECT_TOPIC: run.env.main.encode(),
            f.CONNECT_PARTITION: str(original.partition).encode(),
            f.CONNECT_OFFSET: str(original.offset).encode(),
            f.CONNECT_CONNECTOR: run.connector.encode(),
            f.CONNECT_TASK: b"0",
            f.CONNECT_STAGE: b"VALUE_CONVERTER",
            f.CONNECT_CLASS: JSON_CONVERTER.encode(),
            f.CONNECT_EXCEPTION: DATA_EXCEPTION.encode(),
            f.CONNECT_MESSAGE: f"{CONVERTER_MESSAGE}: ".encode(),
        }
        assert (values[f.CONNECT_STACKTRACE] or b"").startswith(
            f"{DATA_EXCEPTION}: {CONVERTER_MESSAGE}".encode()
        )

        assert f.detect(dead.headers) is f.ForeignFormat.CONNECT
        mapped = f.to_dead_letter_fields(
            f.ForeignFormat.CONNECT, dead.headers, timestamp=dead.timestamp
        )
        assert mapped.problems == ()
        assert mapped.fields == {
            h.ORIGINAL_TOPIC: run.env.main,
            h.ORIGINAL_PARTITION: original.partition,
            h.ORIGINAL_OFFSET: original.offset,
            h.ORIGINAL_TIMESTAMP: original.timestamp,
            h.ERROR_CLASS: DATA_EXCEPTION,
            h.ERROR_MESSAGE: f"{CONVERTER_MESSAGE}: ",
            h.DEAD_REASON: h.DEAD_MALFORMED,
            h.RETRY_NUMBER: None,
            h.GROUP: f"connect-{run.connector}",
        }
        assert f.strip_foreign(f.ForeignFormat.CONNECT, dead.headers) == original.headers


def test_sidecar_browses_and_replays_what_connect_dead_lettered(
    run: ConnectRun, sidecar: SidecarProcess
) -> None:
    main, dlq = run.env.main, run.dlq
    with sidecar.client() as c:
        page = c.get("/v1/failed", params={"topic": dlq, "limit": 50}).json()
        items = page["items"]
        assert len(items) == len(INVALID) and not page["has_more"], pretty(page)
        for item in items:
            assert item["format"] == "connect" and item["mapping_problems"] == [], pretty(item)
            env = item["retryd"]
            original = run.originals[
                (env["retryd_original_partition"], env["retryd_original_offset"])
            ]
            assert env["retryd_original_topic"] == main
            assert env["retryd_original_timestamp"] == original.timestamp
            assert env["retryd_error_class"] == DATA_EXCEPTION
            assert env["retryd_dead_reason"] == "malformed"
            assert env["retryd_group"] == f"connect-{run.connector}"
            assert not [x for x in item["headers"] if x["name"].startswith(f.CONNECT_PREFIX)]
        filtered = c.get(
            "/v1/failed",
            params={"topic": dlq, "dead_reason": "malformed", "original_topic": main},
        ).json()
        assert len(filtered["items"]) == len(INVALID), pretty(filtered)

        # the dead letter of the record with its own header: one read, then one replay
        (traced,) = [i for i in items if i["headers"]]
        one = c.get(f"/v1/failed/0/{traced['offset']}", params={"topic": dlq}).json()
        assert one["retryd"] == traced["retryd"], pretty(one)
        assert [(x["name"], x["data"]) for x in one["headers"]] == [("trace", "t-1")]
        source = (
            one["retryd"]["retryd_original_partition"],
            one["retryd"]["retryd_original_offset"],
        )
        done = c.post(f"/v1/failed/0/{traced['offset']}/replay", params={"topic": dlq})
        assert done.status_code == 200, done.text
        out = done.json()
        assert (out["target_topic"], out["target_partition"]) == (main, source[0]), out
        again = c.get(f"/v1/failed/0/{traced['offset']}", params={"topic": dlq}).json()
        assert again["replayed"] is not None, pretty(again)

    coordinate = f"{dlq}/0/{traced['offset']}"
    (copy,) = [r for r in read_topic(run.env.bootstrap, main, expect=6) if r.header(REPLAYED_FROM)]
    original = run.originals[source]
    assert (copy.partition, copy.key, copy.value) == (source[0], original.key, original.value)
    names = [name for name, _ in copy.headers]
    assert not [n for n in names if n.startswith(f.CONNECT_PREFIX)], copy.headers
    assert copy.header(REPLAYED_FROM) == coordinate.encode()
    assert copy.header("trace") == b"t-1" and REPLAY_ID in names
