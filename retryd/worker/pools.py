"""Handler pools: where handler calls run, at most ``max_in_flight`` at a time per process.

- ``ThreadPool`` (``thread_pool``) for sync Python callables;
- ``LoopPool`` (``loop_pool``) for ``async def`` callables and HTTP.

Both take ready records from the ``Scheduler``, make every transition of a record through the
``Lifecycle``, count calls in monotonic per-slot counters (read as deltas by ``collect``) and
hand failures to the poll thread through ``completions``. ``slots`` holds what they share.
"""

from __future__ import annotations

from retryd.worker.loop_pool import ASYNC_CANCEL_GRACE_S, LoopPool
from retryd.worker.slots import Pool, adapter_failure
from retryd.worker.thread_pool import ThreadPool

__all__ = ["ASYNC_CANCEL_GRACE_S", "LoopPool", "Pool", "ThreadPool", "adapter_failure"]
