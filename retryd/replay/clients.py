"""The Kafka clients of the replay and ledger code come from injected factories, like the
worker's (``retryd.worker.assembly``): one ``ReplayClients`` is built where the sidecar or the
CLI composes its replay parts and handed to each of them, so tests swap every consumer,
producer and admin client at once (the in-memory stub broker, or a wrapper that widens a race).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from retryd.kafka.clients import new_admin, new_consumer, new_producer

Factory = Callable[[dict[str, Any]], Any]


@dataclass(frozen=True, slots=True)
class ReplayClients:
    consumer: Factory = new_consumer
    producer: Factory = new_producer
    admin: Factory = new_admin


KAFKA = ReplayClients()  # the real clients (retryd.kafka.clients)
