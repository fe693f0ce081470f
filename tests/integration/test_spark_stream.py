"""``spark.readStream.format("retryd_kafka")``: offsets in the checkpoint, read limits, and a
restarted query reading only what it has not read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from retryd.pipeline.source import SOURCE_NAME
from tests.integration.spark_support import spark  # noqa: F401
from tests.support import create_topics, produce, unique

pytestmark = pytest.mark.spark


def test_restarted_query_reads_each_record_once(spark, bootstrap: str, tmp_path: Path) -> None:  # noqa: F811
    topic = unique("stream")
    create_topics(bootstrap, [topic], partitions=2)
    produce(bootstrap, topic, [(None, b"%d" % i) for i in range(25)])
    seen: list[tuple[int, int, int]] = []
    sizes: list[int] = []

    def sink(df: Any, batch_id: int) -> None:
        rows = df.select("partition", "offset", "value").collect()
        sizes.append(len(rows))
        seen.extend((r["partition"], r["offset"], int(r["value"])) for r in rows)

    def run(checkpoint: Path, **options: object) -> Any:
        opts = {"bootstrap": bootstrap, "topics": topic, **{k: str(v) for k, v in options.items()}}
        query = (
            spark.readStream.format(SOURCE_NAME).options(**opts).load()
            .writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True).start()
        )  # fmt: skip
        assert query.awaitTermination(120), "the query did not finish"
        assert query.exception() is None
        return query

    checkpoint = tmp_path / "checkpoint"
    run(checkpoint, maxOffsetsPerTrigger=13)
    assert sorted(v for _, _, v in seen) == list(range(25))
    assert len(sizes) >= 2 and max(sizes) <= 13, sizes  # the read limit split the backlog

    produce(bootstrap, topic, [(None, b"%d" % i) for i in range(25, 32)])
    query = run(checkpoint)  # same checkpoint: only the 7 new records
    assert sorted(v for _, _, v in seen) == list(range(32))
    assert len({(p, o) for p, o, _ in seen}) == 32
    by_partition = {p: sum(1 for q, _, _ in seen if q == p) for p in (0, 1)}
    end = json.loads(query.lastProgress["sources"][0]["endOffset"])
    assert end == {topic: {"0": by_partition[0], "1": by_partition[1]}}
