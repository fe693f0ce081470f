"""What the worker benchmarks share: a broker per scenario, producing, the retryd CLI as a
subprocess, reading its metrics the way a dashboard would, and the raw confluent-kafka loops.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


BROKER_ENV = "RETRYD_BENCH_BROKER"
# Kafka's own default, which the test broker sets to 0 (tests join fresh groups all the time).
# With 0, the second process of ``--processes 2`` joins after the first has taken every
# partition, and the sticky reassignment can leave the whole main topic on one member: 2
# processes measured 0.67-0.82x one, against 2.24x with the default.
SERVER_OVERRIDES = {"group.initial.rebalance.delay.ms": "3000"}


def broker_kind() -> str:
    """``kafka`` (Apache Kafka, the default), ``tansu`` (``RETRYD_BENCH_BROKER=tansu``: the
    embedded stand-in the first benchmarks ran on) or ``external`` (``RETRYD_TEST_BOOTSTRAP``)."""
    if os.environ.get("RETRYD_TEST_BOOTSTRAP"):
        return "external"
    kind = os.environ.get(BROKER_ENV, "kafka").strip().lower()
    if kind in ("kafka", "apache", "apache-kafka"):
        return "kafka"
    if kind == "tansu":
        return "tansu"
    raise SystemExit(f"{BROKER_ENV}={kind!r}: expected kafka or tansu")


def tansu_version() -> str:
    from retryd.kafka.embedded import tansu_binary

    out = subprocess.run(
        [str(tansu_binary()), "--version"], capture_output=True, text=True, check=False
    ).stdout.split()
    return out[-1] if out else "unknown"


def broker_info(quick: bool = False) -> dict[str, Any]:
    """What the results were measured on: recorded in every result file and table."""
    kind = broker_kind()
    if kind == "external":
        where = os.environ["RETRYD_TEST_BOOTSTRAP"]
        return {"kind": kind, "version": "unknown", "label": f"external cluster at {where}"}
    if kind == "tansu":
        version = tansu_version()
        return {"kind": kind, "version": version, "label": f"embedded Tansu {version}"}
    from retryd.kafka.apache import JVM_FLAGS, SERVER_JVM_FLAGS, resolve_version

    version = resolve_version(None)
    return {
        "kind": kind,
        "version": version,
        "label": f"Apache Kafka {version} (KRaft, single node)",
        "jvm_flags": list(JVM_FLAGS if quick else SERVER_JVM_FLAGS),
        "overrides": {} if quick else dict(SERVER_OVERRIDES),
    }


@contextmanager
def broker(quick: bool = False) -> Iterator[str]:
    """A fresh broker per scenario (scenarios never share tiers): Apache Kafka, one KRaft node
    (``retryd.kafka.apache``, its default version unless ``RETRYD_KAFKA_VERSION``), run with
    the JVM settings of Kafka's own start scripts and Kafka's default initial rebalance delay;
    ``--quick`` keeps the fast-starting test settings. ``RETRYD_BENCH_BROKER=tansu``: the
    embedded Tansu; ``RETRYD_TEST_BOOTSTRAP``: an existing cluster, nothing started."""
    kind = broker_kind()
    if kind == "external":
        yield os.environ["RETRYD_TEST_BOOTSTRAP"]
        return
    b: Any
    if kind == "tansu":
        from retryd.kafka.embedded import EmbeddedBroker

        b = EmbeddedBroker().start()
    else:
        from retryd.kafka.apache import JVM_FLAGS, SERVER_JVM_FLAGS, ApacheKafkaBroker

        if quick:
            b = ApacheKafkaBroker(jvm_flags=JVM_FLAGS).start(timeout_s=180)
        else:
            b = ApacheKafkaBroker(jvm_flags=SERVER_JVM_FLAGS, overrides=SERVER_OVERRIDES).start(
                timeout_s=180
            )
    try:
        yield b.bootstrap
    finally:
        b.stop()


def produce(
    bootstrap: str,
    topic: str,
    n: int,
    *,
    value: Callable[[int], bytes],
    key: Callable[[int], bytes | None],
    headers: Callable[[int], list[tuple[str, bytes]]] | None = None,
    rate: float | None = None,
) -> None:
    """Produce ``n`` records (acks=all); at ``rate`` records per second when given."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000})
    start = time.monotonic()
    for i in range(n):
        if rate and i % 100 == 0:
            ahead = start + i / rate - time.monotonic()
            if ahead > 0:
                p.poll(ahead)
        kwargs: dict[str, Any] = {"key": key(i), "value": value(i)}
        if headers is not None:
            kwargs["headers"] = headers(i)
        while True:
            try:
                p.produce(topic, **kwargs)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    left = p.flush(120)
    if left:
        raise SystemExit(f"producing to {topic}: {left} records not acknowledged")


