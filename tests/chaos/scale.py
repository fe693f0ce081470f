"""How big a chaos run is: ``RETRYD_CHAOS_SCALE=full|ci`` (default ``ci``).

``full`` is the size issue 9 asks for (≥ 50,000 messages under ≥ 10 SIGKILLs, two 20 s
broker cuts, ...) and takes a while; ``ci`` runs every scenario small, each well under a minute,
so the normal suite (and CI) exercises the same code paths on every run.
``RETRYD_CHAOS_SEED`` makes a run's random choices (message mix, kill victims, fuzz) repeatable.

The scenarios on a three-node Apache Kafka cluster (``test_cluster_*.py``) cost a cluster
start and several failovers each: at ``ci`` scale only the partition-leader SIGKILL runs (the
one CI runs); ``RETRYD_CHAOS_CLUSTER=all`` runs the others at ``ci`` size too, and ``full``
scale runs all of them.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

SCALE_ENV = "RETRYD_CHAOS_SCALE"
SEED_ENV = "RETRYD_CHAOS_SEED"
CLUSTER_ENV = "RETRYD_CHAOS_CLUSTER"

# A short retry sequence, so that poison messages reach failed_topic in seconds.
SEQUENCE = "1s,2s"
MAX_RETRIES = 2


@dataclass(frozen=True)
class ClusterSizes:
    """The scenarios on a three-node Apache Kafka cluster (``test_cluster_*.py``)."""

    leader_messages: int
    leader_rounds: int  # each round: SIGKILL the main topic's leader, then the tiers' leader
    coordinator_messages: int
    coordinator_kills: int
    down_s: float  # how long a SIGKILLed node stays down (fencing takes ~9 s of it)
    pause_messages: int
    pauses: int
    pause_s: float  # SIGSTOP to SIGCONT
    rolling_messages: int
    rolling_rounds: int  # each round stops and restarts all three nodes, one at a time
    outage_messages: int
    outage_s: float  # two of three nodes down at once
    gap_s: tuple[float, float]  # load between two faults, drawn uniformly
    strict_messages: int  # key_order = strict (test_strict_kills.py), keys as ``strict_keys``
    strict_rounds: int  # each round: SIGKILL the main topic's leader, then the state's
    # consumer_mode = share (test_share_chaos.py): SIGKILL the node that is share coordinator
    # of most of the main topic's share-partitions
    share_messages: int = 2_000
    share_kills: int = 1


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
    cluster: ClusterSizes
    # key_order = strict under worker SIGKILLs (test_strict_kills.py), run once with
    # key_order = none for comparison: messages over ``strict_keys`` keys. What is redone is
    # checked against the guarantee (only what a killed process had not committed), not
    # against the other run: a ratio of two runs' redo measured how busy the machine was.
    strict_messages: int
    strict_keys: int
    strict_kills: int
    strict_kill_every_s: tuple[float, float]
    # consumer_mode = share (test_share_chaos.py): ``share_workers`` worker processes of one
    # share group, a random one SIGKILLed every ``share_kill_every_s`` and restarted
    share_messages: int = 1_500
    share_workers: int = 3
    share_kills: int = 4
    share_kill_every_s: tuple[float, float] = (2.0, 3.0)


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
        cluster=ClusterSizes(
            leader_messages=30_000,
            leader_rounds=3,
            coordinator_messages=20_000,
            coordinator_kills=3,
            down_s=15.0,
            pause_messages=20_000,
            pauses=2,
            pause_s=40.0,  # past replica.lag.time.max.ms (30 s) and the broker session (9 s)
            rolling_messages=20_000,
            rolling_rounds=2,
            outage_messages=20_000,
            outage_s=60.0,
            gap_s=(4.0, 6.0),
            strict_messages=5_000,
            strict_rounds=3,
            share_messages=20_000,
            share_kills=3,
        ),
        strict_messages=5_000,
        strict_keys=100,
        strict_kills=12,
        strict_kill_every_s=(3.0, 5.0),
        share_messages=20_000,
        share_workers=3,
        share_kills=12,
        share_kill_every_s=(3.0, 5.0),
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
        cluster=ClusterSizes(
            leader_messages=2_000,
            leader_rounds=1,
            coordinator_messages=2_000,
            coordinator_kills=1,
            down_s=10.0,
            pause_messages=2_000,
            pauses=1,
            pause_s=12.0,  # past the broker session (9 s): the node is fenced
            rolling_messages=2_000,
            rolling_rounds=1,
            outage_messages=2_000,
            outage_s=15.0,
            gap_s=(2.0, 3.0),
            strict_messages=750,
            strict_rounds=1,
            share_messages=2_000,
            share_kills=1,
        ),
        strict_messages=750,  # the run: 750 records, 4 SIGKILLs of two workers
        strict_keys=50,
        strict_kills=4,
        strict_kill_every_s=(2.0, 3.0),
        share_messages=1_500,
        share_workers=3,
        share_kills=4,
        share_kill_every_s=(2.0, 3.0),
    ),
}


def scale() -> str:
    value = os.environ.get(SCALE_ENV, "ci").strip().lower() or "ci"
    if value not in SIZES:
        raise ValueError(f"{SCALE_ENV}={value!r}: expected one of {', '.join(SIZES)}")
    return value


def sizes() -> Sizes:
    return SIZES[scale()]


def every_cluster_scenario() -> bool:
    """Whether the replicated-cluster scenarios beyond the one CI runs are wanted."""
    return scale() == "full" or os.environ.get(CLUSTER_ENV, "").strip().lower() == "all"


def seed() -> int:
    configured = os.environ.get(SEED_ENV)
    return int(configured) if configured else random.SystemRandom().randrange(2**32)


def settle_budget(full_s: float) -> float:
    """How long a scenario waits for every message to end before it reports and fails: the
    full size's ``full_s``, or at most 240 s at ``ci`` size, where a healthy run settles in
    seconds. Under pytest's 600 s timeout, so that a scenario that does not settle fails with
    its report row, the ids still missing and the workers' warnings in the log, not with a
    timeout's stack trace."""
    return full_s if scale() == "full" else min(full_s, 240.0)
