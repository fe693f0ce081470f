"""Flow control: when partitions pause and resume, so every buffer stays bounded.

Pausing never loses anything (the worker keeps every record it consumed; a pause sets the
fetch position right after the last delivered one) but it does cost a re-fetch, so each limit
has hysteresis: pause at the limit, resume at half of it.

Records that wait for their due time in a tier partition's tail are bounded on their own
(``tier_buffer`` records per partition, ``buffer_bytes`` for all tails together) and pause
only the tier partitions that hold them: a tier filled by an outage must never stop the main
topics or other tiers.
"""

from __future__ import annotations

from retryd.worker.book import PartitionBook
from retryd.worker.partition import PAUSE_BUFFER, PAUSE_MEMORY, PAUSE_PRODUCER, PAUSE_TAIL

# A full tier tail resumes this long before a record not fetched yet could come due (a fetch
# and a poll iteration), and holds at most this many times ``tier_buffer`` records that way
# (``buffer_bytes`` bounds every tail's bytes in any case).
RESUME_AHEAD_MS = 500
TAIL_CAP = 4


def flow_control(
    book: PartitionBook,
    partition_buffer: int,
    tier_buffer: int,
    buffer_bytes: int,
    producer_blocked: bool,
    now_ms: int | None = None,
) -> None:
    """Apply every limit once (called by the poll thread each iteration).

    - a partition whose unfinished records reach ``partition_buffer`` (a slow key holding back
      the records behind it) pauses;
    - a tier partition holding ``tier_buffer`` not-yet-due records pauses until half came due,
      and every tier partition holding any pauses while all tails together hold
      ``buffer_bytes``;
    - every partition pauses while the other buffered value bytes exceed ``buffer_bytes``,
      and while the producer's queue is full (routed copies backing up).
    """
    low = partition_buffer // 2
    tail_low = tier_buffer // 2
    working = 0  # bytes of records being worked on (queued, running, routing)
    tails = 0  # bytes of records waiting for their due time
    parts = list(book.parts.values())
    for st in parts:
        n = st.records
        working += st.pending_bytes - st.tail_bytes
        tails += st.tail_bytes
        if n >= partition_buffer:
            if not st.paused & PAUSE_BUFFER:
                book.set_pause(st, PAUSE_BUFFER, True)
        elif st.paused & PAUSE_BUFFER and n <= low:
            book.set_pause(st, PAUSE_BUFFER, False)
    tails_full = tails >= buffer_bytes
    tails_low = tails <= buffer_bytes // 2
    for st in parts:
        if st.floor_ms is None:
            continue  # a main topic without a delay before the first attempt: no tail
        waiting = len(st.tail)
        # Records not fetched yet come after the newest one in the tail: none can be due before
        # its timestamp plus the tier's shortest (jittered) delay. From shortly before then a
        # full tail must not keep them out, or they are late by up to the jitter's spread.
        due_soon = (
            now_ms is not None
            and 0 < waiting < TAIL_CAP * tier_buffer
            and now_ms + RESUME_AHEAD_MS >= st.tail[-1].msg.timestamp + (st.floor_ms or 0)
        )
        if (waiting >= tier_buffer and not due_soon) or (tails_full and waiting):
            if not st.paused & PAUSE_TAIL:
                book.set_pause(st, PAUSE_TAIL, True)
        elif st.paused & PAUSE_TAIL and tails_low and (waiting <= tail_low or due_soon):
            book.set_pause(st, PAUSE_TAIL, False)
    if working >= buffer_bytes:
        book.pause_all(PAUSE_MEMORY, True)
    elif working <= buffer_bytes // 2:
        book.pause_all(PAUSE_MEMORY, False)
    book.pause_all(PAUSE_PRODUCER, producer_blocked)