def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    from tests.support import create_topics as create

    create(bootstrap, names, partitions)


@dataclass
class Cli:
    """``retryd worker`` as users run it: a subprocess with RETRYD_* settings."""

    bootstrap: str
    main_topic: str
    handler: str
    state_dir: Path
    group: str = field(default_factory=lambda: f"bench-{uuid.uuid4().hex[:8]}")
    extra_env: dict[str, str] = field(default_factory=dict)
    log: Path | None = None
    root: Path = ROOT  # the source tree the worker runs from (another revision: a copy)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": str(self.root),
            "RETRYD_BOOTSTRAP_SERVERS": self.bootstrap,
            "RETRYD_MAIN_TOPICS": self.main_topic,
            "RETRYD_HANDLER": self.handler,
            "RETRYD_GROUP_ID": self.group,
            "RETRYD_STATE_DIR": str(self.state_dir),
            **self.extra_env,
        }

    def topics_create(self) -> None:
        subprocess.run(
            [sys.executable, "-m", "retryd", "topics", "create"],
            env=self.env(),
            cwd=ROOT,
            check=True,
            capture_output=True,
        )

    def start(self, *args: str) -> subprocess.Popen[bytes]:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        out = open(self.log or os.devnull, "ab")  # noqa: SIM115 - owned by the child
        return subprocess.Popen(
            [sys.executable, "-m", "retryd", "worker", *args],
            env=self.env(),
            cwd=self.root,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop(proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


class Metrics:
    """Reads the worker's multiprocess metric files, as the sidecar's /metrics would."""

    def __init__(self, state_dir: Path) -> None:
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector

        self.dir = state_dir / "metrics"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._collector = MultiProcessCollector(CollectorRegistry(), path=str(self.dir))
        self._last = 0.0

    def messages(self, topic: str, outcome: str) -> float:
        import struct

        try:
            metrics = list(self._collector.collect())
        except struct.error:  # a metric file the worker is creating right now: not yet sized
            return self._last
        total = 0.0
        for metric in metrics:
            if metric.name != "retryd_messages":
                continue
            for s in metric.samples:
                if (
                    s.name == "retryd_messages_total"
                    and s.labels.get("topic") == topic
                    and s.labels.get("outcome") == outcome
                ):
                    total += s.value
        self._last = total
        return total


def time_until(
    count: Callable[[], float],
    n: int,
    proc: subprocess.Popen[bytes],
    *,
    timeout_s: float,
    interval_s: float = 0.05,
    on_first: Callable[[], None] | None = None,
) -> float:
    """Seconds from the first counted record to the n-th (group join excluded); ``on_first``
    runs when the first is counted."""
    first: float | None = None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"retryd worker exited with {proc.returncode} before {n} records")
        value = count()
        now = time.monotonic()
        if value > 0 and first is None:
            first = now
            if on_first is not None:
                on_first()
        if value >= n:
            assert first is not None
            return max(now - first, 1e-6)
        time.sleep(interval_s)
    raise SystemExit(f"timed out: {count()} of {n} records after {timeout_s}s")


def wait_committed(
    bootstrap: str,
    group: str,
    topic: str,
    partitions: int,
    n: int,
    proc: subprocess.Popen[bytes],
    *,
    timeout_s: float,
    interval_s: float = 0.05,
) -> None:
    """Wait until ``group``'s committed offsets on ``topic`` add up to ``n`` (read as the
    sidecar reads lag: a consumer of the group that never subscribes, so never joins it;
    committed() waits for offsets of a transaction still open, read_committed)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    wanted = [TopicPartition(topic, p) for p in range(partitions)]
    deadline = time.monotonic() + timeout_s
    total = 0
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"retryd worker exited with {proc.returncode} before commit")
            total = sum(max(tp.offset, 0) for tp in c.committed(wanted, timeout=10))
            if total >= n:
                return
            time.sleep(interval_s)
    finally:
        c.close()
    raise SystemExit(f"timed out: {total} of {n} offsets committed after {timeout_s}s")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a live process has used so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    """VmHWM (peak resident set) of a live process, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"no VmHWM for pid {pid}")


