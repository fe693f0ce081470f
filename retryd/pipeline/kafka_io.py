"""Kafka I/O of the data source: planning offset ranges (driver) and reading them (executors).

Neither side joins a consumer group or commits: ranges are ``assign()``ed explicitly.
Partition extents come from ListOffsets (earliest, latest), as Spark's own Kafka source does,
each end checked against a fetch's high watermark: the embedded dev broker (Tansu) answers
'latest' wrongly, and a range planned short would read short without a word
(``probe_extents``). A range read that meets the end of the partition before its end offset
waits for the rest and fails with the partition named, never ends short (``read_range``).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Hashable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from retryd.errors import KafkaSetupError, RetrydError
from retryd.kafka.clients import new_consumer, reader_config
from retryd.pipeline.columns import BatchBuilder
from retryd.pipeline.offsets import (
    Bound,
    EndCheck,
    OffsetRange,
    checked_end,
    clamp_range,
    split_range,
)
from retryd.pipeline.options import SourceOptions
from retryd.pipeline.timeplan import Check, Sample, contradiction, probe_offsets

log = logging.getLogger(__name__)

TP = tuple[str, int]
K = TypeVar("K", bound=Hashable)
_EOF = KafkaError._PARTITION_EOF
_POLL_S = 0.2
# Probing extents needs one record (or end-of-partition) per partition: the smallest fetches
# the protocol allows (a broker still returns one whole batch), and no back-off when the
# queue threshold is crossed (librdkafka's default waits 1 s per partition there).
PROBE_TUNING: dict[str, object] = {
    "message.max.bytes": 1000,
    "fetch.max.bytes": 1000,
    "max.partition.fetch.bytes": 1,
    "queued.max.messages.kbytes": 1,
    "fetch.queue.backoff.ms": 0,
    # a fetch at the end of a partition returns after this long, not Kafka's default 500 ms:
    # the end-of-partition event is the answer a probe waits for
    "fetch.wait.max.ms": 10,
}


class KafkaReadError(RetrydError):
    """A range could not be planned or read; the message names ``topic[partition]@offset``."""


def range_consumer(conf: Mapping[str, str], **extra: object) -> Consumer:
    """A consumer for explicit ``assign()`` reads: no group membership, no commits."""
    settings = reader_config(conf, "spark", **extra)
    try:
        return new_consumer(settings)
    except KafkaSetupError as exc:
        raise KafkaReadError(str(exc)) from exc


def _fmt(tps: Iterable[TP]) -> str:
    return ", ".join(f"{t}[{p}]" for t, p in sorted(tps))


def list_partitions(consumer: Consumer, topics: Iterable[str], timeout_s: float) -> list[TP]:
    """Every partition of ``topics``; a missing topic is an error (it is never auto-created)."""
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise KafkaReadError(f"cannot read cluster metadata: {exc}") from exc
    out: list[TP] = []
    for topic in topics:
        tmd = metadata.topics.get(topic)
        if tmd is None:
            raise KafkaReadError(f"topic {topic!r} does not exist")
        if tmd.error is not None:
            raise KafkaReadError(f"topic {topic!r}: {tmd.error}")
        out.extend((topic, p) for p in sorted(tmd.partitions))
    return out


@dataclass(frozen=True, slots=True)
class Head:
    """The first record at or after a position, as a fetch returned it, and the partition's
    high watermark from that same fetch response. ``offset`` is None at end of partition."""

    offset: int | None
    timestamp_ms: int | None
    high: int


def read_heads(consumer: Consumer, positions: Mapping[TP, int], timeout_s: float) -> dict[TP, Head]:
    """Read each partition from its position until its first record or end-of-partition.

    Positions may be ``OFFSET_BEGINNING``. High watermarks come from the fetch responses
    (cached watermarks after a fetch, or the end-of-partition event), never from ListOffsets.
    """
    if not positions:
        return {}
    assigned = [TopicPartition(t, p, off) for (t, p), off in positions.items()]
    consumer.assign(assigned)
    # A pause outlives unassign/assign: clear the ones an earlier call on this consumer left.
    consumer.resume(assigned)
    heads: dict[TP, Head] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(heads) < len(positions):
            if time.monotonic() > deadline:
                missing = [tp for tp in positions if tp not in heads]
                raise KafkaReadError(f"no fetch answer within {timeout_s:g}s for {_fmt(missing)}")
            # ask for as many events as partitions are missing: consume() returns as soon as
            # the last one's record or end-of-partition arrives instead of waiting out _POLL_S
            for msg in consumer.consume(len(positions) - len(heads), _POLL_S):
                topic, part = msg.topic(), msg.partition()
                if topic is None or part is None:
                    continue
                key = (topic, part)
                err = msg.error()
                if err is not None and err.code() != _EOF:
                    if err.retriable():
                        continue
                    raise KafkaReadError(f"{topic}[{part}]: {err.str()}")
                offset = msg.offset()
                if offset is None or key in heads or key not in positions:
                    continue
                if err is not None:  # end of partition: offset is the high watermark
                    heads[key] = Head(None, None, offset)
                else:
                    hw = consumer.get_watermark_offsets(TopicPartition(topic, part), cached=True)
                    if hw[1] >= 0:
                        heads[key] = Head(offset, msg.timestamp()[1], hw[1])
                if key in heads:
                    consumer.pause([TopicPartition(topic, part)])
    finally:
        consumer.unassign()
    return heads


def probe_extents(consumer: Consumer, tps: list[TP], timeout_s: float) -> dict[TP, tuple[int, int]]:
    """(log start offset, end offset) of each partition, the end checked by a fetch.

    Two batched ListOffsets requests (earliest, latest) answer in ~15 ms on Apache Kafka, as
    Spark's own Kafka source takes them. But a range planned short reads short without any
    error, and a Kafka-compatible broker can answer 'latest' wrongly: the embedded Tansu of
    ``retryd dev`` answers the base offset of the last batch + 1, and report, archive and
    replay read 2 of 40 dead letters there (issue 23). So on every broker the end comes from
    the high watermark of a fetch at the last listed offset, which answers at once (a record
    is there; only an empty partition waits ``fetch.wait.max.ms``), and a broker whose
    ListOffsets contradicts its fetches is named in a warning (``checked_end``). The end is
    the last stable offset for a ``read_committed`` reader, in both answers.
    """
    if not tps:
        return {}
    low = _list_offsets(consumer, tps, OFFSET_BEGINNING, timeout_s)
    listed = _list_offsets(consumer, tps, OFFSET_END, timeout_s)
    positions = {tp: max(low[tp], listed[tp] - 1) for tp in tps}
    try:
        heads = read_heads(consumer, positions, timeout_s)
    except KafkaReadError as exc:
        raise KafkaReadError(
            f"cannot check the partitions' end offsets with a fetch from "
            f"{broker_name(consumer, timeout_s)}: {exc}"
        ) from exc
    fetched = {tp: heads[tp].high for tp in tps}
    ahead = [tp for tp in tps if fetched[tp] > listed[tp]]
    relisted = _list_offsets(consumer, ahead, OFFSET_END, timeout_s) if ahead else {}
    out: dict[TP, tuple[int, int]] = {}
    problems: list[str] = []
    for tp in tps:
        end, problem = checked_end(tp, EndCheck(listed[tp], fetched[tp], relisted.get(tp)))
        if problem is not None:
            problems.append(problem)
        out[tp] = (min(low[tp], end), end)
    if problems:
        _warn_wrong_list_offsets(consumer, problems, timeout_s)
    return out


_WARNED: set[str] = set()  # clusters already warned about in this process


def broker_name(consumer: Consumer, timeout_s: float) -> str:
    """The cluster a client talks to, for messages: its id and its brokers' addresses (the
    embedded Tansu's id is 'tansu_cluster')."""
    try:
        metadata = consumer.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        return f"the broker (metadata unavailable: {exc})"
    hosts = ", ".join(sorted(f"{b.host}:{b.port}" for b in metadata.brokers.values()))
    return f"the broker at {hosts or '?'} (cluster id {metadata.cluster_id!r})"


