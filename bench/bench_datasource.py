"""Benchmark: the retryd_kafka data source against a single-process confluent-kafka scan and
against Spark's own Kafka connector.

Produces N small records (default 1,000,000, ~100 B values, 4 partitions, 1 in 10 with retryd
headers) to a fresh topic on the benchmarks' broker (Apache Kafka, one KRaft node, started here;
``RETRYD_BENCH_BROKER=tansu`` for the embedded Tansu; ``--bootstrap`` / ``RETRYD_TEST_BOOTSTRAP``
for an existing cluster), then, in the same run and interleaved so that load from other
processes hits every side alike:

- **raw (default)**: one Python process, one consumer assigned all partitions, ``consume()``
  batches of 10,000, librdkafka's default fetch settings: records and value bytes;
- **raw (tuned)**: the same loop with the fetch settings the data source uses
  (``retryd.pipeline.kafka_io.READ_TUNING``), so fetch tuning alone cannot explain a ratio;
- **Spark, retryd_kafka**: ``count(*)`` and ``sum(length(value))`` through
  ``spark.read.format("retryd_kafka")``; **cold** is the first read of a fresh SparkSession
  (Python workers start, JIT is cold), **warm** a later read in the same session;
- **Spark, native** (``--source native``): the same query through
  ``retryd.pipeline.source.read_kafka(..., source="native")``: Spark's Kafka connector
  (``spark.read.format("kafka")``, headers included) mapped to the retryd_kafka columns;
  cold and warm as above, in sessions of their own;
- **Spark, plain connector**: ``spark.read.format("kafka")`` with its default options (no
  headers), warm, in the native sessions.

The connector is ``org.apache.spark:spark-sql-kafka-0-10_2.13`` at the installed PySpark's
version (or the newest published one before it when that version is not on Maven Central:
``tests.integration.spark_connector``), resolved from Maven Central through
``spark.jars.packages`` (every session of the run gets it, so the JVMs are alike).

Sessions alternate retryd_kafka / native (ABBA...); each gives one cold and ``--warm`` warm
reads of its source (native sessions: also ``--warm`` plain reads), every Spark read is followed
by both raw scans, and every read's count and byte sum are checked equal to the raw scan's.
Reported: medians, ratios raw/Spark of the medians (>1: Spark faster) and native/retryd_kafka
(>1: retryd_kafka faster). Results go to ``bench/results/datasource-<broker>-<time>.json``.

``--quick`` runs the whole harness on 20,000 records with one session per source in seconds: a
smoke test that the harness works, not a measurement. The test suite runs it in its own Spark
session, which the harness then uses instead of starting one; that session has no connector,
so the native reads are skipped there (and the result says so).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import confluent_kafka
import pyarrow
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness as h  # noqa: E402
from retryd.pipeline.native import CONNECTOR  # noqa: E402
from retryd.policy.headers import Envelope, routed_headers  # noqa: E402
from tests.integration.spark_connector import connector  # noqa: E402

RESULTS = ROOT / "bench" / "results"
# consume() returns when it has its 10,000 records or at this timeout: with the 1 s used before,
# the last, partial batch of every scan waited the whole second (on Apache Kafka 4.4.0, 20,000
# records: 1.55 s, of which 1.0 s after the last end-of-partition event); the data source's
# reader uses 0.2 s (``retryd.pipeline.kafka_io._POLL_S``), and so does the raw scan now.
RAW_CONSUME_TIMEOUT_S = 0.2
SPARK_CONF = {"spark.ui.enabled": "false"}
# Recorded with the results: what the session actually ran with (retryd's defaults included).
EFFECTIVE_CONF = (
    "spark.master",
    "spark.python.worker.reuse",
    "spark.sql.execution.arrow.pyspark.enabled",
    "spark.sql.session.timeZone",
)


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


def raw_scan(
    bootstrap: str, topic: str, partitions: int, tuning: Mapping[str, Any] | None = None
) -> tuple[int, int, float]:
    """One process, no Spark: (records, value bytes, seconds) reading every partition to EOF."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
            **(tuning or {}),
        }
    )
    started = time.monotonic()
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    count = size = 0
    eof: set[int] = set()
    while len(eof) < partitions:
        for msg in consumer.consume(10_000, RAW_CONSUME_TIMEOUT_S):
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


