"""retryd settings: ``RETRYD_*`` environment variables, an optional TOML file, CLI overrides.

Precedence, highest first: explicit overrides (CLI flags) > environment > TOML file > defaults.
"""

from __future__ import annotations

import contextvars
import enum
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.exceptions import SettingsError

from retryd.errors import ConfigError, SequenceError
from retryd.policy.circuit import BreakerPolicy
from retryd.policy.error_routes import routes_from_value
from retryd.policy.foreign import topics_from_value
from retryd.policy.key_order import KeyOrder, OnDeadLetter
from retryd.policy.sequence import RetryPlan, validate_topic_name

_SECRET_KEY_RE = re.compile(
    r"(password|secret|token|credential|\.key$|key\.pem|oauthbearer\.config)"
)
_KAFKA_KEY_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_LEVELS = {"debug", "info", "warning", "error"}
# consumer_mode = share with handler_timeout_s unset: under the broker's default 30 s record lock,
# with the 2 s retryd.share.group keeps to route and acknowledge
SHARE_HANDLER_TIMEOUT_S = 25.0
_TOML_DATA: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "retryd_toml", default=None
)


class Role(enum.StrEnum):
    """Which topics a worker consumes: everything, only the main topics, or only the tiers."""

    ALL = "all"
    MAIN = "main"
    TIERS = "tiers"


class TierConsumer(enum.StrEnum):
    """Role ``all``: the tiers on a consumer (group member) of their own, with their own small
    prefetch and assignment (``own``), or on the main topics' consumer (``shared``, the
    earlier design). Exactly-once routing always shares one (retryd.worker.split_consumer)."""

    OWN = "own"
    SHARED = "shared"


class ConsumerMode(enum.StrEnum):
    """How the main topics are read. ``group``: a consumer group, one member per partition,
    key order kept (``ordering``). ``share``: a share group (KIP-932, Kafka >= 4.2), any
    number of members per partition, each record acknowledged on its own, no order
    (retryd.share). The tiers are read by a consumer group in both modes."""

    GROUP = "group"
    SHARE = "share"


class LogLevel(enum.StrEnum):
    """The least severe log records written."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


class LogFormat(enum.StrEnum):
    """``text``: one readable line per record; ``json``: one JSON object per line, for log
    collectors (retryd.runtime.logs)."""

    TEXT = "text"
    JSON = "json"


class GroupProtocol(enum.StrEnum):
    """How the worker group shares partitions. ``classic``: JoinGroup/SyncGroup with the
    cooperative-sticky assignor (any Kafka); it balances partition *counts* over every
    subscribed topic, so a member that joins later can be handed only tier partitions while
    another keeps every main-topic partition. ``consumer``: the broker-driven protocol of
    KIP-848 (Kafka >= 4.0) with the range assignor: each topic's partitions are split evenly,
    partition i of the main topic and of every tier on the same member."""

    CLASSIC = "classic"
    CONSUMER = "consumer"


class Ordering(enum.StrEnum):
    """Which handler calls may overlap: same key (per partition) never, same partition never,
    or any."""

    KEY = "key"
    PARTITION = "partition"
    NONE = "none"


def redact_kafka(options: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka options safe to log: secret-looking values replaced."""
    return {k: ("***" if _SECRET_KEY_RE.search(k) else v) for k, v in options.items()}


def _split_list(value: Any) -> Any:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class _TomlSource(PydanticBaseSettingsSource):
    """Values of the TOML file given to ``load_settings`` (lowest priority above defaults)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return (_TOML_DATA.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_TOML_DATA.get() or {})


class _EnvSource(EnvSettingsSource):
    """RETRYD_* variables. Undecodable JSON (RETRYD_KAFKA) is passed on as the raw string so
    the field validator reports it as a readable config line instead of a crash; valid JSON
    still merges key by key with the TOML [kafka] table."""

    def decode_complex_value(self, field_name: str, field: Any, value: Any) -> Any:
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError:
            return value


def read_kafka_file(path: Path) -> tuple[dict[str, str], list[str]]:
    """librdkafka options from a properties file: ``key=value`` per line, ``#`` comments.

    Read once at start-up (a Kubernetes Secret mounted as a file: restart to pick up a change).
    Problems name the line and the key, never a value (the file holds credentials)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return {}, [f"kafka_file: cannot read {path} ({exc.__class__.__name__})"]
    options: dict[str, str] = {}
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _KAFKA_KEY_RE.match(key):
            problems.append(f"kafka_file {path} line {number}: expected key=value")
            continue
        options[key] = value.strip()
    return options, problems


