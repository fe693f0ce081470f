"""The spec's metric set.

Worker processes and the sidecar aggregate through prometheus-client's multiprocess mode:
``PROMETHEUS_MULTIPROC_DIR`` must be set by the CLI before this module is first imported.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from retryd import __version__
from retryd.metrics.buckets import LATENCY_BUCKETS as _LATENCY_BUCKETS
from retryd.metrics.buckets import LATENESS_BUCKETS as _LATENESS_BUCKETS

MESSAGES = Counter("retryd_messages", "Messages by topic and outcome", ["topic", "outcome"])
DEAD_LETTERS = Counter("retryd_dead_letters", "Messages dead-lettered, by reason", ["reason"])
HANDLER_DURATION = Histogram(
    "retryd_handler_duration_seconds", "Handler call duration", ["topic"], buckets=_LATENCY_BUCKETS
)
DUE_LATENESS = Histogram(
    "retryd_due_lateness_seconds",
    "Processing start minus retry_timestamp for tier messages",
    ["topic"],
    buckets=_LATENESS_BUCKETS,
)
PAUSED_PARTITIONS = Gauge(
    "retryd_paused_partitions",
    "Partitions paused (waiting for due times, or a full buffer)",
    ["topic"],
    multiprocess_mode="livesum",
)
CONSUMER_LAG = Gauge(
    "retryd_consumer_lag",
    "High watermark minus consumer position",
    ["topic", "partition"],
    multiprocess_mode="livemax",
)
REBALANCES = Counter("retryd_rebalances", "Rebalance events by kind", ["kind"])
HANDLER_INFLIGHT = Gauge(
    "retryd_handler_inflight", "Handler calls in flight", multiprocess_mode="livesum"
)
ABANDONED = Counter(
    "retryd_abandoned_handlers", "Handler calls abandoned after their timeout (hung business code)"
)
SKIPPED = Counter(
    "retryd_skipped", "Tier records not handled here, by reason (e.g. other_group)", ["reason"]
)
# The sidecar serves ``replayed`` from the replay ledger (retryd.metrics.replays: every source,
# once per replay) and these counts of its own ``skipped`` and ``failed`` with source="sidecar".
REPLAYED = Counter("retryd_replayed", "Replayed failed records by status", ["status"])
# The outage circuit breaker (retryd.policy.circuit). Every --processes child decides alone:
# the gauge serves the worst state among the live processes of the pod (livemax), which is the
# pod's truth for "records are held here". ``group`` is added by the sidecar, like everywhere.
CIRCUIT_STATE = Gauge(
    "retryd_circuit_state",
    "Outage circuit breaker: 0 closed, 1 half-open, 2 open (worst live worker process)",
    multiprocess_mode="livemax",
)
CIRCUIT_TRANSITIONS = Counter(
    "retryd_circuit_transitions", "Circuit breaker state changes, by state entered", ["to"]
)
CIRCUIT_HELD = Counter(
    "retryd_circuit_held",
    "Retryable failures held in place while the circuit was not closed (not routed on)",
)
CIRCUIT_PROBES = Counter(
    "retryd_circuit_probes", "Probe calls let through while the circuit was open"
)
QUICK_RETRIES = Counter(
    "retryd_quick_retries",
    "Quick retries in place (quick=<n>@<delay>): handler calls made again on the main topic",
)
QUICK_RESCUED = Counter(
    "retryd_quick_rescued",
    "Main-topic records that succeeded on a quick retry, so never went to a tier",
)
# Strict key order (key_order = strict). Every worker process reads the whole key-state
# topic, so each sees every blocked key: the gauges serve the largest live view (livemax).
KEY_ORDER = Counter(
    "retryd_key_order",
    "Strict key order: records parked behind their key's chain, followers released past the "
    "cap, duplicate copies of finished chain entries dropped",
    ["event"],
)
KEY_ORDER_BLOCKED_KEYS = Gauge(
    "retryd_key_order_blocked_keys",
    "Keys with a record in the retry chain (strict key order)",
    multiprocess_mode="livemax",
)
KEY_ORDER_ENTRIES = Gauge(
    "retryd_key_order_chain_entries",
    "Records in the retry chain of a strict key (failed or parked)",
    multiprocess_mode="livemax",
)
KEY_ORDER_OLDEST = Gauge(
    "retryd_key_order_oldest_blocked_seconds",
    "Age of the oldest chain entry of a strict key: how long a key has been blocked",
    multiprocess_mode="livemax",
)
BUILD_INFO = Gauge("retryd_build_info", "retryd version", ["version"], multiprocess_mode="livemax")
# consumer_mode of the live worker processes: 1 on the series of each mode one of them runs
CONSUMER_MODE = Gauge(
    "retryd_consumer_mode",
    "How the worker processes read the main topics: 1 for each mode in use (group | share)",
    ["mode"],
    multiprocess_mode="livemax",
)
SHARE_ACKNOWLEDGEMENTS = Counter(
    "retryd_share_acknowledgements",
    "Share mode: records acknowledged to the share group, by type (accept | release)",
    ["type"],
)

# Share mode: whether the share-lag reader's last read worked (retryd.share.lag). 0 while
# reads fail (the share group's retryd_consumer_lag then keeps its last value: stale) or when
# the reader cannot serve this configuration (SASL). Worst live worker process (livemin).
SHARE_LAG_READER_UP = Gauge(
    "retryd_share_lag_reader_up",
    "Share mode: 1 when the last read of the share group's lag worked, 0 while it is stale",
    multiprocess_mode="livemin",
)


def mark_build_info() -> None:
    BUILD_INFO.labels(version=__version__).set(1)


def mark_consumer_mode(mode: str) -> None:
    """This process's ``consumer_mode``: its series 1, the other mode's 0."""
    for each in ("group", "share"):
        CONSUMER_MODE.labels(mode=each).set(1 if each == mode else 0)
    if mode == "share":
        for kind in ("accept", "release"):
            SHARE_ACKNOWLEDGEMENTS.labels(type=kind).inc(0)
