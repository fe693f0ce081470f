"""Browsing a failed topic of large records holds one full record at a time, not a page of
them, and a page's rendered bytes are bounded: the cursor continues exactly after it."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from retryd.replay.browse import browse
from retryd.replay.records import RecordFilter
from retryd.replay.scan import BATCH_BYTES, ScannerPool
from tests.integration.sidecar_support import Env, failed_headers, seed

VALUE = 700_000  # under the broker's default message.max.bytes with retryd's headers
N = 12


def test_a_page_of_large_records_holds_previews_only(bootstrap: str, tmp_path: Path) -> None:
    env = Env(bootstrap, tmp_path / "state").create(failed_partitions=1, main_partitions=1)
    records = [
        (f"k{i}".encode(), bytes([65 + i]) * VALUE, failed_headers(env.main)) for i in range(N)
    ]
    seed(bootstrap, env.failed, records, partition=0)
    pool = ScannerPool({"bootstrap.servers": bootstrap}, env.failed, "test")
    try:
        browse(pool, RecordFilter(), cursor=None, limit=1, preview_bytes=64)  # connect, warm up
        tracemalloc.start()
        try:
            page = browse(pool, RecordFilter(), cursor=None, limit=N, preview_bytes=64)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(page.items) == N
        # before: every value of a 500-record consume() batch, and the page's N full values
        # until it rendered them (9.1 MB here); now one byte-sized batch and one record
        assert peak < BATCH_BYTES + 2 * VALUE, f"peak {peak / 1e6:.1f} MB while browsing"
        print(f"browse of {N} x {VALUE // 1000} KB: Python peak {peak / 1e6:.2f} MB")

        # a page bounded by bytes ends early, and the cursor continues right after it
        first = browse(
            pool, RecordFilter(), cursor=None, limit=N, preview_bytes=4096, max_page_bytes=20_000
        )
        assert 0 < len(first.items) < N and first.has_more
        rest = browse(pool, RecordFilter(), cursor=first.next_cursor, limit=N, preview_bytes=64)
        offsets = [i["offset"] for i in first.items] + [i["offset"] for i in rest.items]
        assert offsets == list(range(N))
    finally:
        pool.close()