class Settings(BaseSettings):
    """Every setting retryd reads. ``config/retryd.toml`` documents each one."""

    model_config = SettingsConfigDict(env_prefix="RETRYD_", frozen=True, extra="forbid")
    _kafka_from_file: dict[str, str] = PrivateAttr(default_factory=dict)

    # Cluster
    bootstrap_servers: str = "localhost:9092"
    kafka: dict[str, str] = Field(default_factory=dict)
    # librdkafka options from a file (key=value lines), e.g. SASL credentials from a Secret
    kafka_file: Path | None = None
    # Topics and retry policy
    main_topics: Annotated[list[str], NoDecode] = Field(default_factory=list)
    retry_sequence: str = "5m,5m,30m,30m,30m,1h"
    # Error routes: matcher (exception class, http_503, http_5xx) -> retry sequence,
    # "dlt:<topic>" or "dead" (retryd.policy.error_routes)
    error_routes: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    tier_template: str = "retry_{delay}"
    failed_topic: str = "failed_topic"
    group_id: str = "retryd"
    # Handler
    handler: str = ""
    handler_timeout_s: float = Field(default=30.0, gt=0)
    # 0: one record per handler call; n >= 1: up to n ready records per call (a python:
    # handler's ``handle_batch(records) -> outcomes``, an HTTP handler's bulk mode)
    handler_batch: int = Field(default=0, ge=0, le=10_000)
    non_retryable: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Worker
    role: Role = Role.ALL
    # "group" (a consumer group) or "share" (a share group reads the main topics: retryd.share)
    consumer_mode: ConsumerMode = ConsumerMode.GROUP
    processes: int = Field(default=1, ge=1, le=256)
    batch_size: int = Field(default=500, ge=1, le=100_000)
    max_in_flight: int = Field(default=16, ge=1, le=4096)
    ordering: Ordering = Ordering.KEY
    partition_buffer: int = Field(default=10_000, ge=1, le=1_000_000)
    tier_buffer: int = Field(default=1000, ge=1, le=1_000_000)
    buffer_bytes: int = Field(default=64 * 1024 * 1024, ge=64 * 1024)
    shutdown_timeout_s: float = Field(default=20.0, gt=0, le=3600)
    group_protocol: GroupProtocol = GroupProtocol.CLASSIC
    session_timeout_ms: int = Field(default=45_000, ge=1_000)
    max_poll_interval_ms: int = Field(default=300_000, ge=1_000)
    poll_timeout_s: float = Field(default=0.5, gt=0, le=10)
    max_abandoned_handlers: int = Field(default=8, ge=1)
    tier_prefetch_kbytes: int = Field(default=1024, ge=1)
    tier_consumer: TierConsumer = TierConsumer.OWN
    # Outage circuit breaker (retryd.policy.circuit): opens when, over the last
    # circuit_window_calls calls of the last circuit_window_s, retryable failures are at least
    # circuit_failure_ratio of them, at least circuit_min_failures, from circuit_min_keys keys
    circuit_breaker: bool = True
    circuit_window_calls: int = Field(default=100, ge=1, le=100_000)
    circuit_window_s: float = Field(default=60.0, gt=0, le=3600)
    circuit_failure_ratio: float = Field(default=0.5, gt=0, le=1)
    circuit_min_failures: int = Field(default=20, ge=1)
    circuit_min_keys: int = Field(default=5, ge=1)
    # half-open probes: first after circuit_probe_s, then x2 (+-20 % jitter) up to the max
    circuit_probe_s: float = Field(default=5.0, gt=0, le=3600)
    circuit_probe_max_s: float = Field(default=60.0, gt=0, le=86_400)
    # Strict per-key order through the retry chain (retryd.policy.key_order): while a key has
    # a record anywhere in the chain, later records of that key wait behind it. The state
    # lives in key_state_topic (compacted; 'retryd topics create' makes it).
    key_order: KeyOrder = KeyOrder.NONE
    key_order_topics: Annotated[list[str], NoDecode] = Field(default_factory=list)  # [] = all
    key_state_topic: str = "retryd_key_state"
    key_state_partitions: int | None = Field(default=None, ge=1)  # None: the tiers' count
    # a key blocked longer than this no longer holds its followers back (0: no cap)
    key_order_max_blocked_s: float = Field(default=86_400.0, ge=0)
    key_order_on_dead_letter: OnDeadLetter = OnDeadLetter.RELEASE
    key_order_max_entries: int = Field(default=1_000_000, ge=1)
    # Exactly-once routing: routed copies and input offsets commit in one Kafka transaction
    exactly_once: bool = False
    transaction_interval_ms: int = Field(default=100, ge=10, le=60_000)
    # Transactional id prefix; "" = retryd-<group_id>-<role>-<hostname>; the process slot
    # (0 .. processes-1) is appended, so a restarted process fences its predecessor
    transactional_id: str = Field(default="", max_length=200)
    state_dir: Path = Path("/tmp/retryd")
    # Topic provisioning
    replication_factor: int = Field(default=-1, ge=-1)
    # min.insync.replicas of the topics retryd creates; None = the broker's default
    min_insync_replicas: int | None = Field(default=None, ge=1)
    tier_partitions: int | None = Field(default=None, ge=1)
    tier_retention_factor: int = Field(default=10, ge=2, le=1000)
    tier_min_retention_ms: int = Field(default=7 * 86_400_000, ge=60_000)
    failed_retention_ms: int = Field(default=30 * 86_400_000, ge=-1)
    # Sidecar
    sidecar_host: str = "0.0.0.0"
    sidecar_port: int = Field(default=8080, ge=0, le=65535)
    sidecar_tls_cert_file: Path | None = None
    sidecar_tls_key_file: Path | None = None
    sidecar_max_body_bytes: int = Field(default=65_536, ge=1024, le=64 * 1024 * 1024)
    sidecar_max_inflight: int = Field(default=8, ge=1, le=256)
    # Dead-letter explorer (/ui): sessions expire after idle_s without a request, and max_s
    # after sign-in whatever happens; at most max_sessions at once (the oldest goes first).
    # An overview reads at most overview_scan_max records per dead-letter topic.
    explorer_session_idle_s: float = Field(default=1800.0, gt=0, le=86_400)
    explorer_session_max_s: float = Field(default=28_800.0, gt=0, le=7 * 86_400)
    explorer_max_sessions: int = Field(default=1000, ge=1, le=100_000)
    explorer_overview_scan_max: int = Field(default=20_000, ge=100, le=1_000_000)
    # API tokens (the sidecar reads and checks them at start-up: retryd.api.credentials)
    api_token: SecretStr | None = None
    api_token_file: Path | None = None
    api_tokens: Annotated[list[SecretStr], NoDecode] = Field(default_factory=list)
    api_tokens_file: Path | None = None
    # Replay
    replay_allowlist: Annotated[list[str], NoDecode] = Field(default_factory=list)
    replay_max_per_second: float = Field(default=500.0, gt=0, le=1_000_000)
    ledger_topic: str = "retryd_replay_ledger"
    # Other systems' dead-letter topics, browsed and replayed like failed_topic: topic ->
    # spring | karafka | connect | share_group | auto (retryd.policy.foreign)
    foreign_dead_letters: Annotated[dict[str, str], NoDecode] = Field(default_factory=dict)
    readiness_timeout_s: float = Field(default=2.0, gt=0)
    heartbeat_stale_s: float = Field(default=15.0, gt=0)
    # How often the sidecar measures lag, the dead-letter backlog and the replay ledger
    metrics_interval_s: float = Field(default=5.0, gt=0, le=300)
    # Logging (the --log-level / --log-format flags override these)
    log_level: LogLevel = LogLevel.INFO
    log_format: LogFormat = LogFormat.TEXT

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, _EnvSource(settings_cls), _TomlSource(settings_cls))

    _split = field_validator(
        "main_topics",
        "key_order_topics",
        "non_retryable",
        "replay_allowlist",
        "api_tokens",
        mode="before",
    )(_split_list)

    @field_validator(
        "kafka_file",
        "api_token_file",
        "api_tokens_file",
        "sidecar_tls_cert_file",
        "sidecar_tls_key_file",
        mode="before",
    )
    @classmethod
    def _blank_path(cls, value: Any) -> Any:
        # FOO_FILE= (blank, as compose files pass unset variables) means "not set".
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _log_case(cls, value: Any) -> Any:
        # RETRYD_LOG_LEVEL=info and log_format = "JSON" mean the obvious thing
        if not isinstance(value, str):
            return value
        return value.strip().upper() if value.strip().lower() in _LEVELS else value.strip().lower()

    @field_validator("kafka", mode="before")
    @classmethod
    def _kafka_strings(cls, value: Any) -> Any:
        if isinstance(value, str):
            import json

            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ValueError("must be a JSON object of librdkafka options") from exc
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if not _KAFKA_KEY_RE.match(str(key)):
                    raise ValueError(f"{key!r} is not a librdkafka option name")
                if not isinstance(item, str | int | float | bool):
                    raise ValueError(f"{key!r} must be a string, number or boolean")
                out[str(key)] = str(item).lower() if isinstance(item, bool) else str(item)
            return out
        return value

    @field_validator("retry_sequence")
    @classmethod
    def _sequence(cls, value: str) -> str:
        try:
            RetryPlan.parse(value, failed_topic="failed_topic")
        except SequenceError as exc:
            raise ValueError(exc.problems[0]) from exc
        return value

    @field_validator("error_routes", mode="before")
    @classmethod
    def _error_routes(cls, value: Any) -> Any:
        # shape only (a TOML table, JSON or 'matcher=target; ...'); the routes themselves are
        # checked with the plan (_consistent), one line per problem naming its route
        return routes_from_value(value)

    @field_validator("foreign_dead_letters", mode="before")
    @classmethod
    def _foreign_dead_letters(cls, value: Any) -> Any:
        # topic names and format names (one of spring, karafka, connect, share_group, auto)
        return topics_from_value(value)

    @field_validator("main_topics", "failed_topic", "ledger_topic", "key_state_topic")
    @classmethod
    def _topic_names(cls, value: list[str] | str) -> list[str] | str:
        # SequenceError is not a ValueError: re-raise so the line names the field and value.
        for topic in [value] if isinstance(value, str) else value:
            try:
                validate_topic_name(topic)
            except SequenceError as exc:
                raise ValueError(exc.problems[0]) from exc
        return value

    @field_validator("tier_template")
    @classmethod
    def _template(cls, value: str) -> str:
        try:
            RetryPlan.parse("1s", tier_template=value, failed_topic="failed_topic", group="g")
        except SequenceError as exc:
            raise ValueError(exc.problems[0]) from exc
        return value

    @field_validator("api_token", mode="before")
    @classmethod
    def _blank_token(cls, value: Any) -> Any:
        # RETRYD_API_TOKEN= (blank, as compose files often pass it) means "no token": /v1 off.
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("handler")
    @classmethod
    def _handler_spec(cls, value: str) -> str:
        if value and not value.startswith(("python:", "http://", "https://")):
            raise ValueError("must be 'python:package.module:function' or an http(s):// URL")
        if value.startswith("python:") and value.count(":") != 2:
            raise ValueError("python handler must look like 'python:package.module:function'")
        return value

    @model_validator(mode="before")
    @classmethod
    def _share_default_timeout(cls, data: Any) -> Any:
        """In share mode a call must end within the group's record lock (the broker's default
        is 30 s, with 2 s to route and acknowledge: ``retryd.share.group``), so an unset
        ``handler_timeout_s`` means ``SHARE_HANDLER_TIMEOUT_S`` there: the defaults start."""
        if isinstance(data, dict) and "handler_timeout_s" not in data:
            mode = data.get("consumer_mode")
            if str(getattr(mode, "value", mode)).lower() == ConsumerMode.SHARE.value:
                return {**data, "handler_timeout_s": SHARE_HANDLER_TIMEOUT_S}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        problems: list[str] = []
        try:
            self.plan  # noqa: B018 - parse for validation
        except SequenceError as exc:
            problems.extend(exc.problems)
        if self.handler_timeout_s * 1000 >= self.max_poll_interval_ms:
            problems.append(
                f"handler_timeout_s={self.handler_timeout_s:g} must be below "
                f"max_poll_interval_ms={self.max_poll_interval_ms} (a handler call blocks polling)"
            )
        if self.handler_batch and self._plan_quick():
            problems.append(
                f"handler_batch={self.handler_batch} does not work with quick retries in "
                "retry_sequence (quick=<n>@<delay>) yet"
            )
        if self.session_timeout_ms > self.max_poll_interval_ms:
            problems.append("session_timeout_ms must not exceed max_poll_interval_ms")
        if set(self.main_topics) & ({self.failed_topic, *self.plan_topics_or_empty()}):
            problems.append("main_topics must not include a tier topic or failed_topic")
        for topic in self.dlt_topics_or_empty():
            if topic in self.main_topics or topic == self.ledger_topic:
                what = "a main topic" if topic in self.main_topics else "the ledger_topic"
                problems.append(f"error_routes: dlt:{topic} is {what}")
        problems.extend(self._key_order_problems())
        problems.extend(self._share_problems())
        problems.extend(self._foreign_problems())
        isr, rf = self.min_insync_replicas, self.replication_factor
        if isr is not None and rf > 0 and isr > rf:
            problems.append(
                f"min_insync_replicas={isr} exceeds replication_factor={rf}: every acks=all "
                "write to retryd's topics would be refused"
            )
        if (self.sidecar_tls_cert_file is None) != (self.sidecar_tls_key_file is None):
            problems.append(
                "sidecar_tls_cert_file and sidecar_tls_key_file must be set together (TLS "
                "needs both the certificate and its private key)"
            )
        if self.kafka_file is not None:
            options, file_problems = read_kafka_file(self.kafka_file)
            problems.extend(file_problems)
            self._kafka_from_file = options
        try:
            self.breaker_policy  # noqa: B018 - validate the combination
        except ValueError as exc:
            problems.append(str(exc))
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _key_order_problems(self) -> list[str]:
        problems = []
        unknown = sorted(set(self.key_order_topics) - set(self.main_topics))
        if unknown:
            problems.append(f"key_order_topics {', '.join(unknown)} are not main topics")
        state = self.key_state_topic
        if state in {*self.main_topics, self.failed_topic, self.ledger_topic}:
            problems.append(f"key_state_topic {state} is already used for another purpose")
        if state in {*self.plan_topics_or_empty(), *self.dlt_topics_or_empty()}:
            problems.append(f"key_state_topic {state} is a tier or dead-letter topic")
        if self.key_order is KeyOrder.STRICT:
            if self.ordering is not Ordering.KEY:
                problems.append("key_order=strict needs ordering=key")
            if self.exactly_once:
                problems.append("key_order=strict does not work with exactly_once yet")
        return problems

    def _share_problems(self) -> list[str]:
        """consumer_mode = share: what a share group cannot give, refused with the reason.
        ``ordering`` must say ``none`` explicitly rather than be implied, so the settings a
        worker logs say what it does (a share group hands one partition's records to many
        members at once: neither key nor partition order exists)."""
        if self.consumer_mode is not ConsumerMode.SHARE:
            return []
        problems = []
        if self.ordering is not Ordering.NONE:
            problems.append(
                f"consumer_mode=share needs ordering=none (ordering={self.ordering.value}): a "
                "share group hands the records of one partition to many consumers at once, so "
                "no key or partition order is kept"
            )
        if self.key_order is KeyOrder.STRICT:
            problems.append(
                "consumer_mode=share does not work with key_order=strict: a share group keeps "
                "no key order to hold records back in"
            )
        if self.exactly_once:
            problems.append(
                "consumer_mode=share does not work with exactly_once: a share group's "
                "acknowledgements cannot be part of a Kafka transaction"
            )
        if self.handler_batch:
            problems.append(
                f"consumer_mode=share does not work with handler_batch={self.handler_batch} "
                "yet: one record per handler call"
            )
        return problems

    @property
    def share_group_id(self) -> str:
        """The share group reading the main topics (consumer_mode = share). Kafka keeps one
        namespace for every kind of group, and the tiers stay on the consumer group
        ``group_id``: the share group is ``<group_id>.share``."""
        return f"{self.group_id}.share"

    def _foreign_problems(self) -> list[str]:
        """A foreign dead-letter topic is read and replayed from: never one of retryd's own."""
        own = {
            **dict.fromkeys(self.main_topics, "a main topic"),
            **dict.fromkeys(self.plan_topics_or_empty(), "a retry tier"),
            **dict.fromkeys(self.dlt_topics_or_empty(), "a dlt: topic of error_routes"),
            self.failed_topic: "failed_topic",
            self.ledger_topic: "the ledger_topic",
            self.key_state_topic: "the key_state_topic",
        }
        problems = [
            f"foreign_dead_letters: {topic} is {own[topic]}"
            for topic in self.foreign_dead_letters
            if topic in own
        ]
        problems.extend(
            f"foreign_dead_letters: {topic} is a Kafka-internal topic (its name starts with __)"
            for topic in self.foreign_dead_letters
            if topic.startswith("__")
        )
        return problems

    @property
    def strict_topics(self) -> frozenset[str]:
        """The main topics whose keys keep their order through the chain."""
        if self.key_order is not KeyOrder.STRICT:
            return frozenset()
        return frozenset(self.key_order_topics or self.main_topics)

    @property
    def breaker_policy(self) -> BreakerPolicy:
        return BreakerPolicy(
            enabled=self.circuit_breaker,
            window_calls=self.circuit_window_calls,
            window_s=self.circuit_window_s,
            failure_ratio=self.circuit_failure_ratio,
            min_failures=self.circuit_min_failures,
            min_keys=self.circuit_min_keys,
            probe_initial_s=self.circuit_probe_s,
            probe_max_s=self.circuit_probe_max_s,
            confirm_probe_s=self._first_retry_s(),
        )

    def _first_retry_s(self) -> float | None:
        """The first tier's delay (seconds), if the sequence has a tier: how soon a failed
        record is retried by its tier anyway."""
        try:
            first = self.plan.next_destination(0)
        except SequenceError:
            return None
        if first.is_dead or not first.delay_ms:
            return None
        return first.delay_ms / 1000

    def _plan_quick(self) -> int:
        try:
            return self.plan.quick
        except SequenceError:
            return 0

    def plan_topics_or_empty(self) -> list[str]:
        try:
            return self.plan.tier_topics
        except SequenceError:
            return []

    def dlt_topics_or_empty(self) -> list[str]:
        try:
            return self.plan.dlt_topics
        except SequenceError:
            return []

    @property
    def plan(self) -> RetryPlan:
        return RetryPlan.parse(
            self.retry_sequence,
            tier_template=self.tier_template,
            failed_topic=self.failed_topic,
            group=self.group_id,
            routes=self.error_routes,
        )

    def kafka_common(self) -> dict[str, str]:
        """Cluster options shared by every client (security settings included): the
        ``[kafka]`` table, then ``kafka_file`` over it."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.kafka, **self._kafka_from_file}

    def safe_summary(self) -> dict[str, Any]:
        """Settings fit for a log line: secrets redacted."""
        data = self.model_dump(exclude={"api_token", "api_tokens", "kafka"})
        data["kafka"] = redact_kafka(self.kafka)
        data["api_token"] = "***" if self.api_token else None
        data["api_tokens"] = ["***"] * len(self.api_tokens)
        return data


def _describe(error: dict[str, Any]) -> str:
    loc = ".".join(str(p) for p in error.get("loc", ())) or "settings"
    msg = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    value = error.get("input")
    if isinstance(value, dict) or loc.split(".")[0] in ("api_token", "api_tokens", "kafka"):
        return f"{loc}: {msg}"
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return f"{loc}={shown}: {msg}"


def load_settings(config_file: Path | str | None = None, **overrides: Any) -> Settings:
    """Build Settings; raise ConfigError with one readable line per problem."""
    data: dict[str, Any] = {}
    if config_file is not None:
        path = Path(config_file)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigError([f"config file {path}: not found"]) from exc
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError([f"config file {path}: {exc}"]) from exc
        data = data.get("retryd", data)
    token = _TOML_DATA.set(data)
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except SettingsError as exc:  # a source could not even be parsed
        raise ConfigError([str(exc)]) from exc
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            if err.get("type") == "value_error" and not err.get("loc"):
                lines.extend(str(err["msg"]).removeprefix("Value error, ").split("; "))
            else:
                lines.append(_describe(dict(err)))
        raise ConfigError(lines) from exc
    finally:
        _TOML_DATA.reset(token)
