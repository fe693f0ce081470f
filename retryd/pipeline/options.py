"""Options of the ``retryd_kafka`` data source, validated once on the driver (pure logic).

Spark lower-cases option names, so every name here is matched case-insensitively.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from retryd.pipeline.offsets import BoundSpec, SourceOptionError, parse_bound_spec

DEFAULT_BATCH_ROWS = 20_000
DEFAULT_READ_TIMEOUT_MS = 120_000
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# librdkafka options the reader sets itself: a user value would break range reads.
_RESERVED_KAFKA = {
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.partition.eof",
    "auto.offset.reset",
}
KNOWN_OPTIONS = {
    "bootstrap",
    "topics",
    "subscribe",
    "startingoffsets",
    "endingoffsets",
    "startingtimestamp",
    "endingtimestamp",
    "startingoffsetsbytimestamp",
    "endingoffsetsbytimestamp",
    "maxrecordsperpartition",
    "maxoffsetspertrigger",
    "batchrows",
    "readtimeoutms",
    "path",
}


@dataclass(frozen=True)
class SourceOptions:
    """Everything a read needs; picklable, shipped from the driver to every executor task."""

    kafka_conf: Mapping[str, str]
    topics: tuple[str, ...]
    starting: BoundSpec
    ending: BoundSpec
    max_records_per_partition: int | None = None
    max_offsets_per_trigger: int | None = None  # streaming: offsets per micro-batch, in total
    batch_rows: int = DEFAULT_BATCH_ROWS
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_MS / 1000

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Validate data source options; raise SourceOptionError listing every problem."""
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        problems: list[str] = []
        conf: dict[str, str] = {}
        for key, value in opts.items():
            if key.startswith("kafka."):
                name = key.removeprefix("kafka.")
                if name in _RESERVED_KAFKA:
                    problems.append(f"option {key} is set by the reader and cannot be changed")
                else:
                    conf[name] = value
            elif key not in KNOWN_OPTIONS:
                problems.append(
                    f"unknown option {key!r} (librdkafka settings take a 'kafka.' prefix)"
                )
        if "bootstrap" in opts:
            conf["bootstrap.servers"] = opts["bootstrap"]
        if not conf.get("bootstrap.servers"):
            problems.append("option 'bootstrap' (or 'kafka.bootstrap.servers') is required")
        topic_text = opts.get("topics", opts.get("subscribe", ""))
        topics = tuple(t.strip() for t in topic_text.split(",") if t.strip())
        if not topics:
            problems.append("option 'topics' is required: a comma list of topic names")
        for topic in topics:
            if not _TOPIC_RE.match(topic):
                problems.append(f"topic name {topic!r} is invalid")
        starting = parse_bound_spec(
            "starting",
            opts.get("startingoffsets"),
            opts.get("startingtimestamp"),
            opts.get("startingoffsetsbytimestamp"),
            problems,
        )
        ending = parse_bound_spec(
            "ending",
            opts.get("endingoffsets"),
            opts.get("endingtimestamp"),
            opts.get("endingoffsetsbytimestamp"),
            problems,
        )
        max_records = _positive(opts, "maxrecordsperpartition", None, problems)
        max_per_trigger = _positive(opts, "maxoffsetspertrigger", None, problems)
        batch_rows = _positive(opts, "batchrows", DEFAULT_BATCH_ROWS, problems)
        timeout_ms = _positive(opts, "readtimeoutms", DEFAULT_READ_TIMEOUT_MS, problems)
        for tp in list(starting.per_partition) + list(ending.per_partition):
            if tp[0] not in topics:
                problems.append(f"offsets name topic {tp[0]!r}, which is not in 'topics'")
        if problems:
            raise SourceOptionError(problems)
        return cls(
            kafka_conf=conf,
            topics=topics,
            starting=starting,
            ending=ending,
            max_records_per_partition=max_records,
            max_offsets_per_trigger=max_per_trigger,
            batch_rows=batch_rows or DEFAULT_BATCH_ROWS,
            read_timeout_s=(timeout_ms or DEFAULT_READ_TIMEOUT_MS) / 1000,
        )


def _positive(
    opts: Mapping[str, str], name: str, default: int | None, problems: list[str]
) -> int | None:
    text = opts.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        problems.append(f"{name}={text!r} is not an integer")
        return default
    if value <= 0:
        problems.append(f"{name}={value} must be greater than zero")
        return default
    return value
