"""Topic provisioning: plan, create and check the tier, dead-letter and ledger topics.

The tiers are every tier of the plan (``retry_sequence`` and every error route's sequence, one
topic per distinct delay), the dead-letter topics ``failed_topic`` and each route's named
``dlt:<topic>`` (same shape as ``failed_topic``).

retryd never creates the main topics (they belong to the producers); it sizes its own topics
from them so a routed copy can keep its source partition number.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from retryd.config import Settings
from retryd.errors import KafkaSetupError
from retryd.kafka.clients import admin_config, common_config, new_admin
from retryd.policy.sequence import format_delay

log = logging.getLogger(__name__)

TopicKind = Literal["tier", "failed", "dlt", "ledger", "key_state"]
Status = Literal["created", "exists", "missing", "mis-sized", "ok"]

# The ledger is small (one compacted record per replayed failed record) and is read to its
# end by every sidecar at start-up, so one partition keeps that read simple and ordered.
LEDGER_PARTITIONS = 1
RETENTION_MS = "retention.ms"
CLEANUP_POLICY = "cleanup.policy"
MIN_INSYNC = "min.insync.replicas"
DELETE_RETENTION = "delete.retention.ms"
# Tombstones of the key-state topic stay readable this long: a worker that reads the topic
# recognises a late duplicate copy of a finished chain entry by its tombstone.
KEY_STATE_DELETE_RETENTION_MS = 7 * 86_400_000


@dataclass(frozen=True)
class TopicSpec:
    """The shape retryd wants one of its topics to have."""

    name: str
    kind: TopicKind
    partitions: int
    replication_factor: int  # -1 = broker default
    config: dict[str, str] = field(default_factory=dict)
    delay_ms: int | None = None  # tiers only

    @property
    def retention_ms(self) -> int | None:
        value = self.config.get(RETENTION_MS)
        return int(value) if value is not None else None

    @property
    def min_insync_replicas(self) -> int | None:
        value = self.config.get(MIN_INSYNC)
        return int(value) if value is not None else None


@dataclass(frozen=True)
class TopicState:
    """What the cluster has for one planned topic, and what is wrong with it."""

    spec: TopicSpec
    status: Status
    partitions: int | None = None  # actual; None when missing
    retention_ms: int | None = None  # actual; None when missing or not reported
    cleanup_policy: str | None = None
    problems: tuple[str, ...] = ()
    min_insync_replicas: str | None = None  # actual, as the broker reports it


def make_admin(settings: Settings) -> AdminClient:
    """An AdminClient with the cluster options (security included) and Python logging."""
    return new_admin(admin_config(common_config(settings), "topics"))


def _kafka_error(exc: BaseException) -> str:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        err: KafkaError = exc.args[0]
        return f"{err.name()}: {err.str()}"
    return str(exc) or type(exc).__name__


def partition_counts(admin: AdminClient, timeout_s: float = 10.0) -> dict[str, int]:
    """Partition count of every topic in the cluster.

    Lists all topics rather than asking for names: a metadata request for a named topic can
    auto-create it on brokers with ``auto.create.topics.enable`` (an admin handle allows it).
    """
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise KafkaSetupError(
            f"cannot list topics (is the cluster reachable?): {_kafka_error(exc)}"
        ) from exc
    return {
        name: len(meta.partitions) for name, meta in metadata.topics.items() if meta.error is None
    }


def tier_partition_count(settings: Settings, existing: dict[str, int]) -> int:
    """``tier_partitions`` if set, else the largest partition count among the main topics."""
    if settings.tier_partitions is not None:
        return settings.tier_partitions
    if not settings.main_topics:
        raise KafkaSetupError(
            "cannot size the retry topics: main_topics is empty and tier_partitions is not set"
        )
    missing = [t for t in settings.main_topics if t not in existing]
    if missing:
        raise KafkaSetupError(
            f"main topic(s) {', '.join(missing)} do not exist: create them first or set "
            "tier_partitions (RETRYD_TIER_PARTITIONS) to size the retry topics"
        )
    return max(existing[t] for t in settings.main_topics)


def _plan(settings: Settings, partitions: int) -> list[TopicSpec]:
    plan = settings.plan
    rf = settings.replication_factor
    # Every topic retryd writes gets the same durability: a routed copy (acks=all) is only
    # acknowledged once min.insync.replicas hold it, so its input may then be committed.
    durability = (
        {MIN_INSYNC: str(settings.min_insync_replicas)}
        if settings.min_insync_replicas is not None
        else {}
    )
    specs = []
    for topic, delay in plan.tier_delays.items():
        retention = max(settings.tier_retention_factor * delay, settings.tier_min_retention_ms)
        config = {RETENTION_MS: str(retention), CLEANUP_POLICY: "delete", **durability}
        specs.append(TopicSpec(topic, "tier", partitions, rf, config, delay))
    failed_config = {
        RETENTION_MS: str(settings.failed_retention_ms),
        CLEANUP_POLICY: "delete",
        **durability,
    }
    specs.append(TopicSpec(settings.failed_topic, "failed", partitions, rf, failed_config))
    for topic in plan.dlt_topics:  # error routes' dead-letter topics: failed_topic's shape
        specs.append(TopicSpec(topic, "dlt", partitions, rf, dict(failed_config)))
    ledger_config = {CLEANUP_POLICY: "compact", **durability}
    specs.append(TopicSpec(settings.ledger_topic, "ledger", LEDGER_PARTITIONS, rf, ledger_config))
    if settings.strict_topics:  # key_order = strict: the chain entries of every blocked key
        state_config = {
            CLEANUP_POLICY: "compact",
            DELETE_RETENTION: str(KEY_STATE_DELETE_RETENTION_MS),
            **durability,
        }
        state_partitions = settings.key_state_partitions or partitions
        specs.append(
            TopicSpec(settings.key_state_topic, "key_state", state_partitions, rf, state_config)
        )
    return specs


def plan_topics(settings: Settings, admin: AdminClient, timeout_s: float = 10.0) -> list[TopicSpec]:
    """Every topic retryd needs: tiers (retry_sequence's in order, then the routes'), then
    failed_topic, the routes' dead-letter topics and the ledger."""
    return _plan(settings, tier_partition_count(settings, partition_counts(admin, timeout_s)))