def spark_read(
    spark: Any, bootstrap: str, topic: str, chunk: int | None, source: str = "python"
) -> tuple[int, int, float]:
    """count(*) and sum(length(value)) through ``read_kafka``: retryd_kafka (``python``) or
    Spark's connector mapped to the same columns (``native``)."""
    from pyspark.sql import functions as F

    from retryd.pipeline.source import kafka_options, read_kafka

    started = time.monotonic()
    opts = kafka_options({"bootstrap.servers": bootstrap}, [topic], maxRecordsPerPartition=chunk)
    df = read_kafka(spark, opts, source)
    row = df.agg(F.count(F.lit(1)), F.sum(F.length("value"))).collect()[0]
    return int(row[0]), int(row[1] or 0), time.monotonic() - started


def plain_kafka_read(
    spark: Any, bootstrap: str, topic: str, chunk: int | None
) -> tuple[int, int, float]:
    """The same query on ``spark.read.format("kafka")`` as its documentation shows it: default
    options (no headers), the same task split."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
    )
    if chunk:
        reader = reader.option("maxRecordsPerPartition", str(chunk))
    row = reader.load().agg(F.count(F.lit(1)), F.sum(F.length("value"))).collect()[0]
    return int(row[0]), int(row[1] or 0), time.monotonic() - started


def has_connector(spark: Any) -> bool:
    return CONNECTOR in (spark.conf.get("spark.jars.packages", "") or "")


def active_session() -> Any:
    """A SparkSession already running in this process (then it is used, and not stopped)."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


SERIES = (
    "raw_default",
    "raw_tuned",
    "spark_cold",
    "spark_warm",
    "native_cold",
    "native_warm",
    "kafka_plain_warm",
)


def summarize(samples: dict[str, list[float]]) -> dict[str, Any]:
    """Medians per series; ratios raw/Spark of the medians (>= 0.8 is the target) and
    connector/retryd_kafka (above 1: retryd_kafka is faster)."""
    med = {name: median(values) for name, values in samples.items() if values}
    ratios = {
        f"{raw}_over_{spark}": round(med[raw] / med[spark], 3)
        for raw in ("raw_default", "raw_tuned")
        for spark in ("spark_warm", "spark_cold", "native_warm", "native_cold", "kafka_plain_warm")
        if raw in med and spark in med
    }
    for native, ours in (
        ("native_warm", "spark_warm"),
        ("native_cold", "spark_cold"),
        ("kafka_plain_warm", "spark_warm"),
    ):
        if native in med and ours in med:
            ratios[f"{native}_over_{ours}"] = round(med[native] / med[ours], 3)
    return {
        "median_seconds": {k: round(v, 3) for k, v in med.items()},
        "samples_seconds": {k: [round(x, 3) for x in v] for k, v in samples.items() if v},
        "ratios": ratios,
    }


def session_plan(runs: int, native: bool) -> list[str]:
    """Which source each session reads: retryd_kafka and native in ABBA order, so drift over
    the run (other load, the broker's page cache, JIT) does not favour either."""
    if not native:
        return ["python"] * runs
    plan: list[str] = []
    for i in range(runs):
        pair = ["python", "native"] if i % 2 == 0 else ["native", "python"]
        plan += pair
    return plan


def session_reads(source: str, warm: int) -> list[str]:
    """The reads of one session, in order: its source cold, then warm (native sessions: each
    warm read followed by one through the plain connector)."""
    prefix = "native" if source == "native" else "spark"
    reads = [f"{prefix}_cold"]
    for _ in range(warm):
        reads.append(f"{prefix}_warm")
        if source == "native":
            reads.append("kafka_plain_warm")
    return reads