def _warn_wrong_list_offsets(consumer: Consumer, problems: list[str], timeout_s: float) -> None:
    name = broker_name(consumer, timeout_s)
    level = logging.INFO if name in _WARNED else logging.WARNING
    _WARNED.add(name)
    log.log(
        level,
        "%s answers ListOffsets 'latest' wrongly (%s%s): partition ends are taken from fetch "
        "responses instead, so every record is read",
        name,
        "; ".join(problems[:3]),
        f"; {len(problems) - 3} more" if len(problems) > 3 else "",
    )


def _list_offsets(consumer: Consumer, tps: list[TP], spec: int, timeout_s: float) -> dict[TP, int]:
    """One batched ListOffsets request: ``spec`` is OFFSET_BEGINNING or OFFSET_END."""
    found = offsets_for_times(consumer, dict.fromkeys(tps, spec), timeout_s, "listing offsets")
    out: dict[TP, int] = {}
    for (topic, part), offset in found.items():
        if offset is None:
            raise KafkaReadError(f"{topic}[{part}]: listing offsets: no offset")
        out[(topic, part)] = offset
    return out


def read_samples(
    consumer: Consumer, wanted: Mapping[K, tuple[TP, int]], timeout_s: float
) -> dict[K, Sample | None]:
    """For each key, the first record at or after its (partition, offset): None at the end.

    A consumer has one position per partition, so requests for the same partition are read
    in successive rounds.
    """
    out: dict[K, Sample | None] = {}
    pending = list(wanted.items())
    while pending:
        batch: dict[TP, list[K]] = {}
        positions: dict[TP, int] = {}
        rest = []
        for key, (tp, offset) in pending:
            if tp in positions and positions[tp] != offset:
                rest.append((key, (tp, offset)))
                continue
            positions[tp] = offset
            batch.setdefault(tp, []).append(key)
        for tp, head in read_heads(consumer, positions, timeout_s).items():
            sample = None
            if head.offset is not None and head.timestamp_ms is not None:
                sample = Sample(head.offset, head.timestamp_ms)
            for key in batch[tp]:
                out[key] = sample
        pending = rest
    return out


