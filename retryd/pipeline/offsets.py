"""Offset ranges and the data source options that select them (pure logic, no I/O).

Option names follow Spark's own Kafka source (``startingOffsets``, ``endingOffsets``,
``startingTimestamp``, ``startingOffsetsByTimestamp``, ``maxRecordsPerPartition``, ``kafka.*``)
so a job can switch between the two sources without rewriting its options.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from retryd.errors import RetrydError

EARLIEST = -2  # Spark's JSON code for "earliest"
LATEST = -1  # Spark's JSON code for "latest"

Kind = Literal["earliest", "latest", "offset", "timestamp"]
Side = Literal["starting", "ending"]


class SourceOptionError(RetrydError):
    """The data source options are invalid; ``problems`` holds one readable line each."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid retryd_kafka options: " + "; ".join(problems))


@dataclass(frozen=True, slots=True)
class Bound:
    """One end of a range before it is resolved against the broker."""

    kind: Kind
    value: int = 0


@dataclass(frozen=True)
class BoundSpec:
    """Where to start (or end) reading: a default plus per-partition overrides."""

    default: Bound
    per_partition: Mapping[tuple[str, int], Bound] = field(default_factory=dict)

    def for_partition(self, topic: str, partition: int) -> Bound:
        return self.per_partition.get((topic, partition), self.default)


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition. Offsets inside may be missing (gaps)."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def span(self) -> int:
        return max(0, self.end - self.start)

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.start}..{self.end}"


def split_range(rng: OffsetRange, max_records: int | None) -> list[OffsetRange]:
    """Cut a range into chunks of at most ``max_records`` offsets (an empty range gives none)."""
    if rng.span == 0:
        return []
    if not max_records or rng.span <= max_records:
        return [rng]
    pieces = math.ceil(rng.span / max_records)
    size = math.ceil(rng.span / pieces)  # even chunks rather than a small tail
    out = []
    for start in range(rng.start, rng.end, size):
        out.append(OffsetRange(rng.topic, rng.partition, start, min(start + size, rng.end)))
    return out


def ranges_to_json(ranges: list[OffsetRange], side: Side) -> str:
    """Explicit per-partition offsets in Spark's JSON format, e.g. for a checkpointed run."""
    out: dict[str, dict[str, int]] = {}
    for rng in ranges:
        out.setdefault(rng.topic, {})[str(rng.partition)] = (
            rng.start if side == "starting" else rng.end
        )
    return json.dumps(out, sort_keys=True)


def _parse_int(text: str, what: str, problems: list[str]) -> int | None:
    try:
        value = int(text.strip())
    except ValueError:
        problems.append(f"{what}={text!r} is not an integer")
        return None
    return value


def _parse_json_map(text: str, what: str, problems: list[str]) -> dict[tuple[str, int], int]:
    """``{"topic": {"0": 12}}`` -> {(topic, 0): 12}."""
    try:
        data = json.loads(text)
    except ValueError:
        problems.append(f'{what} must be JSON like {{"topic": {{"0": 42}}}}, got {text[:60]!r}')
        return {}
    if not isinstance(data, dict):
        problems.append(f'{what} must be a JSON object like {{"topic": {{"0": 42}}}}')
        return {}
    out: dict[tuple[str, int], int] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            problems.append(f"{what}: topic {topic!r} must map partition numbers to integers")
            continue
        for part, value in parts.items():
            if not str(part).isdigit():
                problems.append(f"{what}: partition {part!r} of {topic!r} is not a number")
            elif isinstance(value, bool) or not isinstance(value, int):
                problems.append(f"{what}: {topic}[{part}] must be an integer, got {value!r}")
            else:
                out[(topic, int(part))] = value
    return out


def _offset_bound(value: int, side: Side, where: str, problems: list[str]) -> Bound | None:
    if value == EARLIEST:
        if side == "ending":
            problems.append(f"{where}: -2 (earliest) is not allowed as an ending offset")
            return None
        return Bound("earliest")
    if value == LATEST:
        return Bound("latest")
    if value < 0:
        problems.append(f"{where}: offset {value} is invalid (use >= 0, -2 earliest, -1 latest)")
        return None
    return Bound("offset", value)


