"""Fuzz of every header retryd decodes, through the worker's poll thread (stub broker).

Hypothesis writes main-topic and tier records whose headers have any name (retryd's own, text,
non-UTF-8 bytes the client cannot decode), any value (None, empty, binary, non-UTF-8, decimal
strings of thousands of digits, negative or huge numbers) and any count. The worker must never
exit, and every record must end in exactly one place: handled, skipped (another group's), or
dead-lettered (malformed) with a reason; every offset committed.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retryd.handlers.base import Message
from retryd.policy import headers as h
from tests.stub_kafka import StubBroker
from tests.unit.test_engine_loop import GROUP, MAIN, make_worker

TIER = "retry_1s"
RETRYD_NAMES = [
    h.RETRY_NUMBER,
    h.RETRY_TIMESTAMP,
    h.ORIGINAL_TOPIC,
    h.ORIGINAL_PARTITION,
    h.ORIGINAL_OFFSET,
    h.ORIGINAL_TIMESTAMP,
    h.FIRST_FAILURE_TIMESTAMP,
    h.ERROR_CLASS,
    h.ERROR_MESSAGE,
    h.DEAD_REASON,
    h.GROUP,
    h.REPLAY_ID,
]

numbers = st.one_of(
    st.integers(-(10**25), 10**25).map(lambda n: str(n).encode()),
    st.integers(1, 6000).map(lambda n: b"9" * n),  # past Python's 4300-digit int limit
    st.sampled_from([b"", b"0", b"1", b" 1", b"1e3", b"\xd9\xa3", b"0x10", b"\xff"]),
)
values = st.one_of(st.none(), st.binary(max_size=64), numbers, st.text(max_size=20).map(str.encode))
names = st.one_of(
    st.sampled_from(RETRYD_NAMES),
    st.text(max_size=12),
    st.binary(min_size=1, max_size=6),  # a name the client may not decode
)
header_lists = st.lists(st.tuples(names, values), max_size=12)


def _valid_tier(now: int) -> list[tuple[Any, bytes | None]]:
    return [
        (h.RETRY_NUMBER, b"1"),
        (h.RETRY_TIMESTAMP, b"%d" % now),
        (h.ORIGINAL_TOPIC, MAIN.encode()),
        (h.ORIGINAL_PARTITION, b"0"),
        (h.ORIGINAL_OFFSET, b"0"),
        (h.GROUP, GROUP.encode()),
    ]


@settings(
    max_examples=int(os.environ.get("RETRYD_FUZZ_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=os.environ.get("RETRYD_PROPERTY_RANDOM") is None,
)
@given(
    main=st.lists(header_lists, min_size=1, max_size=6),
    tier=st.lists(st.tuples(st.booleans(), header_lists), min_size=1, max_size=6),
)
def test_no_header_makes_the_poll_thread_exit_or_lose_a_record(
    main: list[list[tuple[Any, bytes | None]]],
    tier: list[tuple[bool, list[tuple[Any, bytes | None]]]],
) -> None:
    broker = StubBroker()
    handled: list[tuple[str, int]] = []

    def handler(m: Message) -> None:
        m.headers  # noqa: B018 - business code reads them: must not end the worker either
        handled.append((m.topic, m.offset))
        if m.topic == MAIN:
            raise ValueError("route a copy of every main record, with its headers")

    worker = make_worker(broker, Path(tempfile.mkdtemp()), handler, sequence="1s")
    now = int(time.time() * 1000)
    for hdrs in main:
        broker.append(MAIN, b"k", b"v", hdrs)  # type: ignore[arg-type]
    for valid_base, hdrs in tier:
        base = _valid_tier(now) if valid_base else []
        broker.append(TIER, b"k", b"v", base + hdrs)  # type: ignore[arg-type]
    tier_end = len(tier)
    summary = worker.run(until_drained=True)  # raises if anything ended the loop

    assert broker.committed_offset(GROUP, MAIN) == len(main)
    tier_total = len(broker.records(TIER))
    assert broker.committed_offset(GROUP, TIER) == tier_total
    dead = broker.records(worker.settings.failed_topic)
    for r in dead:
        assert dict(r.headers).get(h.DEAD_REASON) in (b"malformed", b"exhausted")
    # every fuzzed tier record: handled, skipped (other group), or dead-lettered as malformed
    fuzzed_handled = {o for t, o in handled if t == TIER and o < tier_end}
    malformed = summary.dead_reasons.get("malformed", 0)
    skipped = sum(summary.skipped.values())
    assert len(fuzzed_handled) + malformed + skipped >= tier_end