def offsets_for_times(
    consumer: Consumer,
    wanted: Mapping[TP, int],
    timeout_s: float,
    what: str = "offsets for times",
) -> dict[TP, int | None]:
    """Earliest offset whose timestamp is >= the given epoch ms, or None when there is none
    (OFFSET_BEGINNING / OFFSET_END as the "timestamp": the log start / end; errors then say
    ``what`` they were doing)."""
    if not wanted:
        return {}
    query = [TopicPartition(t, p, ts) for (t, p), ts in wanted.items()]
    try:
        answer = consumer.offsets_for_times(query, timeout=timeout_s)
    except KafkaException as exc:
        raise KafkaReadError(f"{what} failed: {exc}") from exc
    out: dict[TP, int | None] = {}
    for tp in answer:
        if tp.error is not None:
            raise KafkaReadError(f"{tp.topic}[{tp.partition}]: {what}: {tp.error}")
        out[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else None
    return out


def check_time_answers(
    consumer: Consumer,
    answers: Mapping[tuple[TP, int], int | None],
    targets: Mapping[tuple[TP, int], int],
    extents: Mapping[TP, tuple[int, int]],
    timeout_s: float,
) -> None:
    """Refuse offsets-for-times answers that the records around them contradict.

    The ``*Timestamp`` options are resolved by the broker; one that answers without looking
    at record timestamps (the embedded Tansu answers offset 0 for every timestamp) would make
    the read silently start or end in the wrong place. The same necessary conditions as the
    jobs' ``--since/--until`` (``timeplan.contradiction``) are checked; the jobs fall back to
    filtering after the read, the data source's options have no such fallback: an error.
    """
    requests: dict[tuple[tuple[TP, int], str], tuple[TP, int]] = {}
    for key, answer in answers.items():
        low, high = extents[key[0]]
        for name, offset in probe_offsets(answer, low, high).items():
            requests[(key, name)] = (key[0], offset)
    samples = read_samples(consumer, requests, timeout_s)
    for key, answer in sorted(answers.items(), key=lambda kv: kv[0]):
        tp, side = key
        low, high = extents[tp]
        check = Check(
            answer,
            at=samples.get((key, "at")),
            before=samples.get((key, "before")),
            last=samples.get((key, "last")),
        )
        problem = contradiction(tp, targets[key], low, high, check)
        if problem is not None:
            option = ("starting", "ending")[side] + "Timestamp"
            raise KafkaReadError(
                f"{broker_name(consumer, timeout_s)} does not honour record timestamps in "
                f"offsets-for-times ({problem}): the {option} options cannot be resolved "
                "there; give offsets instead (the jobs' --since/--until filter after the read)"
            )


def resolve_ranges(opts: SourceOptions) -> list[OffsetRange]:
    """One concrete ``[start, end)`` per partition of the selected topics (possibly empty)."""
    consumer = range_consumer(opts.kafka_conf, **PROBE_TUNING)
    try:
        tps = list_partitions(consumer, opts.topics, opts.read_timeout_s)
        extents = probe_extents(consumer, tps, opts.read_timeout_s)
        bounds = {
            tp: (opts.starting.for_partition(*tp), opts.ending.for_partition(*tp)) for tp in tps
        }
        for side in (0, 1):
            for key in (opts.starting, opts.ending)[side].per_partition:
                if key not in extents:
                    raise KafkaReadError(f"offsets name {key[0]}[{key[1]}], which does not exist")
        by_time = {
            (tp, side): b[side].value
            for tp, b in bounds.items()
            for side in (0, 1)
            if b[side].kind == "timestamp"
        }
        found: dict[tuple[TP, int], int | None] = {}
        for side in (0, 1):
            wanted = {tp: ts for (tp, s), ts in by_time.items() if s == side}
            for tp, offset in offsets_for_times(consumer, wanted, opts.read_timeout_s).items():
                found[(tp, side)] = offset
        check_time_answers(consumer, found, by_time, extents, opts.read_timeout_s)
    finally:
        consumer.close()

    def concrete(tp: TP, side: int, bound: Bound) -> int:
        low, high = extents[tp]
        if bound.kind == "earliest":
            return low
        if bound.kind == "latest":
            return high
        if bound.kind == "timestamp":
            offset = found.get((tp, side))
            return high if offset is None else offset
        return bound.value

    out: list[OffsetRange] = []
    for tp, (start_b, end_b) in bounds.items():
        start, end = concrete(tp, 0, start_b), concrete(tp, 1, end_b)
        if start_b.kind == end_b.kind == "offset" and start > end:
            raise KafkaReadError(f"{tp[0]}[{tp[1]}]: starting offset {start} > ending offset {end}")
        low, high = extents[tp]
        rng = clamp_range(tp[0], tp[1], start, end, low, high)
        if (start_b.kind == "offset" and rng.start != start) or (
            end_b.kind == "offset" and rng.end != end
        ):
            log.warning(
                "%s[%s]: requested offsets %s..%s clamped to %s..%s (partition holds %s..%s)",
                tp[0], tp[1], start, end, rng.start, rng.end, low, high,
            )  # fmt: skip
        out.append(rng)
    return out


def plan_ranges(opts: SourceOptions) -> list[OffsetRange]:
    """Input partitions of a read: every non-empty range, chunked by maxRecordsPerPartition."""
    chunks: list[OffsetRange] = []
    for rng in resolve_ranges(opts):
        chunks.extend(split_range(rng, opts.max_records_per_partition))
    log.info("planned %d input partitions: %s", len(chunks), ", ".join(map(str, chunks[:20])))
    return chunks


# Range reads fetch big chunks of one partition: fewer round trips per record.
READ_TUNING: dict[str, object] = {
    "max.partition.fetch.bytes": 8 << 20,
    "fetch.max.bytes": 64 << 20,
    "queued.max.messages.kbytes": 64 << 10,
}
_CONSUME_BATCH = 10_000


# Generation-0 threshold while a range is read (CPython's default is 700 allocations).
GC_THRESHOLD0 = 50_000


@contextmanager
def fewer_gc_passes(threshold0: int = GC_THRESHOLD0) -> Iterator[None]:
    """Run the cyclic garbage collector less often for the duration.

    A read allocates millions of small objects (a Message per record, a tuple per header)
    and holds a batch's worth alive: with the default threshold the collector runs every 700
    allocations and keeps re-scanning the survivors, which measured 40% of a task's CPU when
    every record carries headers. None of these objects form cycles (reference counting
    frees them), so fewer passes change nothing but the time. Restored on exit.
    """
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], threshold0), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def read_range(
    conf: Mapping[str, str], rng: OffsetRange, batch_rows: int, timeout_s: float
) -> Iterator[pa.RecordBatch]:
    """Yield the records of ``rng`` as Arrow batches; stop at its end, or at an end of
    partition at or past it (offsets may be missing: compaction, transaction markers), never
    wait forever.

    An end of partition *before* the range's end does not end the read: the planned offsets
    were there when the range was planned (or the plan was wrong), so the read waits for
    them as for any slow fetch and fails after ``timeout_s`` naming both offsets, instead of
    returning short. (A leader's high watermark can lag for a moment after a failover.)

    A ``consume()`` batch without errors and inside the range (one partition per consumer,
    so offsets increase) goes to the builder whole; only a batch with an error event or
    offsets outside the range is looked at record by record.
    """
    if rng.span == 0:
        return
    with fewer_gc_passes():
        yield from _read_range(conf, rng, batch_rows, timeout_s)


