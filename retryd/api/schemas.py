"""Request and response bodies of the sidecar API (they make up the OpenAPI schema)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from retryd.policy.circuit import CircuitState
from retryd.policy.timespec import TIME_PATTERN
from retryd.replay.records import DEAD_REASONS

TOPIC_PATTERN = r"^[A-Za-z0-9._-]{1,249}$"
# The enum of every dead-reason filter, derived from the reasons the worker writes (never a
# second list that falls behind, as ``routed`` once did). Type checkers cannot build a Literal
# from a tuple, so they see ``str``; pydantic and the OpenAPI schema see the enum.
if TYPE_CHECKING:
    DeadReason = str
else:
    DeadReason = Literal[DEAD_REASONS]
# What a ``topic`` of the failed-records API may name (retryd.replay.sources).
SOURCE_TOPIC_FORMS = (
    "failed_topic (the default), a dead-letter topic of error_routes (dlt:<topic>) or another "
    "system's dead-letter topic named in foreign_dead_letters; any other topic is refused (400)"
)
MAX_OFFSET = 2**63 - 1
MAX_PARTITION = 2**31 - 1
MAX_MS = 2**53
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
# Query strings travel in the request line, which the HTTP server caps at 64 KiB: the limits
# below keep a request with every filter at its maximum under it (bodies use the same ones).
MAX_KEY_CHARS = 16_384
MAX_KEY_BASE64_CHARS = 21_848  # base64 of 16 KiB
MAX_CURSOR_QUERY_CHARS = 16_384  # ~600 partitions; encode_cursor stays far below for most


class ErrorBody(BaseModel):
    """Every error response: a short code, a readable sentence, and one line per problem."""

    error: str = Field(description="short machine-readable code, e.g. not_found")
    detail: str = Field(description="what went wrong, for a person")
    problems: list[str] = Field(default_factory=list, description="one line per invalid field")


class Health(BaseModel):
    status: Literal["ok"] = "ok"


# closed | half_open | open (an enum of strings in the schema)
CircuitStateName = CircuitState


class WorkerState(BaseModel):
    pid: int
    role: str
    group_id: str
    state: str
    age_seconds: float
    alive: bool
    liveness: Literal["alive", "stopping", "stale"] = Field(
        description="judged from the heartbeat file alone: fresh and not stopping = alive"
    )
    assigned_partitions: int
    paused_partitions: int
    circuit_state: CircuitStateName | None = Field(
        default=None,
        description="this process's outage circuit breaker; null before it reported one "
        "(an open circuit never makes the sidecar unready)",
    )
    circuit_last_error: str | None = Field(
        default=None, description="the last retryable failure its breaker counted"
    )


class ReadinessCircuit(BaseModel):
    """Absent fields are unknown (no live worker process reported its circuit)."""

    state: CircuitStateName | None = Field(
        default=None,
        description="the worst circuit among the live worker processes; absent if none reported",
    )
    last_error: str | None = Field(
        default=None, description="the last retryable failure counted by that process's breaker"
    )


ReadinessReason = Literal["broker_unreachable", "no_live_worker", "worker_heartbeat_stale"]


class Readiness(BaseModel):
    """Without a valid API token only ``status`` and ``reasons`` (codes) are given: nothing
    about where the cluster or the workers are."""

    status: Literal["ready", "not_ready"]
    reasons: list[ReadinessReason] = Field(
        description="why the sidecar is not ready, as codes; empty when ready"
    )
    details: list[str] | None = Field(
        default=None, description="one sentence per reason (valid API token only)"
    )
    broker: dict[str, Any] | None = Field(
        default=None, description="the broker's answer (valid API token only)"
    )
    workers: list[WorkerState] | None = Field(
        default=None, description="worker heartbeats on this host (valid API token only)"
    )
    circuit: ReadinessCircuit | None = Field(
        default=None,
        description="the outage circuit breaker (valid API token only); informative: an open "
        "circuit is a downstream outage, which restarting this pod cannot fix",
    )


class Preview(BaseModel):
    """Bytes shown as text when they are UTF-8, else base64; at most ``preview_bytes``."""

    encoding: Literal["utf-8", "base64"] | None = Field(description="null when the bytes are null")
    data: str | None
    size: int = Field(description="full size in bytes")
    truncated: bool


class HeaderPreview(Preview):
    name: str


class LedgerEntryOut(BaseModel):
    replay_id: str
    target_topic: str | None = None
    target_partition: int | None = None
    target_offset: int | None = None
    replayed_at_ms: int = 0
    forced: bool = False
    by: str = ""


class FailedRecordOut(BaseModel):
    topic: str
    partition: int
    offset: int
    timestamp: int = Field(description="Kafka timestamp (epoch ms): when it was dead-lettered")
    coordinate: str = Field(description="topic/partition/offset: the ledger key")
    retryd: dict[str, str | int | None] = Field(description="decoded retryd headers")
    headers: list[HeaderPreview] = Field(description="user headers, in order")
    headers_error: str | None = Field(
        default=None,
        description="why some or all of the record's headers could not be read (header names "
        "that are not UTF-8): they are missing from retryd and headers",
    )
    format: str = Field(
        default="retryd",
        description="who wrote the dead letter: retryd, or the system of a foreign_dead_letters "
        "topic (spring, karafka, connect, share_group) whose headers retryd shows mapped",
    )
    mapping_problems: list[str] = Field(
        default_factory=list,
        description="what could not be read of a foreign dead letter's headers (those fields "
        "are null in retryd)",
    )
    key: Preview
    value: Preview
    replayed: LedgerEntryOut | None = Field(
        default=None, description="the ledger entry if this record was replayed"
    )


class FailedPage(BaseModel):
    items: list[FailedRecordOut]
    next_cursor: str = Field(description="opaque; pass it back as cursor= for the next page")
    has_more: bool = Field(description="false when every partition was read to its end")
    scanned: int = Field(description="records examined for this page")


TIME_FORMS = "ISO-8601 (2024-05-01T10:00:00Z; UTC without an offset) or relative (30m, 2h, 7d)"


class FilterIn(BaseModel):
    """Which failed records a job covers; every given field must match."""

    model_config = ConfigDict(extra="forbid")

    original_topic: str | None = Field(default=None, max_length=249)
    error_class: str | None = Field(default=None, max_length=1024)
    dead_reason: DeadReason | None = None
    since_ms: int | None = Field(default=None, ge=0, le=MAX_MS, description="epoch ms, inclusive")
    until_ms: int | None = Field(default=None, ge=0, le=MAX_MS, description="epoch ms, exclusive")
    since: str | None = Field(
        default=None,
        max_length=64,
        pattern=TIME_PATTERN,
        description=f"instead of since_ms, inclusive: {TIME_FORMS}",
    )
    until: str | None = Field(
        default=None,
        max_length=64,
        pattern=TIME_PATTERN,
        description=f"instead of until_ms, exclusive: {TIME_FORMS}",
    )
    key: str | None = Field(
        default=None, max_length=MAX_KEY_CHARS, description="exact key, as UTF-8"
    )
    key_base64: str | None = Field(
        default=None,
        max_length=MAX_KEY_BASE64_CHARS,
        pattern=BASE64_PATTERN,
        description="exact key, base64",
    )
    partition: int | None = Field(default=None, ge=0, le=MAX_PARTITION)


class ReplayOneIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: str | None = Field(
        default=None,
        pattern=TOPIC_PATTERN,
        description="target topic (default: the record's original topic); must be allowed",
    )
    force: bool = Field(default=False, description="replay even if the ledger has it")


class ReplayOneOut(BaseModel):
    replay_id: str
    coordinate: str
    target_topic: str
    target_partition: int
    target_offset: int
    forced: bool
    previous: LedgerEntryOut | None
    concurrent_replays: list[LedgerEntryOut] = Field(
        description="other replays of the same record that raced this one (normally empty)"
    )


class ReplayJobIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    filter: FilterIn = Field(default_factory=FilterIn)
    topic: str | None = Field(
        default=None,
        pattern=TOPIC_PATTERN,
        description=f"the dead-letter topic to replay from: {SOURCE_TOPIC_FORMS}",
    )
    target: str | None = Field(
        default=None,
        pattern=TOPIC_PATTERN,
        description="one target for every record (default: each record's original topic)",
    )
    max_per_second: float = Field(default=100.0, gt=0, le=100_000)
    max_messages: int | None = Field(default=None, ge=1, le=10**9)
    dry_run: bool = False
    force: bool = False


class ReplayJobOut(BaseModel):
    id: str
    state: Literal["pending", "counting", "running", "completed", "cancelled", "failed"]
    dry_run: bool
    topic: str = Field(description="the dead-letter topic the job reads")
    filter: dict[str, Any]
    target: str | None
    max_per_second: float
    max_messages: int | None
    force: bool
    requested_by: str = Field(description="id of the API token that started the job")
    scanned: int
    matched: int = Field(description="records matching the filter in the job's snapshot")
    to_replay: int = Field(description="matched records the job expects to replay")
    replayed: int
    skipped: int
    failed: int
    skipped_reasons: dict[str, int]
    by_target: dict[str, int]
    by_dead_reason: dict[str, int]
    by_error_class: dict[str, int]
    rate_per_second: float
    eta_seconds: float | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    stop_reason: str | None
    position: dict[str, int] = Field(description="next offset per partition: where it stopped")
    end_offsets: dict[str, int] = Field(description="the job's snapshot end per partition")
    last_replayed: str | None
    errors: list[str]


class ReplayJobList(BaseModel):
    jobs: list[ReplayJobOut]


class CircuitOrderIn(BaseModel):
    """An operator's order to every worker process of this sidecar's group."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["open", "close", "probe"] = Field(
        description="open: stop calling the handler now (held records stay in place); close: "
        "resume now; probe: let one call through now (an open circuit only)"
    )


class CircuitOrderOut(BaseModel):
    seq: int = Field(description="order number; each worker process applies an order once")
    action: Literal["open", "close", "probe"]
    by: str = Field(description="id of the API token that gave the order")
    at_ms: int = Field(description="when it was written (epoch ms)")


class CircuitProcessOut(BaseModel):
    pid: int
    liveness: Literal["alive", "stopping"]
    state: CircuitStateName | None = Field(
        description="null before this process's first report (or a worker without a breaker)"
    )
    since_ms: int | None = None
    reason: str | None = None
    last_error: str | None = None
    next_probe_ms: int | None = None
    transitions: dict[str, int] = Field(default_factory=dict)
    held: int = 0
    probes: int = 0


class CircuitOut(BaseModel):
    group: str
    state: CircuitStateName | None = Field(
        description="the worst state among the live worker processes (open > half_open > "
        "closed); null when no live process reported its circuit"
    )
    last_error: str | None = Field(
        description="the last retryable failure counted, from the process in the worst state"
    )
    held: int = Field(description="records held in place, summed over the live processes")
    processes: list[CircuitProcessOut]
    last_order: CircuitOrderOut | None = Field(
        description="the last order written for this group by a sidecar sharing the state dir"
    )
