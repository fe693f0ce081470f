"""``retryd spark report`` on seeded tier and dead-letter topics: exact counts in every output."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
from confluent_kafka import Producer
from rich.console import Console

from retryd.pipeline.progress import JobProgress
from retryd.pipeline.report import ReportSpec, run_report
from retryd.policy.fingerprint import fingerprint_id
from tests.integration.spark_support import dead_letter, spark, tier_copy  # noqa: F401
from tests.support import create_topics, unique

pytestmark = pytest.mark.spark

H0 = 1_699_999_200_000  # 2023-11-14 22:00:00 UTC
H1 = H0 + 3_600_000
HOUR0 = datetime(2023, 11, 14, 22, tzinfo=UTC)
HOUR1 = datetime(2023, 11, 14, 23, tzinfo=UTC)


def produce_at(bootstrap: str, topic: str, records: list[tuple[int, list]], parts: int) -> None:
    """Produce (timestamp_ms, headers) records round-robin over ``parts`` partitions."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i, (ts, headers) in enumerate(records):
        producer.produce(
            topic, key=b"k%d" % i, value=b"v", headers=headers, timestamp=ts, partition=i % parts
        )
    assert producer.flush(30) == 0


@pytest.fixture(scope="module")
def seeded(bootstrap: str) -> dict:
    prefix = unique("rep")
    orders, payments = f"{prefix}.orders", f"{prefix}.payments"
    t5, t30, failed = f"{prefix}.retry_5m", f"{prefix}.retry_30m", f"{prefix}.failed"
    create_topics(bootstrap, [t5, t30], partitions=2)
    create_topics(bootstrap, [failed], partitions=2)
    tier5: list[tuple[int, list]] = []
    tier30: list[tuple[int, list]] = []
    dead: list[tuple[int, list]] = []
    # orders 0-5: two tier-5m copies, one tier-30m copy, then exhausted (4 in H0, 2 in H1)
    for m in range(6):
        tier5 += [(H0, tier_copy(orders, m, 1)), (H0, tier_copy(orders, m, 2))]
        tier30.append((H0, tier_copy(orders, m, 3)))
        ts = H0 + 60_000 * m if m < 4 else H1 + 5
        dead.append((ts, dead_letter(orders, m, error_class="TimeoutError", error_message="slow")))
    # orders 6-7: one retry, then success (never dead)
    for m in (6, 7):
        tier5.append((H0, tier_copy(orders, m, 1)))
    # orders 8-9: non-retryable on first failure (no tier); one failure mode, two messages
    for m, where in ((8, 17), (9, 4242)):
        dead.append(
            (H0 + 1, dead_letter(orders, m, error_class="ValueError",
                                 error_message=f"bad json at offset {where}",
                                 dead_reason="non_retryable", retry_number=0))
        )  # fmt: skip
    # payments 0: one retry then non-retryable; payments 1-2: exhausted
    tier5.append((H1, tier_copy(payments, 0, 1)))
    dead.append(
        (H1 + 7, dead_letter(payments, 0, error_class="KeyError", error_message="missing id",
                             dead_reason="non_retryable", retry_number=1))
    )  # fmt: skip
    for m in (1, 2):
        tier5 += [(H1, tier_copy(payments, m, 1)), (H1, tier_copy(payments, m, 2))]
        tier30.append((H1, tier_copy(payments, m, 3)))
        dead.append((H1 + 9, dead_letter(payments, m, error_class="TimeoutError",
                                         error_message="slow")))  # fmt: skip
    # a malformed tier message, dead-lettered without an original position
    malformed = [
        ("retryd_error_class", b"HeaderError"),
        ("retryd_error_message", b"header retry_number is missing"),
        ("retryd_dead_reason", b"malformed"),
    ]
    dead.append((H0 + 2, malformed))
    produce_at(bootstrap, t5, tier5, 2)
    produce_at(bootstrap, t30, tier30, 2)
    produce_at(bootstrap, failed, dead, 2)
    return {"orders": orders, "payments": payments, "tiers": (t5, t30), "failed": failed}


