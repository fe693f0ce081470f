"""Demo traffic and the outcome it must produce (pure: no I/O)."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field

from retryd.policy.sequence import RetryPlan


@dataclass
class Expected:
    handled: int = 0
    dead: Counter[str] = field(default_factory=Counter)
    entered: Counter[str] = field(default_factory=Counter)  # tier topic -> copies routed into it


def demo_orders(
    n: int, fail_rate: float, poison_rate: float, max_fail: int, seed: int = 7
) -> list[dict[str, object]]:
    """``fail_rate`` of orders fail 1..max_fail times (beyond the sequence means exhausted)."""
    rng = random.Random(seed)
    orders: list[dict[str, object]] = []
    for i in range(n):
        roll = rng.random()
        order: dict[str, object] = {"order": i, "amount": round(rng.uniform(5, 500), 2)}
        if roll < poison_rate:
            order["poison"] = True
        elif roll < poison_rate + fail_rate:
            order["fail_times"] = rng.randint(1, max_fail)
        orders.append(order)
    return orders


def expected_outcome(orders: list[dict[str, object]], plan: RetryPlan) -> Expected:
    exp = Expected()
    for order in orders:
        if order.get("poison"):
            exp.dead["non_retryable"] += 1
            continue
        fails = int(str(order.get("fail_times", 0)))
        retries = min(fails, plan.max_retries)
        for n in range(retries):
            exp.entered[plan.next_destination(n).topic] += 1
        if fails > plan.max_retries:
            exp.dead["exhausted"] += 1
        else:
            exp.handled += 1
    return exp


def encode(order: dict[str, object]) -> tuple[bytes, bytes]:
    return str(order["order"]).encode(), json.dumps(order).encode()
