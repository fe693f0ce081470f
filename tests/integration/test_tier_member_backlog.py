"""A deep tier never keeps the main topic waiting, on Apache Kafka (issue 31, fault 9).

With the tiers on their own member (``tier_consumer = own``, the default), a tier full of due
copies (an outage's backlog) returned whole batches and the main member was not polled until
the drain ended: a main record sent during a 60,000-copy drain waited 4 to 7 s (0.05 s with one
consumer), and a drain longer than ``max.poll.interval.ms`` would have dropped the main member
from its group. ``SplitConsumer.consume`` now polls the main member on every call, with a
quarter of each batch reserved for it.

The bound is stated in records, not seconds: once the main record is sent, the worker handles
it before it has handled a tenth of the backlog that was still waiting (the main member's
prefetch needs one fetch round trip; a batch is 500 records).
"""

from __future__ import annotations

import json
from pathlib import Path

from retryd.policy.headers import Envelope, routed_headers
from tests.integration.worker_support import deployment, stop_process
from tests.support import json_lines, produce, wait_for

BACKLOG = 40_000


def _due_copy(main: str, offset: int) -> list[tuple[str, bytes | None]]:
    env = Envelope(
        original_topic=main,
        original_partition=0,
        original_offset=offset,
        original_timestamp=1_700_000_000_000,
        retry_number=1,
        retry_timestamp=1_700_000_000_000,  # long due
        first_failure_timestamp=1_700_000_000_000,
        error_class="TimeoutError",
        error_message="outage",
    )
    return routed_headers([], env)


def test_a_main_record_is_served_during_a_deep_tier_drain(bootstrap: str, tmp_path: Path) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s,1s,2s")
    tier = dep.tier("1s")
    produce(
        bootstrap,
        tier,
        (
            (b"t%d" % i, json.dumps({"id": f"t{i}"}).encode(), _due_copy(dep.main, i))
            for i in range(BACKLOG)
        ),
    )
    log = tmp_path / "calls.log"
    worker = dep.spawn_worker(log)
    try:
        # the drain is under way: the tiers member is returning full batches
        wait_for(lambda: len(json_lines(log)) >= 2_000, 120, what="the tier drain to start")
        before = len(json_lines(log))
        dep.send([{"id": "main-1"}])

        def main_handled() -> bool:
            return any(c["id"] == "main-1" for c in json_lines(log))

        wait_for(main_handled, 120, what="the main record handled")
        calls = json_lines(log)
    finally:
        stop_process(worker)
    at = next(i for i, c in enumerate(calls) if c["id"] == "main-1")
    tiers_between = at - before
    remaining = BACKLOG - before
    assert tiers_between < remaining // 10, (
        f"the main record waited for {tiers_between} tier calls of the {remaining} waiting"
    )
    assert calls[at]["topic"] == dep.main
