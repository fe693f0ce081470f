"""Flow control: when partitions pause and resume, so every buffer stays bounded.

Pausing never loses anything (the worker keeps every record it consumed; a pause sets the
fetch position right after the last delivered one) but it does cost a re-fetch, so each limit
has hysteresis: pause at the limit, resume at half of it.
"""

from __future__ import annotations

from retryd.worker.book import PartitionBook
from retryd.worker.partition import PAUSE_BUFFER, PAUSE_MEMORY, PAUSE_PRODUCER, PAUSE_TAIL


def flow_control(
    book: PartitionBook,
    partition_buffer: int,
    tier_buffer: int,
    buffer_bytes: int,
    producer_blocked: bool,
) -> None:
    """Apply every limit once (called by the poll thread each iteration).

    - a partition whose unfinished records reach ``partition_buffer`` (a slow key holding back
      the records behind it) pauses;
    - a tier partition holding ``tier_buffer`` not-yet-due records pauses until half came due;
    - every partition pauses while buffered value bytes exceed ``buffer_bytes``, and while the
      producer's queue is full (routed copies backing up).
    """
    low = partition_buffer // 2
    tail_low = tier_buffer // 2
    total = 0
    for st in book.parts.values():
        n = len(st.pending)
        total += st.pending_bytes
        if n >= partition_buffer:
            if not st.paused & PAUSE_BUFFER:
                book.set_pause(st, PAUSE_BUFFER, True)
        elif st.paused & PAUSE_BUFFER and n <= low:
            book.set_pause(st, PAUSE_BUFFER, False)
        if st.delay_ms is not None:
            waiting = len(st.tail)
            if waiting >= tier_buffer:
                if not st.paused & PAUSE_TAIL:
                    book.set_pause(st, PAUSE_TAIL, True)
            elif st.paused & PAUSE_TAIL and waiting <= tail_low:
                book.set_pause(st, PAUSE_TAIL, False)
    if total >= buffer_bytes:
        book.pause_all(PAUSE_MEMORY, True)
    elif total <= buffer_bytes // 2:
        book.pause_all(PAUSE_MEMORY, False)
    book.pause_all(PAUSE_PRODUCER, producer_blocked)
