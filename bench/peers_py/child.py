"""One system consuming one topic in a process of its own: ``child.py SYSTEM BOOTSTRAP TOPIC
GROUP COUNT``; prints one JSON line (handled, wall_s, cpu_s).

The clock starts at the first record the system hands to its handler and stops at the N-th,
so group joins and start-up never count; ``cpu_s`` is this process's CPU time over the same
span, every thread included (``time.process_time``). It runs in the peer's own environment
(bench/peers_py/envs.py) and imports nothing but the standard library and that peer (the raw
loop: the harness, in retryd's environment).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any


class Clock:
    """Counts handled records; notes wall and CPU time at the first and at the N-th."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = 0
        self.t0 = self.c0 = self.t1 = self.c1 = 0.0
        self.done = threading.Event()

    def first(self) -> None:
        self.t0, self.c0 = time.perf_counter(), time.process_time()

    def add(self, k: int = 1) -> bool:
        """Count ``k`` handled records; True once the N-th is counted."""
        if self.count == 0:
            self.first()
        self.count += k
        if self.count >= self.n and not self.done.is_set():
            self.t1, self.c1 = time.perf_counter(), time.process_time()
            self.done.set()
        return self.done.is_set()

    def result(self) -> dict[str, Any]:
        return {"handled": self.count, "wall_s": self.t1 - self.t0, "cpu_s": self.c1 - self.c0}


def raw(bootstrap: str, topic: str, group: str, clock: Clock) -> None:
    """The harness's bare confluent-kafka loop (its own group name), clocked by its hooks."""
    from bench import harness as h

    def done() -> None:
        clock.count = clock.n
        clock.t1, clock.c1 = time.perf_counter(), time.process_time()
        clock.done.set()

    h.raw_loop(bootstrap, topic, clock.n, None, on_first=clock.first, on_done=done)


def quix(bootstrap: str, topic: str, group: str, clock: Clock) -> None:
    """quix-streams at its defaults; offsets from the earliest (the records are there before
    it starts) and bytes serdes (the values are not JSON)."""
    from quixstreams import Application

    app = Application(broker_address=bootstrap, consumer_group=group, auto_offset_reset="earliest")
    sdf = app.dataframe(app.topic(topic, value_deserializer="bytes", key_deserializer="bytes"))

    def handle(value: Any) -> None:
        if clock.add():
            app.stop()

    sdf.update(handle)
    app.run()


def faststream(bootstrap: str, topic: str, group: str, clock: Clock, batch: bool) -> None:
    """FastStream's Kafka broker (aiokafka): a batch subscriber or a per-message one, offsets
    acknowledged after each call (at-least-once)."""
    import asyncio

    from faststream import AckPolicy
    from faststream.kafka import KafkaBroker

    broker = KafkaBroker(bootstrap, logger=None)
    stop = asyncio.Event()
    options: dict[str, Any] = {
        "group_id": group,
        "auto_offset_reset": "earliest",
        "ack_policy": AckPolicy.ACK,
    }
    if batch:

        @broker.subscriber(topic, batch=True, **options)
        async def handle_batch(bodies: list[bytes]) -> None:
            if clock.add(len(bodies)):
                stop.set()

    else:

        @broker.subscriber(topic, **options)
        async def handle_one(body: bytes) -> None:
            if clock.add():
                stop.set()

    async def main() -> None:
        async with broker:
            await broker.start()
            await stop.wait()

    asyncio.run(main())


def main() -> None:
    system, bootstrap, topic, group, count = sys.argv[1:6]
    clock = Clock(int(count))
    if system == "raw":
        raw(bootstrap, topic, group, clock)
    elif system == "quix-streams":
        quix(bootstrap, topic, group, clock)
    elif system in ("faststream-batch", "faststream-message"):
        faststream(bootstrap, topic, group, clock, system == "faststream-batch")
    else:
        raise SystemExit(f"unknown system {system!r}")
    if not clock.done.is_set():
        raise SystemExit(f"{system} stopped after {clock.count} of {clock.n} records")
    print(json.dumps(clock.result()))


if __name__ == "__main__":
    main()