def test_report_exact_counts(spark, bootstrap: str, seeded: dict, tmp_path: Path) -> None:  # noqa: F811
    orders, payments, failed = seeded["orders"], seeded["payments"], seeded["failed"]
    t5, t30 = seeded["tiers"]
    # a tier that does not exist yet (nobody failed that far) shows as zero
    spec = ReportSpec(
        kafka_conf={"bootstrap.servers": bootstrap},
        failed_topic=failed,
        tier_topics=(t5, t30, unique("rep.retry_1h")),
        out_dir=tmp_path / "report",
        top_n=3,
        max_records_per_partition=4,
    )
    terminal = Console(file=io.StringIO(), width=250, record=True)
    with JobProgress(spark, Console(file=io.StringIO())) as progress:
        result = run_report(spark, spec, progress, terminal)

    dead = {
        (orders, "TimeoutError", "exhausted", HOUR0): 4,
        (orders, "TimeoutError", "exhausted", HOUR1): 2,
        (orders, "ValueError", "non_retryable", HOUR0): 2,
        (payments, "KeyError", "non_retryable", HOUR1): 1,
        (payments, "TimeoutError", "exhausted", HOUR1): 2,
        (None, "HeaderError", "malformed", HOUR0): 1,
    }
    funnel = [(1, t5, 11, 9), (2, t30, 8, 8), (3, spec.tier_topics[2], 0, 0), (4, failed, 11, 11)]
    top = [  # error class, fingerprint, dead letters, distinct messages, example
        ("TimeoutError", "slow", 8, 1, "slow"),
        ("ValueError", "bad json at offset <num>", 2, 2, "bad json at offset 17"),
        ("HeaderError", "header retry_number is missing", 1, 1,
         "header retry_number is missing"),  # before KeyError: same count
    ]  # fmt: skip

    def dead_of(frame: pd.DataFrame) -> dict:
        out = {}
        for r in frame.itertuples(index=False):
            hour = pd.Timestamp(r.hour)
            hour = hour.tz_localize("UTC") if hour.tzinfo is None else hour.tz_convert("UTC")
            topic = None if pd.isna(r.original_topic) else r.original_topic
            out[(topic, r.error_class, r.dead_reason, hour.to_pydatetime())] = int(r.count)
        return out

    def funnel_of(frame: pd.DataFrame) -> list:
        return [(int(r.stage), r.tier, int(r.messages), int(r.reached_failed))
                for r in frame.itertuples(index=False)]  # fmt: skip

    def top_of(frame: pd.DataFrame) -> list:
        assert all(
            r.fingerprint_id == fingerprint_id(r.error_class, r.fingerprint)
            for r in frame.itertuples(index=False)
        )
        return [
            (r.error_class, r.fingerprint, int(r.count), int(r.messages), r.example)
            for r in frame.itertuples(index=False)
        ]

    # returned frames
    assert dead_of(result.tables["dead_letters"]) == dead
    assert funnel_of(result.tables["funnel"]) == funnel
    assert top_of(result.tables["top_errors"]) == top
    assert result.dead_letter_total == 12
    # Parquet, read back by Spark
    for name, check, expected in (
        ("dead_letters", dead_of, dead),
        ("funnel", funnel_of, funnel),
        ("top_errors", top_of, top),
    ):
        frame = spark.read.parquet(str(result.files[f"{name}.parquet"])).toPandas()
        if name == "funnel":
            frame = frame.sort_values("stage")
        if name == "top_errors":
            frame = frame.sort_values(["count", "error_class"], ascending=[False, True])
        assert check(frame) == expected, name
        # CSV, one file per table
        csv = pd.read_csv(result.files[f"{name}.csv"], keep_default_na=True)
        csv = csv.astype(object).where(csv.notna(), None)
        assert check(csv) == expected, f"{name}.csv"
    # terminal tables
    text = terminal.export_text()
    for (topic, cls, reason, hour), count in dead.items():
        when = f"{hour:%Y-%m-%d %H}:00Z"
        pattern = rf"{re.escape(topic or '-')}\s.*{cls}\s.*{reason}\s.*{when}\s.*\b{count}\b"
        assert re.search(pattern, text), f"terminal lacks {topic} {cls} {reason} {hour}: {count}"
    for stage, tier, messages, reached in funnel:
        assert re.search(rf"\b{stage}\b.*{re.escape(tier)}\s.*\b{messages}\b.*\b{reached}\b", text)
    assert "12 dead letters" in text
    # chart
    png = result.files["report.png"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(png) as image:
        assert image.size == (1200, 500)
    assert result.chart_data["per_hour"] == {
        "exhausted": {"2023-11-14 22:00": 4, "2023-11-14 23:00": 4},
        "non_retryable": {"2023-11-14 22:00": 2, "2023-11-14 23:00": 1},
        "malformed": {"2023-11-14 22:00": 1},
    }
    assert result.chart_data["funnel"] == {t: (m, r) for _, t, m, r in funnel}


def test_report_reads_the_error_routes_dead_letter_topics(
    spark,  # noqa: F811
    bootstrap: str,
    tmp_path: Path,
) -> None:
    """Records an error route sent to its DLT are dead letters too: counted by dead reason
    ``routed``, in the funnel's ``reached_failed`` of the tiers they went through, and in one
    row per dead-letter topic (a DLT nothing was routed to yet: 0); the ``route`` column is
    read from ``retryd_route``."""
    from retryd.pipeline.source import kafka_options, read_kafka
    from retryd.policy.headers import Envelope, routed_headers

    prefix = unique("rrep")
    orders, tier, failed = f"{prefix}.orders", f"{prefix}.retry_5m", f"{prefix}.failed"
    declined, missing = f"{prefix}.declined", f"{prefix}.poison"
    create_topics(bootstrap, [tier, failed, declined], partitions=1)

    def routed(m: int, retry_number: int) -> list:
        env = Envelope(orders, 0, m, H0, retry_number, None, H0 + 1, "Declined", "card declined",
                       "routed", None, "Declined")  # fmt: skip
        return routed_headers([], env)

    # orders 0-1: one retry, then routed to the DLT; 2-3 routed at once; 4 exhausted
    produce_at(bootstrap, tier, [(H0, tier_copy(orders, m, 1)) for m in (0, 1, 4)], 1)
    produce_at(bootstrap, declined, [(H0 + 5, routed(m, 1 if m < 2 else 0)) for m in range(4)], 1)
    produce_at(bootstrap, failed, [(H0 + 9, dead_letter(orders, 4))], 1)
    spec = ReportSpec(
        kafka_conf={"bootstrap.servers": bootstrap},
        failed_topic=failed,
        tier_topics=(tier,),
        dlt_topics=(declined, missing),
        out_dir=tmp_path / "report",
    )
    with JobProgress(spark, Console(file=io.StringIO())) as progress:
        result = run_report(spark, spec, progress, Console(file=io.StringIO()))

    dead = {
        (r.original_topic, r.error_class, r.dead_reason): int(r.count)
        for r in result.tables["dead_letters"].itertuples(index=False)
    }
    assert dead == {(orders, "Declined", "routed"): 4, (orders, "ValueError", "exhausted"): 1}
    assert result.dead_letter_total == 5
    funnel = [
        (int(r.stage), r.tier, int(r.messages), int(r.reached_failed))
        for r in result.tables["funnel"].itertuples(index=False)
    ]
    assert funnel == [(1, tier, 3, 3), (2, failed, 1, 1), (3, declined, 4, 4), (4, missing, 0, 0)]

    rows = read_kafka(spark, kafka_options({"bootstrap.servers": bootstrap}, [declined, failed]))
    routes = {(r["topic"], r["route"]) for r in rows.select("topic", "route").collect()}
    assert routes == {(declined, "Declined"), (failed, None)}