# ------------------------------------------------------------------ raw baselines
ROUTED_HEADERS = 9  # retryd's header count on a first-tier copy (group included)


def raw_loop(
    bootstrap: str, topic: str, n: int, route_to: str | None, stats: dict | None = None
) -> float:
    """A bare consumer: subscribe, consume(500), store_offsets per message; with ``route_to``
    it produces every message there with retryd-sized headers (acks=all, idempotent) and
    stores the offset on delivery. Seconds from the first message to the n-th done; ``stats``
    gets ``cpu_s``, the process's CPU (all threads) over the same span."""
    from confluent_kafka import Consumer, Producer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.offset.store": False,
            "session.timeout.ms": 6000,
            "partition.assignment.strategy": "cooperative-sticky",
        }
    )
    p = (
        Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
            }
        )
        if route_to
        else None
    )
    c.subscribe([topic])
    done = consumed = 0
    start: float | None = None

    def delivered(err: Any, msg: Any) -> None:
        nonlocal done
        done += 1

    while done < n:
        if p is not None and consumed >= n:
            # every record is read: wait on the last deliveries, not in consume() (whose 1 s
            # timeout held them back: up to 1 s on a 5 s run)
            p.poll(0.01)
            continue
        batch = c.consume(500, 1.0)
        if batch and start is None:
            start = time.perf_counter()
            cpu0 = time.process_time()
        for msg in batch:
            if msg.error():
                continue
            consumed += 1
            if p is not None:
                now = str(int(time.time() * 1000)).encode()
                headers = [
                    ("retry_number", b"1"),
                    ("retry_timestamp", now),
                    ("retryd_original_topic", topic.encode()),
                    ("retryd_original_partition", str(msg.partition()).encode()),
                    ("retryd_original_offset", str(msg.offset()).encode()),
                    ("retryd_original_timestamp", now),
                    ("retryd_first_failure_timestamp", now),
                    ("retryd_error_class", b"RuntimeError"),
                    ("retryd_error_message", b"bench: first attempt fails"),
                ]

                def on_delivery(err: Any, out: Any, m: Any = msg) -> None:
                    c.store_offsets(message=m)
                    delivered(err, out)

                while True:
                    try:
                        p.produce(
                            route_to,
                            key=msg.key(),
                            value=msg.value(),
                            headers=headers,
                            on_delivery=on_delivery,
                        )
                        break
                    except BufferError:
                        p.poll(0.05)
            else:
                c.store_offsets(message=msg)
                done += 1
        if p is not None:
            p.poll(0)
    elapsed = time.perf_counter() - (start or time.perf_counter())
    if stats is not None and start is not None:
        stats["cpu_s"] = time.process_time() - cpu0
    if p is not None:
        p.flush(30)
    c.close()
    return elapsed


def run_child(*args: str) -> dict[str, Any]:
    """Run ``bench/bench_worker.py --child …`` (a fresh process: peak RSS per baseline)."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_worker.py"), "--child", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"baseline {args} failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result
