"""Issue 15 against a real broker and a real `retryd sidecar`: failed records with hostile
retryd headers (5,000-digit numbers, non-UTF-8 values, null and empty values, odd and
repeated names, thousands of headers, header *names* that are not UTF-8) are listed by
``GET /v1/failed``, shown by ``GET /v1/failed/{partition}/{offset}``, and a bulk replay job
over them completes with every record replayed or skipped with a reason, the sidecar alive.

Names that are not UTF-8 cannot be produced with confluent-kafka (it encodes ``str`` names),
so those records are produced through librdkafka's C API (the library in the wheel)."""

from __future__ import annotations

import ctypes
import glob
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import httpx
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from tests.integration.sidecar_support import Env, SidecarProcess, pretty, seed, wait_job
from tests.support import read_topic, unique

HUGE = b"9" * 5000
INT_NAMES = [
    "retry_number",
    "retry_timestamp",
    "retryd_original_partition",
    "retryd_original_offset",
    "retryd_original_timestamp",
    "retryd_first_failure_timestamp",
]
TEXT_NAMES = ["retryd_original_topic", "retryd_error_class", "retryd_error_message"]
ODD_NAMES = ["", " ", "crlf\r\nX-Injected", "n" * 1000, "grüße", "emoji-🙂", "retryd_\u00e9"]
MANY = 2000

# --- librdkafka through ctypes: produce header names that are arbitrary bytes ------------------


class _Header(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("val", ctypes.c_void_p), ("size", ctypes.c_ssize_t)]


class _Mem(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class _Union(ctypes.Union):  # rd_kafka_vu_t's union, padded to 64 bytes like the C one
    _fields_ = [
        ("cstr", ctypes.c_char_p),
        ("i", ctypes.c_int),
        ("i32", ctypes.c_int32),
        ("mem", _Mem),
        ("header", _Header),
        ("_pad", ctypes.c_char * 64),
    ]


class _VU(ctypes.Structure):  # rd_kafka_vu_t
    _fields_ = [("vtype", ctypes.c_int), ("u", _Union)]


VTYPE_TOPIC, VTYPE_PARTITION, VTYPE_VALUE, VTYPE_KEY, VTYPE_MSGFLAGS, VTYPE_HEADER = (
    1,
    3,
    4,
    5,
    7,
    9,
)
MSG_F_COPY = 0x2


def _librdkafka() -> ctypes.CDLL:
    libs = os.path.dirname(confluent_kafka.__file__) + ".libs"
    found = glob.glob(os.path.join(libs, "librdkafka*.so*"))
    if not found:
        pytest.skip(f"no bundled librdkafka in {libs}")
    lib = ctypes.CDLL(found[0])
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, *[ctypes.c_char_p] * 3, ctypes.c_size_t]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_produceva.restype = ctypes.c_void_p
    lib.rd_kafka_produceva.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    lib.rd_kafka_error_string.restype = ctypes.c_char_p
    lib.rd_kafka_error_string.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_error_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_flush.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    return lib


def produce_raw(
    bootstrap: str,
    topic: str,
    records: list[tuple[bytes, bytes, list[tuple[bytes, bytes | None]]]],
    partition: int = 0,
) -> None:
    """Produce ``(key, value, [(name bytes, value)])`` records with librdkafka's C API."""
    lib = _librdkafka()
    err = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    for k, v in ((b"bootstrap.servers", bootstrap.encode()), (b"acks", b"all")):
        assert lib.rd_kafka_conf_set(conf, k, v, err, 512) == 0, err.value
    rk = lib.rd_kafka_new(0, conf, err, 512)  # RD_KAFKA_PRODUCER; owns conf from here
    assert rk, err.value
    keep: list[Any] = []  # buffers live until produceva copied them (MSG_F_COPY, headers)
    try:
        for key, value, headers in records:
            vus = (_VU * (5 + len(headers)))()
            vus[0].vtype, vus[0].u.cstr = VTYPE_TOPIC, topic.encode()
            vus[1].vtype, vus[1].u.i32 = VTYPE_PARTITION, partition
            vus[2].vtype, vus[2].u.i = VTYPE_MSGFLAGS, MSG_F_COPY
            for i, (vtype, data) in enumerate(((VTYPE_KEY, key), (VTYPE_VALUE, value)), 3):
                buf = ctypes.create_string_buffer(data, len(data))
                keep.append(buf)
                vus[i].vtype = vtype
                vus[i].u.mem.ptr, vus[i].u.mem.size = ctypes.cast(buf, ctypes.c_void_p), len(data)
            for i, (name, hval) in enumerate(headers, 5):
                assert b"\0" not in name  # librdkafka takes the name as a C string
                name_buf = ctypes.create_string_buffer(name)
                keep.append(name_buf)
                vus[i].vtype = VTYPE_HEADER
                vus[i].u.header.name = ctypes.cast(name_buf, ctypes.c_char_p)
                if hval is not None:
                    val_buf = ctypes.create_string_buffer(hval, max(len(hval), 1))
                    keep.append(val_buf)
                    vus[i].u.header.val = ctypes.cast(val_buf, ctypes.c_void_p)
                    vus[i].u.header.size = len(hval)
            error = lib.rd_kafka_produceva(rk, vus, len(vus))
            if error:
                text = lib.rd_kafka_error_string(error)
                lib.rd_kafka_error_destroy(error)
                raise AssertionError(f"produceva: {text!r}")
        assert lib.rd_kafka_flush(rk, 30_000) == 0, "raw produce did not flush"
    finally:
        lib.rd_kafka_destroy(rk)