def ledger_policy_problem(name: str, policy: str | None) -> str | None:
    """Why an existing ledger topic with this ``cleanup.policy`` cannot be used, or None.

    Only ``compact`` keeps an entry for as long as its key exists: with ``delete`` (alone or
    with compact) entries expire and the records they protect could be replayed again.
    """
    policies = {p.strip() for p in (policy or "").split(",") if p.strip()}
    if policies == {"compact"}:
        return None
    shown = policy if policy is not None else "(not reported)"
    return (
        f"ledger topic {name} has cleanup.policy={shown}, expected compact: "
        "replay records would expire and failed records could be replayed twice"
    )


def topic_configs(
    admin: AdminClient, names: Iterable[str], timeout_s: float
) -> dict[str, dict[str, str | None]]:
    """The configuration of existing topics, by name. Raises KafkaSetupError."""
    return _describe(admin, names, timeout_s)


def _describe(
    admin: AdminClient, names: Iterable[str], timeout_s: float
) -> dict[str, dict[str, str | None]]:
    resources = [ConfigResource(ResourceType.TOPIC, n) for n in names]
    if not resources:
        return {}
    out: dict[str, dict[str, str | None]] = {}
    futures = admin.describe_configs(resources, request_timeout=timeout_s)
    for resource, future in futures.items():
        try:
            entries: dict[str, Any] = future.result(timeout_s)
        except (KafkaException, TimeoutError) as exc:
            raise KafkaSetupError(
                f"cannot read the configuration of topic {resource.name}: {_kafka_error(exc)}"
            ) from exc
        out[resource.name] = {key: entry.value for key, entry in entries.items()}
    return out


def _await_visible(admin: AdminClient, names: set[str], timeout_s: float) -> dict[str, int]:
    """Wait until new topics show up in metadata: brokers learn of them asynchronously after
    the controller created them, and the next step (a worker, a check) asks a broker."""
    deadline = time.monotonic() + timeout_s
    while True:
        counts = partition_counts(admin, timeout_s)
        if names <= counts.keys() or time.monotonic() > deadline:
            missing = names - counts.keys()
            if missing:
                log.warning("created topics not yet in metadata: %s", ", ".join(sorted(missing)))
            return counts
        time.sleep(0.2)


def _human(ms: int) -> str:
    return "forever" if ms < 0 else format_delay(ms) if ms else "0ms"


def _inspect(spec: TopicSpec, partitions: int, config: dict[str, str | None]) -> TopicState:
    """Compare an existing topic with its spec. Settings the broker does not report are
    not judged (the retention check then stays silent)."""
    problems: list[str] = []
    if partitions < spec.partitions:
        problems.append(
            f"{spec.kind} topic {spec.name} has {partitions} partition(s), fewer than the "
            f"planned {spec.partitions}"
        )
    raw_retention = config.get(RETENTION_MS)
    retention = int(raw_retention) if raw_retention not in (None, "") else None
    policy = config.get(CLEANUP_POLICY)
    policies = {p.strip() for p in (policy or "").split(",") if p.strip()}
    delay = spec.delay_ms
    if (
        spec.kind == "tier"
        and delay is not None
        and retention is not None
        and 0 <= retention < delay
    ):
        problems.append(
            f"tier topic {spec.name} has retention.ms={retention} ({_human(retention)}), "
            f"shorter than its delay {format_delay(delay)}: records would be "
            "deleted before they are due"
        )
    if spec.kind in ("tier", "failed", "dlt") and "compact" in policies:
        problems.append(
            f"{spec.kind} topic {spec.name} has cleanup.policy={policy}: compaction drops "
            "records that share a key"
        )
    if spec.kind == "ledger":
        ledger_problem = ledger_policy_problem(spec.name, policy)
        if ledger_problem is not None:
            problems.append(ledger_problem)
    if spec.kind == "key_state" and policies != {"compact"}:
        problems.append(
            f"key-state topic {spec.name} has cleanup.policy={policy or '(not reported)'}, "
            "expected compact: chain entries would expire and keys would lose their order"
        )
    isr_problem = _min_insync_problem(spec, config.get(MIN_INSYNC))
    if isr_problem is not None:
        problems.append(isr_problem)
    return TopicState(
        spec,
        "mis-sized" if problems else "exists",
        partitions,
        retention,
        policy,
        tuple(problems),
        config.get(MIN_INSYNC),
    )


