"""Benchmark: the retryd_kafka data source against a single-process confluent-kafka scan.

Produces N small records (default 1,000,000) to a fresh topic on the embedded broker (or
``--bootstrap`` / ``RETRYD_TEST_BOOTSTRAP``), then in the same run reads them

1. through Spark with the ``retryd_kafka`` source: ``count(*)`` and ``sum(length(value))``;
2. with one Python process and confluent-kafka ``consume()`` batches: the same two numbers;

and prints records/s for both and their ratio. Results go to ``bench/results/*.json``.
Not part of the test suite: ``python bench/bench_datasource.py [--records N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from retryd.policy.headers import Envelope, routed_headers

RESULTS = Path(__file__).resolve().parent / "results"


def produce(bootstrap: str, topic: str, records: int, partitions: int, with_headers: int) -> float:
    """Produce ``records`` ~100-byte records; every ``with_headers``-th carries retryd headers."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.num.messages": 10_000,
            "queue.buffering.max.messages": 500_000,
            "compression.type": "lz4",
            "acks": "1",
        }
    )
    headers = routed_headers(
        [], Envelope("orders", 0, 1, 1_700_000_000_000, 6, None, 1_700_000_000_001,
                     "TimeoutError", "timed out after 30s", "exhausted")
    )  # fmt: skip
    value = b"x" * 90
    errors: list[Any] = []

    def done(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    started = time.monotonic()
    for i in range(records):
        kwargs: dict[str, Any] = {"key": b"%08d" % i, "value": value, "partition": i % partitions}
        if with_headers and i % with_headers == 0:
            kwargs["headers"] = headers
        while True:
            try:
                producer.produce(topic, on_delivery=done, **kwargs)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(300)
    if left or errors:
        raise SystemExit(f"produce failed: {left} unacknowledged, errors {errors[:3]}")
    return time.monotonic() - started


def raw_scan(bootstrap: str, topic: str, partitions: int) -> tuple[int, int, float]:
    """One process, no Spark: (records, value bytes, seconds) reading every partition to EOF."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
        }
    )
    started = time.monotonic()
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    count = size = 0
    eof: set[int] = set()
    while len(eof) < partitions:
        for msg in consumer.consume(10_000, 1.0):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    eof.add(msg.partition() or 0)
                    continue
                raise SystemExit(f"raw scan: {err}")
            count += 1
            size += len(msg.value() or b"")
    elapsed = time.monotonic() - started
    consumer.close()
    return count, size, elapsed


def spark_read(spark: Any, bootstrap: str, topic: str, chunk: int | None) -> tuple[int, int, float]:
    from pyspark.sql import functions as F

    from retryd.pipeline.source import kafka_options, read_kafka

    started = time.monotonic()
    opts = kafka_options({"bootstrap.servers": bootstrap}, [topic], maxRecordsPerPartition=chunk)
    row = read_kafka(spark, opts).agg(F.count(F.lit(1)), F.sum(F.length("value"))).collect()[0]
    return int(row[0]), int(row[1] or 0), time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=250_000, help="maxRecordsPerPartition")
    parser.add_argument("--with-headers", type=int, default=10, help="1 in N records (0: none)")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--bootstrap", default=os.environ.get("RETRYD_TEST_BOOTSTRAP"))
    args = parser.parse_args()

    from retryd.kafka.embedded import EmbeddedBroker
    from retryd.pipeline.session import build_session, check_runtime, stop_session

    check_runtime(os.environ)
    broker = None if args.bootstrap else EmbeddedBroker().start()
    bootstrap = args.bootstrap or broker.bootstrap  # type: ignore[union-attr]
    spark = None
    try:
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(30)
        print(f"producing {args.records:,} records to {topic} ({args.partitions} partitions)...")
        produce_s = produce(bootstrap, topic, args.records, args.partitions, args.with_headers)
        print(f"  produced in {produce_s:.1f}s ({args.records / produce_s:,.0f} records/s)")

        raw_count, raw_bytes, raw_s = raw_scan(bootstrap, topic, args.partitions)
        print(f"raw confluent-kafka scan: {raw_count:,} records in {raw_s:.2f}s")

        t0 = time.monotonic()
        spark = build_session(args.master, "retryd-bench", {"spark.ui.enabled": "false"})
        start_s = time.monotonic() - t0
        runs = []
        for attempt in ("cold", "warm"):
            count, size, seconds = spark_read(spark, bootstrap, topic, args.chunk)
            runs.append({"run": attempt, "records": count, "value_bytes": size, "seconds": seconds})
            print(f"retryd_kafka via Spark ({attempt}): {count:,} records in {seconds:.2f}s")
            if (count, size) != (raw_count, raw_bytes):
                raise SystemExit(f"mismatch: spark {count}/{size} vs raw {raw_count}/{raw_bytes}")
        best = min(r["seconds"] for r in runs)
        result = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "records": args.records,
            "partitions": args.partitions,
            "max_records_per_partition": args.chunk,
            "headers_one_in": args.with_headers,
            "broker": "external" if args.bootstrap else "embedded tansu",
            "master": args.master,
            "spark_version": spark.version,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "produce_records_per_s": round(args.records / produce_s),
            "raw_scan": {"seconds": raw_s, "records_per_s": round(raw_count / raw_s)},
            "spark_session_start_s": start_s,
            "spark_runs": runs,
            "spark_records_per_s": round(raw_count / best),
            "ratio_spark_to_raw": round(raw_s / best, 3),
        }
        print(
            f"\nraw scan {result['raw_scan']['records_per_s']:,} records/s | "
            f"retryd_kafka {result['spark_records_per_s']:,} records/s | "
            f"ratio {result['ratio_spark_to_raw']:.2f}x"
        )
        RESULTS.mkdir(parents=True, exist_ok=True)
        out = RESULTS / f"datasource-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"results written to {out}")
    finally:
        if spark is not None:
            stop_session(spark)
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    sys.exit(main())