def run(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    from retryd.pipeline.session import check_runtime

    check_runtime(os.environ)
    if args.bootstrap:
        os.environ["RETRYD_TEST_BOOTSTRAP"] = args.bootstrap
    with h.broker(args.quick) as bootstrap:
        result = measure(args, bootstrap, log)
    result["broker"] = h.broker_info(args.quick)
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return result


def measure(args: argparse.Namespace, bootstrap: str, log: Callable[[str], None]) -> dict[str, Any]:
    from retryd.pipeline.kafka_io import READ_TUNING
    from retryd.pipeline.options import DEFAULT_BATCH_ROWS
    from retryd.pipeline.session import build_session, stop_session

    samples: dict[str, list[float]] = {k: [] for k in SERIES}
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(30)
    log(f"producing {args.records:,} records to {topic} ({args.partitions} partitions)...")
    produce_s = produce(bootstrap, topic, args.records, args.partitions, args.with_headers)
    log(f"  produced in {produce_s:.1f}s ({args.records / produce_s:,.0f} records/s)")
    expected: tuple[int, int] | None = None

    def raw_pair() -> None:
        nonlocal expected
        for name, tuning in (("raw_default", None), ("raw_tuned", READ_TUNING)):
            count, size, seconds = raw_scan(bootstrap, topic, args.partitions, tuning)
            if expected is None:
                expected = (count, size)
            if (count, size) != expected or count != args.records:
                raise SystemExit(f"raw scan read {count}/{size}, expected {expected}")
            samples[name].append(seconds)
            log(f"  {name:12s} {count:,} records in {seconds:.2f}s")

    reused = active_session()  # e.g. the test suite's: reads are then never cold
    native = args.native and (reused is None or has_connector(reused))
    why_not = None
    if args.native and not native:
        why_not = "the running Spark session (reused) has no Kafka connector"
    found = connector() if native else None
    if found is not None and found.note:
        log(f"connector: {found.note}")
    package = found.package if found is not None else None
    conf = {**SPARK_CONF, "spark.jars.packages": package} if package else dict(SPARK_CONF)
    plan = session_plan(args.runs, native)
    session_start: dict[str, list[float]] = {"python": [], "native": []}
    spark_version, effective = None, {}
    for number, source in enumerate(plan, 1):
        if number == 1:
            raw_pair()
        t0 = time.monotonic()
        spark = reused or build_session(args.master, "retryd-bench", conf)
        session_start[source].append(time.monotonic() - t0)
        try:
            for kind in session_reads(source, args.warm):
                if kind == "kafka_plain_warm":
                    count, size, seconds = plain_kafka_read(spark, bootstrap, topic, args.chunk)
                else:
                    count, size, seconds = spark_read(spark, bootstrap, topic, args.chunk, source)
                if (count, size) != expected:
                    raise SystemExit(f"mismatch: {kind} {count}/{size} vs raw {expected}")
                samples[kind].append(seconds)
                log(f"session {number} ({source}): {kind:16s} {count:,} records in {seconds:.2f}s")
                raw_pair()
            spark_version = spark.version
            effective = {k: spark.conf.get(k, "(default)") for k in EFFECTIVE_CONF}
        finally:
            if reused is None:
                stop_session(spark)
    return {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "records": args.records,
        "partitions": args.partitions,
        "max_records_per_partition": args.chunk,
        "headers_one_in": args.with_headers,
        "sessions": plan,
        "warm_reads_per_session": args.warm,
        "native_connector": {
            "package": package,
            "pyspark": found.pyspark if found is not None else None,
            "note": found.note if found is not None else None,
            "measured": native,
            "why_not": why_not,
        },
        "master": args.master,
        "spark_version": spark_version,
        "spark_conf": {**conf, **effective},
        "confluent_kafka": confluent_kafka.__version__,
        "librdkafka": confluent_kafka.libversion()[0],
        "pyarrow": pyarrow.__version__,
        "reader_fetch_tuning": READ_TUNING,
        "batch_rows": DEFAULT_BATCH_ROWS,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "produce_records_per_s": round(args.records / produce_s),
        "spark_session_start_s": {
            k: [round(x, 2) for x in v] for k, v in session_start.items() if v
        },
        "spark_session_reused": reused is not None,
        **summarize(samples),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=250_000, help="maxRecordsPerPartition")
    parser.add_argument("--with-headers", type=int, default=10, help="1 in N records (0: none)")
    parser.add_argument(
        "--runs", type=int, default=3, help="Spark sessions per source (one cold read each)"
    )
    parser.add_argument(
        "--no-native",
        dest="native",
        action="store_false",
        help="skip Spark's Kafka connector (no download from Maven Central)",
    )
    parser.add_argument("--warm", type=int, default=2, help="warm reads per session")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--bootstrap", default=os.environ.get("RETRYD_TEST_BOOTSTRAP"))
    parser.add_argument("--results-dir", type=Path, default=None, help="default: bench/results")
    parser.add_argument("--quick", action="store_true", help="smoke test of the harness")
    args = parser.parse_args(argv)
    if args.quick:
        args.records, args.chunk, args.runs, args.warm = 20_000, 5_000, 1, 1
    result = run(args, lambda line: print(line, flush=True))
    med, ratios = result["median_seconds"], result["ratios"]
    print(f"\nbroker: {result['broker']['label']}")
    print("medians: " + ", ".join(f"{k} {v:.2f}s" for k, v in med.items()))
    for name, value in ratios.items():
        print(f"ratio {name}: {value:.2f}x")
    if not args.quick or args.results_dir is not None:
        folder = args.results_dir or RESULTS
        folder.mkdir(parents=True, exist_ok=True)
        kind = result["broker"]["kind"]
        out = folder / f"datasource-{kind}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"results written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