def parse_bound_spec(
    side: Side,
    offsets: str | None,
    timestamp: str | None = None,
    by_timestamp: str | None = None,
    problems: list[str] | None = None,
) -> BoundSpec:
    """Parse one side's options; precedence as in Spark: by-timestamp > timestamp > offsets."""
    own: list[str] = [] if problems is None else problems
    name = f"{side}Offsets"
    default = Bound("earliest") if side == "starting" else Bound("latest")
    per: dict[tuple[str, int], Bound] = {}
    if by_timestamp is not None:
        for key, ts in _parse_json_map(by_timestamp, f"{side}OffsetsByTimestamp", own).items():
            if ts < 0:
                own.append(f"{side}OffsetsByTimestamp: {key[0]}[{key[1]}] timestamp is negative")
            else:
                per[key] = Bound("timestamp", ts)
    elif timestamp is not None:
        ts_value = _parse_int(timestamp, f"{side}Timestamp", own)
        if ts_value is not None and ts_value < 0:
            own.append(f"{side}Timestamp={ts_value} must be epoch milliseconds >= 0")
        elif ts_value is not None:
            default = Bound("timestamp", ts_value)
    elif offsets is not None:
        word = offsets.strip().lower()
        if word == "earliest":
            if side == "ending":
                own.append("endingOffsets cannot be 'earliest' (use 'latest' or JSON offsets)")
            else:
                default = Bound("earliest")
        elif word == "latest":
            default = Bound("latest")
        elif word.startswith("{"):
            for key, value in _parse_json_map(offsets, name, own).items():
                bound = _offset_bound(value, side, f"{name} {key[0]}[{key[1]}]", own)
                if bound is not None:
                    per[key] = bound
        else:
            own.append(f"{name}={offsets!r}: use 'earliest', 'latest' or per-partition JSON")
    if problems is None and own:
        raise SourceOptionError(own)
    return BoundSpec(default, per)


def clamp_range(
    topic: str, partition: int, start: int, end: int, low: int, high: int
) -> OffsetRange:
    """A resolved range kept inside what the partition holds: ``low <= start <= end <= high``."""
    start = min(max(start, low), high)
    end = min(max(end, start), high)
    return OffsetRange(topic, partition, start, end)


def offsets_to_json_dict(offsets: Mapping[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    """``{topic: {"partition": next offset}}``, topics and partitions in order.

    Structured Streaming compares offsets by their JSON text, so the same positions must
    always give the same text: order is fixed here, not left to insertion order.
    """
    out: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(offsets):
        out.setdefault(topic, {})[str(partition)] = int(offsets[(topic, partition)])
    return out


def offsets_from_json_dict(data: object) -> dict[tuple[str, int], int]:
    """The inverse of ``offsets_to_json_dict`` (a checkpoint's offsets, read back)."""
    if not isinstance(data, Mapping):
        raise SourceOptionError([f"stream offsets must be a JSON object, got {data!r:.60}"])
    problems: list[str] = []
    parsed = _parse_json_map(json.dumps(data), "stream offsets", problems)
    if problems:
        raise SourceOptionError(problems)
    return parsed


def cap_offsets(
    start: Mapping[tuple[str, int], int], latest: Mapping[tuple[str, int], int], max_rows: int
) -> dict[tuple[str, int], int]:
    """End offsets advancing at most ``max_rows`` offsets in total past ``start``.

    A partition missing from ``start`` (new since the last trigger) starts at offset 0, as the
    stream reads it. The budget is shared in proportion to each partition's backlog (as
    Spark's own Kafka source does for ``maxOffsetsPerTrigger``), so no partition starves; when
    every share rounds down to nothing the largest backlog still moves, so a trigger always
    makes progress.
    """
    begin = {tp: min(start.get(tp, 0), end) for tp, end in latest.items()}
    backlog = {tp: end - begin[tp] for tp, end in latest.items()}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(latest)
    out = {tp: begin[tp] + size * max_rows // total for tp, size in backlog.items()}
    if out == begin:
        biggest = max(sorted(backlog), key=lambda tp: backlog[tp])
        out[biggest] += min(backlog[biggest], max_rows)
    return out


@dataclass(frozen=True, slots=True)
class EndCheck:
    """One partition's end as two broker answers gave it: ListOffsets 'latest' (``listed``),
    the high watermark of a fetch made after it (``fetched``) and, where the fetch saw more,
    ListOffsets asked again after the fetch (``relisted``)."""

    listed: int
    fetched: int
    relisted: int | None = None


def checked_end(tp: tuple[str, int], check: EndCheck) -> tuple[int, str | None]:
    """The end to read to, and why the broker's ListOffsets cannot be trusted (or None).

    The fetch's high watermark is the end: it is what a reader of the range meets, and it is
    the later of the two answers. An honest broker's end never moves back, so ListOffsets
    answering, after the fetch, less than the fetch had shown is a wrong ListOffsets (Tansu
    0.6 answers the base offset of the partition's last batch + 1), and so is a listed end
    that the fetch's own high watermark does not reach. Records appended between the two
    requests make ``fetched > listed`` too; then ``relisted`` has caught up and all is well.
    """
    where = f"{tp[0]}[{tp[1]}]"
    if check.fetched < check.listed:
        return check.fetched, (
            f"{where}: ListOffsets answered end offset {check.listed}, but a fetch's high "
            f"watermark is {check.fetched}"
        )
    if check.relisted is not None and check.relisted < check.fetched:
        return check.fetched, (
            f"{where}: ListOffsets answered end offset {check.relisted} after a fetch had "
            f"shown records up to offset {check.fetched - 1}"
        )
    return check.fetched, None