def keys_in(bootstrap: str, topic: str, partition: int = 0, timeout: float = 20) -> list[bytes]:
    """The keys of a partition, read to its end (``headers()`` is never called: on a name
    that is not UTF-8 it raises), in offset order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique("keys"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
    keys: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return keys
                raise AssertionError(f"reading {topic}: {error}")
            keys.append(msg.key() or b"")
    finally:
        consumer.close()
    raise AssertionError(f"{topic}[{partition}] not read to its end in {timeout}s")


# --- the deployment ----------------------------------------------------------------------------


@pytest.fixture
def deployment(bootstrap: str, tmp_path: Path) -> Env:
    return Env(bootstrap, tmp_path / "state").create(failed_partitions=1, main_partitions=2)


@pytest.fixture
def sidecar(deployment: Env, tmp_path: Path) -> Iterator[SidecarProcess]:
    proc = SidecarProcess(deployment, tmp_path / "sidecar.log")
    yield proc
    proc.stop()


Spec = dict[str, tuple[list[tuple[Any, bytes | None]], bool]]


def hostile_records(env: Env) -> Spec:
    """key -> (headers, replayable). Replayable: the last retryd_original_topic is env.main."""
    main = env.main.encode()
    both: list[tuple[Any, bytes | None]] = [("retryd_dead_reason", b"exhausted")]
    huge: list[tuple[Any, bytes | None]] = [(n, HUGE) for n in INT_NAMES]
    many: list[tuple[Any, bytes | None]] = [(f"h{i}", b"v") for i in range(MANY)]
    return {
        "huge-digits": ([*huge, ("retryd_original_topic", main)], True),
        "non-utf8-values": ([(n, b"\xff\xfe\xc3(") for n in INT_NAMES + TEXT_NAMES], False),
        "null-values": ([(n, None) for n in INT_NAMES + TEXT_NAMES], False),
        "empty-values": ([(n, b"") for n in INT_NAMES + TEXT_NAMES], False),
        "odd-and-repeated-names": (
            [(n, b"odd") for n in ODD_NAMES]
            + [("retry_number", HUGE), ("retry_number", b"\xff"), ("retry_number", b"3")]
            + [("retryd_original_topic", b"\xff"), ("retryd_original_topic", b"a b")]
            + [("retryd_original_topic", main), ("dup", b"1"), ("dup", None)]
            + both,
            True,
        ),
        "many-headers": (
            [*many, ("retryd_original_offset", HUGE), ("retryd_original_topic", main)],
            True,
        ),
    }


def raw_records(env: Env) -> dict[str, tuple[list[tuple[bytes, bytes | None]], bool]]:
    main = env.main.encode()
    return {
        "raw-bad-names": (
            [
                (b"trace", b"t"),
                (b"bad\xff\xfe", b"x"),
                (b"retryd_original_topic", main),
                (b"\xc3", None),
                (b"retry_number", HUGE),
                (b"retryd_\xff", b"y"),
            ],
            True,
        ),
        "raw-bad-names-no-topic": ([(b"\xff", b"1"), (b"retryd_original_topic", b"\xff")], False),
    }


def all_pages(client: httpx.Client) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(100):
        params: dict[str, Any] = {"limit": 3, "preview_bytes": 64}
        if cursor:
            params["cursor"] = cursor
        r = client.get("/v1/failed", params=params)
        assert r.status_code == 200, r.text[:2000]
        body = r.json()
        items += body["items"]
        if not body["has_more"]:
            return items
        cursor = body["next_cursor"]
    raise AssertionError("browse did not reach the end in 100 pages")


def test_hostile_headers_are_browsed_shown_and_replayed(
    deployment: Env, sidecar: SidecarProcess
) -> None:
    env = deployment
    plain = hostile_records(env)
    raw = raw_records(env)
    seed(
        env.bootstrap,
        env.failed,
        [(k.encode(), b"v-" + k.encode(), hs) for k, (hs, _) in plain.items()],
        partition=0,
    )
    produce_raw(
        env.bootstrap,
        env.failed,
        [(k.encode(), b"v-" + k.encode(), hs) for k, (hs, _) in raw.items()],
    )
    total = len(plain) + len(raw)
    assert keys_in(env.bootstrap, env.failed) == [k.encode() for k in [*plain, *raw]]
    replayable = {k for k, (_, ok) in {**plain, **raw}.items() if ok}

    sidecar.start()
    with sidecar.client() as client:
        # Browse: every record listed, 200 on every page.
        items = all_pages(client)
        by_key = {i["key"]["data"]: i for i in items}
        assert sorted(by_key) == sorted([*plain, *raw]), pretty(items)
        assert [i["coordinate"] for i in items] == [f"{env.failed}/0/{o}" for o in range(total)]
        huge = by_key["huge-digits"]["retryd"]
        assert all(huge[n] is None for n in INT_NAMES) and huge["retryd_original_topic"] == env.main
        assert by_key["null-values"]["retryd"] == dict.fromkeys(INT_NAMES + TEXT_NAMES)
        odd = by_key["odd-and-repeated-names"]
        assert odd["retryd"]["retry_number"] == 3 and odd["retryd"]["retryd_\u00e9"] == "odd"
        assert [h["name"] for h in odd["headers"]] == [*ODD_NAMES[:-1], "dup", "dup"]
        assert len(by_key["many-headers"]["headers"]) == MANY
        bad = by_key["raw-bad-names"]
        assert bad["headers_error"] == "3 header(s) dropped: their names are not UTF-8"
        assert bad["retryd"] == {"retryd_original_topic": env.main, "retry_number": None}
        assert bad["headers"] == [
            {"name": "trace", "encoding": "utf-8", "data": "t", "size": 1, "truncated": False}
        ]
        assert all(i["headers_error"] is None for k, i in by_key.items() if not k.startswith("raw"))

        # One record at a time: 200 for each, the same view.
        for offset, item in enumerate(items):
            r = client.get(f"/v1/failed/0/{offset}", params={"preview_bytes": 64})
            assert r.status_code == 200, r.text[:2000]
            one = r.json()
            assert one["retryd"] == item["retryd"] and one["headers"] == item["headers"]
            assert one["headers_error"] == item["headers_error"]

        # A bulk job over all of them: completes, each record replayed or skipped with a reason.
        r = client.post("/v1/replays", json={"filter": {}, "max_per_second": 1000})
        assert r.status_code == 202, r.text
        job = wait_job(client, r.json()["id"])
        assert job["state"] == "completed", pretty(job)
        assert job["matched"] == total and job["failed"] == 0, pretty(job)
        assert job["replayed"] == len(replayable), pretty(job)
        assert job["skipped_reasons"] == {"no_valid_target": total - len(replayable)}, pretty(job)
        assert job["replayed"] + job["skipped"] == total
        assert client.get("/healthz").status_code == 200

    copies = read_topic(env.bootstrap, env.main, expect=len(replayable))
    assert sorted(c.key.decode() for c in copies if c.key) == sorted(replayable)
    for copy in copies:
        assert copy.header("retry_number") is None and copy.header("retryd_replay_id") is not None
    raw_copy = next(c for c in copies if c.key == b"raw-bad-names")
    assert [n for n, _ in raw_copy.headers if not n.startswith("retryd_")] == ["trace"]
    assert sidecar.proc is not None and sidecar.proc.poll() is None
    sidecar.stop()
    log = sidecar.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "internal error" not in log, log[-3000:]
