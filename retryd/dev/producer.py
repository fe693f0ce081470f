"""Steady demo traffic for the compose stack and the Kubernetes example (``retryd demo
traffic``): plain orders at a fixed rate, so the business service's failure shares decide the
outcomes and every dashboard panel has something to show."""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, Message

from retryd.kafka.clients import new_producer, producer_config


def order(i: int, rng: random.Random) -> tuple[bytes, bytes]:
    """One order: keyed by customer (so ordering per key shows), a small JSON value."""
    customer = f"customer-{rng.randrange(50)}"
    value = {"order": i, "customer": customer, "amount": round(rng.uniform(5, 500), 2)}
    return customer.encode(), json.dumps(value).encode()


def produce_orders(
    common: dict[str, Any],
    topic: str,
    rate: float,
    count: int | None,
    stop: threading.Event,
    seed: int | None = None,
) -> tuple[int, int]:
    """Produce ``count`` orders (None: until ``stop``) at ``rate`` per second; returns
    (acknowledged, failed)."""
    producer = new_producer(producer_config(common, "demo-traffic", **{"linger.ms": 20}))
    rng = random.Random(seed)
    outcome = {"ok": 0, "failed": 0}

    def done(err: KafkaError | None, msg: Message) -> None:
        outcome["failed" if err is not None else "ok"] += 1

    started = time.monotonic()
    i = 0
    while not stop.is_set() and (count is None or i < count):
        due = started + i / rate
        wait = due - time.monotonic()
        if wait > 0 and stop.wait(wait):
            break
        key, value = order(i, rng)
        try:
            producer.produce(topic, key=key, value=value, on_delivery=done)
        except BufferError:
            producer.poll(0.1)
            continue
        producer.poll(0)
        i += 1
    producer.flush(30)
    return outcome["ok"], outcome["failed"]
