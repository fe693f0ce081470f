"""How big a chaos run is: ``RETRYD_CHAOS_SCALE=full|ci`` (default ``ci``).

``full`` is the size issue 9 asks for (≥ 50,000 messages under ≥ 10 SIGKILLs, two 20 s
broker cuts, ...) and takes a while; ``ci`` runs every scenario small, each well under a minute,
so the normal suite (and CI) exercises the same code paths on every run.
``RETRYD_CHAOS_SEED`` makes a run's random choices (message mix, kill victims, fuzz) repeatable.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

SCALE_ENV = "RETRYD_CHAOS_SCALE"
SEED_ENV = "RETRYD_CHAOS_SEED"

# A short retry sequence, so that poison messages reach failed_topic in seconds.
SEQUENCE = "1s,2s"
MAX_RETRIES = 2


@dataclass(frozen=True)
class Sizes:
    kill_messages: int
    kills: int
    kill_every_s: tuple[float, float]  # pause between two SIGKILLs, drawn uniformly
    cut_messages: int
    cuts: int
    cut_s: float
    cut_gap_s: float  # connected time between two cuts
    term_messages: int
    terms: int
    term_every_s: tuple[float, float]
    replay_records: int
    replay_rate: float  # max_per_second of the bulk job
    fuzz_main: int  # fuzzed records per handler kind on the main topic
    fuzz_tier: int  # fuzzed records per handler kind injected into a tier


SIZES = {
    "full": Sizes(
        kill_messages=50_000,
        kills=12,
        kill_every_s=(3.0, 5.0),
        cut_messages=20_000,
        cuts=2,
        cut_s=20.0,
        cut_gap_s=15.0,
        term_messages=20_000,
        terms=8,
        term_every_s=(3.0, 5.0),
        replay_records=5_000,
        replay_rate=250.0,
        fuzz_main=2_000,
        fuzz_tier=1_000,
    ),
    "ci": Sizes(
        kill_messages=3_000,
        kills=2,
        kill_every_s=(2.0, 3.0),
        cut_messages=1_500,
        cuts=1,
        cut_s=8.0,
        cut_gap_s=5.0,
        term_messages=3_000,
        terms=2,
        term_every_s=(2.0, 3.0),
        replay_records=600,
        replay_rate=200.0,
        fuzz_main=150,
        fuzz_tier=60,
    ),
}


def scale() -> str:
    value = os.environ.get(SCALE_ENV, "ci").strip().lower() or "ci"
    if value not in SIZES:
        raise ValueError(f"{SCALE_ENV}={value!r}: expected one of {', '.join(SIZES)}")
    return value


def sizes() -> Sizes:
    return SIZES[scale()]


def seed() -> int:
    configured = os.environ.get(SEED_ENV)
    return int(configured) if configured else random.SystemRandom().randrange(2**32)