def _read_range(
    conf: Mapping[str, str], rng: OffsetRange, batch_rows: int, timeout_s: float
) -> Iterator[pa.RecordBatch]:
    consumer = range_consumer(conf, **READ_TUNING)
    builder = BatchBuilder()
    position = rng.start
    log_end: int | None = None  # where an end of partition short of rng.end was met
    try:
        consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        last_progress = time.monotonic()
        done = False
        while not done and position < rng.end:
            msgs = consumer.consume(min(batch_rows, _CONSUME_BATCH), _POLL_S)
            if not msgs:
                if time.monotonic() - last_progress > timeout_s:
                    short = (
                        f"; {broker_name(consumer, 5.0)} ends the partition at {log_end}: "
                        f"the planned offsets {log_end}..{rng.end - 1} are not in its log"
                        if log_end is not None
                        else ""
                    )
                    raise KafkaReadError(
                        f"{rng.topic}[{rng.partition}]@{position}: nothing arrived for "
                        f"{timeout_s:g}s before the end offset {rng.end}{short}"
                    )
                continue
            last_progress = time.monotonic()
            first, last = msgs[0].offset(), msgs[-1].offset()
            clean = not any([m.error() is not None for m in msgs])
            inside = first is not None and last is not None and rng.start <= first <= last < rng.end
            if clean and inside and last is not None:
                builder.extend(msgs)
                position = last + 1
                msgs = []
            for msg in msgs:  # the slow path: errors, or records outside the range
                err = msg.error()
                offset = msg.offset()
                if err is not None:
                    if err.code() == _EOF:
                        if offset is not None and offset >= rng.end:
                            done = True  # nothing below rng.end is left in the log
                            break
                        log_end = offset  # short of the range: wait for the rest
                        continue
                    if err.retriable():
                        continue
                    raise KafkaReadError(f"{rng.topic}[{rng.partition}]@{position}: {err.str()}")
                if offset is None or offset < rng.start:
                    continue
                if offset >= rng.end:
                    done = True
                    break
                builder.add_message(msg)
                position = offset + 1
            if len(builder) >= batch_rows:
                yield builder.flush()
        if len(builder):
            yield builder.flush()
    finally:
        consumer.close()