def _min_insync_problem(spec: TopicSpec, actual: str | None) -> str | None:
    """Why an existing topic's ``min.insync.replicas`` differs from the plan, or None. Lower
    means an acknowledged copy may sit on fewer replicas than planned; higher, that writes
    are refused while fewer replicas are in sync than planned. Not judged when unplanned or
    not reported."""
    planned = spec.min_insync_replicas
    if planned is None or actual in (None, "") or str(actual) == str(planned):
        return None
    return (
        f"{spec.kind} topic {spec.name} has min.insync.replicas={actual}, planned {planned}: "
        "retryd never reconfigures a topic (kafka-configs --alter, or recreate it)"
    )


def _missing(spec: TopicSpec) -> TopicState:
    return TopicState(
        spec,
        "missing",
        problems=(
            f"{spec.kind} topic {spec.name} is missing (planned {spec.partitions} partitions)",
        ),
    )


def inspect_topics(
    settings: Settings, admin: AdminClient, timeout_s: float = 10.0
) -> tuple[list[str], list[TopicState]]:
    """Problems with the main topics, and the state of every topic retryd plans.

    A missing main topic is reported as a problem rather than raised; if the tier size then
    cannot be derived, the retry topics are planned with the size of the main topics that do
    exist (or 1), so the rest of the report is still useful.
    """
    existing = partition_counts(admin, timeout_s)
    main_problems = [
        f"main topic {t} is missing (retryd consumes it but does not create it)"
        for t in settings.main_topics
        if t not in existing
    ]
    try:
        count = tier_partition_count(settings, existing)
    except KafkaSetupError as exc:
        if not main_problems:
            raise
        present = [existing[t] for t in settings.main_topics if t in existing]
        count = max(present, default=1)
        log.warning("sizing retry topics with %d partition(s): %s", count, exc)
    specs = _plan(settings, count)
    configs = _describe(admin, [s.name for s in specs if s.name in existing], timeout_s)
    states = [
        _inspect(s, existing[s.name], configs.get(s.name, {}))
        if s.name in existing
        else _missing(s)
        for s in specs
    ]
    return main_problems, states


def check_topics(settings: Settings, admin: AdminClient, timeout_s: float = 10.0) -> list[str]:
    """One readable line per missing or mis-sized topic; empty when everything is in place."""
    main_problems, states = inspect_topics(settings, admin, timeout_s)
    return main_problems + [p for s in states for p in s.problems]


def create_topics(
    settings: Settings, admin: AdminClient, timeout_s: float = 30.0
) -> list[TopicState]:
    """Create the topics that are missing; idempotent.

    Existing topics are left alone and reported as ``exists`` (or ``mis-sized`` with the
    problems: retryd never shrinks, re-partitions or reconfigures a topic on its own).
    Raises KafkaSetupError naming every topic that could not be created.
    """
    existing = partition_counts(admin, timeout_s)
    specs = _plan(settings, tier_partition_count(settings, existing))
    new = [s for s in specs if s.name not in existing]
    created: set[str] = set()
    raced: set[str] = set()
    failures: list[str] = []
    if new:
        futures = admin.create_topics(
            [
                NewTopic(s.name, s.partitions, s.replication_factor, config=dict(s.config))
                for s in new
            ],
            operation_timeout=timeout_s,
            request_timeout=timeout_s,
        )
        for name, future in futures.items():
            try:
                future.result(timeout_s + 5)
                created.add(name)
                log.info("created topic %s", name)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    raced.add(name)  # created concurrently by another provisioner
                else:
                    failures.append(f"topic {name}: {_kafka_error(exc)}")
            except TimeoutError:
                failures.append(f"topic {name}: no answer within {timeout_s:g}s")
    if failures:
        raise KafkaSetupError("could not create " + "; ".join(failures))
    if created or raced:
        existing = {**existing, **_await_visible(admin, created | raced, timeout_s)}
    to_describe = [s.name for s in specs if s.name not in created]
    configs = _describe(admin, to_describe, timeout_s)
    states = []
    for spec in specs:
        if spec.name in created:
            states.append(
                TopicState(
                    spec,
                    "created",
                    spec.partitions,
                    spec.retention_ms,
                    spec.config.get(CLEANUP_POLICY),
                    min_insync_replicas=spec.config.get(MIN_INSYNC),
                )
            )
        else:
            states.append(_inspect(spec, existing.get(spec.name, 0), configs.get(spec.name, {})))
    return states
