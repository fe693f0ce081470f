"""A real Apache Kafka broker (KRaft) for tests and local runs, provisioned from Maven Central.

The embedded Tansu broker (``retryd.kafka.embedded``) starts in milliseconds but is not Kafka:
replication, leader election, group coordinators and the exact error codes of the real broker
are out of its reach. This module runs the real one without Docker and without a distribution
tarball: ``provision()`` resolves the ``kafka_2.13`` jar and its runtime dependencies with
Maven (``kafka-pom.xml`` next to this file) into a cache outside the checkout, and
``ApacheKafkaBroker`` / ``ApacheKafkaCluster`` run ``kafka.Kafka`` from that classpath: one
combined broker+controller node, or three of them forming one cluster.

Every process is started in its own session with ``PR_SET_PDEATHSIG`` and stopped by PID
(SIGTERM, then SIGKILL after a deadline), like the embedded broker.

Settings (environment): ``RETRYD_KAFKA_VERSION`` (a release, ``default`` or ``oldest``),
``RETRYD_KAFKA_CACHE`` (cache root instead of ``~/.cache/retryd/kafka``),
``RETRYD_KAFKA_JAVA`` (the ``java`` to run; else ``$JAVA_HOME/bin/java``, else ``$PATH``),
``RETRYD_KAFKA_CDS=0`` (no class-data-sharing archive), ``RETRYD_MVN`` (the ``mvn`` to run).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from retryd.errors import BrokerStartError
from retryd.kafka.embedded import _die_with_parent, free_port

log = logging.getLogger(__name__)

#: The newest release on Maven Central when this was pinned (also the pom's default).
DEFAULT_VERSION = "4.4.0"
#: The oldest supported line: 3.9 is the last with ZooKeeper but runs KRaft the same way.
OLDEST_VERSION = "3.9.2"

POM = Path(__file__).with_name("kafka-pom.xml")

# Why each flag: a test broker must start fast on a 2-core machine and stay small, not
# sustain throughput. Measured on 2 cores, one 4.4.0 node: C1 only (TieredStopAtLevel=1)
# skips C2 compilations, 2.4 -> 1.7 s to ready, 2.6 -> 1.5 s of CPU, 288 -> 270 MB RSS;
# SerialGC has no GC threads to compete with three nodes for two cores (G1: +0.4 s, +19 MB).
# A small initial heap keeps an idle node's RSS low while -Xmx bounds it; ExitOnOutOfMemory
# turns a too-small heap into a visible exit instead of a limping node. Class-data sharing
# (the -Xshare family) is added per start by ``_cds_archive``.
JVM_FLAGS = (
    "-Xms32m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)

# What Kafka's own start scripts run a broker with (kafka-server-start.sh's KAFKA_HEAP_OPTS,
# kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS): full tiered compilation, G1, a 1 GiB heap.
# For measurements, where the broker must run as users run it (``jvm_flags=SERVER_JVM_FLAGS``).
SERVER_JVM_FLAGS = (
    "-Xmx1G",
    "-Xms1G",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)

_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
_MVN_TIMEOUT_S = 900.0
_FORMAT_TIMEOUT_S = 120.0

# shutdownHook=disable: the broker stops Log4j itself; with Log4j's own hook, threads that
# log during the JVM's shutdown find it gone and print "Unable to register Log4j shutdown
# hook ... Using SimpleLogger" instead of their message.
_LOG4J2 = """\
status = warn
shutdownHook = disable
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.console.ref = STDOUT
"""

_LOG4J1 = """\
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
"""


def resolve_version(version: str | None = None) -> str:
    """The release to run: ``version``, else ``$RETRYD_KAFKA_VERSION``, else the default.

    ``default`` and ``oldest`` are accepted as names. The version becomes part of a path and a
    Maven property, so anything but ``X.Y.Z`` is refused."""
    chosen = version or os.environ.get("RETRYD_KAFKA_VERSION") or DEFAULT_VERSION
    chosen = {"default": DEFAULT_VERSION, "oldest": OLDEST_VERSION}.get(chosen, chosen)
    if not _VERSION_RE.match(chosen):
        raise BrokerStartError(f"Kafka version {chosen!r} is not a release number like 4.4.0")
    return chosen


def _is_legacy(version: str) -> bool:
    """Kafka 3.x logs through the Log4j 1 API (reload4j); 4.x through Log4j 2."""
    return int(version.split(".", 1)[0]) < 4


def cache_root() -> Path:
    """Where provisioned jars live: outside any checkout, shared by every worktree and run."""
    override = os.environ.get("RETRYD_KAFKA_CACHE")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "retryd" / "kafka"


def _pom_digest() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def provision(version: str | None = None) -> Path:
    """The directory of the broker's jars for ``version``, resolving them with Maven if needed
    (``fetch_with_maven``)."""
    version = resolve_version(version)
    root = cache_root() / version
    props = {"kafka.version": version, **({"kafka.legacy": "true"} if _is_legacy(version) else {})}

    def drop_stale_archives(_new_libs: Path) -> None:
        for stale in root.glob("cds-*.jsa"):  # archives are only valid for the old jars
            stale.unlink(missing_ok=True)

    return fetch_with_maven(
        POM,
        root,
        _pom_digest(),
        props,
        name=f"Apache Kafka {version}",
        artifact=f"org.apache.kafka:kafka_2.13:{version}",
        expect="kafka_2.13-*.jar",
        finish=drop_stale_archives,
    )


def fetch_with_maven(
    pom_source: Path,
    root: Path,
    digest: str,
    properties: Mapping[str, str],
    *,
    name: str,
    artifact: str,
    expect: str,
    finish: Callable[[Path], None] | None = None,
    timeout_s: float = _MVN_TIMEOUT_S,
) -> Path:
    """``root/libs``: the runtime dependencies of ``pom_source`` (with ``properties``) copied
    there by Maven, unless a complete copy is there already.

    Quick when present: a stamp holding ``digest`` marks a complete copy, so a warm call reads
    one small file and never starts Maven (a changed digest re-provisions). Parallel callers
    (pytest-xdist workers) serialise on a lock file; the jars are copied into a temporary
    directory, which must hold ``expect`` (a glob), then ``finish`` runs on it and it is renamed
    into place, so nobody ever sees half a classpath."""
    libs = root / "libs"
    stamp = root / "provisioned"

    def done() -> bool:
        try:
            return stamp.read_text().strip() == digest and libs.is_dir()
        except OSError:
            return False

    if done():
        return libs
    mvn = os.environ.get("RETRYD_MVN") or shutil.which("mvn")
    if not mvn:
        raise BrokerStartError(
            f"Maven (mvn) is needed to fetch {name} from Maven Central: install it "
            "(apt-get install maven) or set RETRYD_MVN"
        )
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if done():  # another worker finished while we waited
            return libs
        pom = root / "pom.xml"  # Maven may write next to its pom; the package may be read-only
        shutil.copyfile(pom_source, pom)
        tmp = Path(tempfile.mkdtemp(prefix="libs.tmp-", dir=root))
        cmd = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={tmp}",
            *(f"-D{key}={value}" for key, value in properties.items()),
        ]
        log.info("provisioning %s into %s", name, libs)
        started = time.monotonic()
        try:
            result = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout_s, cwd=root
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise BrokerStartError(f"cannot run Maven ({mvn}): {exc}") from exc
        if result.returncode != 0 or not any(tmp.glob(expect)):
            shutil.rmtree(tmp, ignore_errors=True)
            output = _tail_text(result.stdout + result.stderr)
            raise BrokerStartError(
                f"Maven could not resolve {artifact} (exit {result.returncode}):\n{output}"
            )
        try:
            if finish is not None:
                finish(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(libs, ignore_errors=True)
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the jars from other users of the cache
        os.replace(tmp, libs)
        stamp_tmp = root / "provisioned.tmp"
        stamp_tmp.write_text(digest + "\n")
        os.replace(stamp_tmp, stamp)
        log.info("provisioned %s in %.1fs", name, time.monotonic() - started)
    return libs


def java_binary() -> Path:
    """The ``java`` to run the broker with: ``$RETRYD_KAFKA_JAVA``, ``$JAVA_HOME``, ``$PATH``.

    Kafka 4.x brokers need Java 17 or newer."""
    override = os.environ.get("RETRYD_KAFKA_JAVA")
    if override:
        if not os.access(override, os.X_OK):
            raise BrokerStartError(f"RETRYD_KAFKA_JAVA={override} is not an executable java")
        return Path(override)
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return Path(home) / "bin" / "java"
    found = shutil.which("java")
    if found:
        return Path(found)
    raise BrokerStartError(
        "Java is needed to run Apache Kafka (17 or newer): install a JDK "
        "(apt-get install openjdk-17-jre-headless) or set RETRYD_KAFKA_JAVA / JAVA_HOME"
    )


def classpath(libs: Path) -> str:
    """The jars in a fixed order: a class-data-sharing archive is only used by a JVM whose
    class path matches the one it was dumped with, and ``libs/*`` expands in directory order."""
    jars = sorted(libs.glob("*.jar"))
    if not jars:
        raise BrokerStartError(f"no jars in {libs}: remove {libs.parent} and provision again")
    return os.pathsep.join(str(j) for j in jars)


def new_cluster_id() -> str:
    """A KRaft cluster id: a random UUID in URL-safe base64 without padding, like
    ``kafka-storage random-uuid``; Kafka re-draws ids starting with ``-`` since a command line
    would read them as an option, and so does this."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _tail_text(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


_LOG_PROBLEM = re.compile(r"^\[[^]]+\] (ERROR|FATAL) |^\S*(Exception|Error)\b")


def _log_excerpt(path: Path, tail: int = 25) -> str:
    """What a start-up error needs from the broker's log: its first ERROR/FATAL lines (a
    failing broker logs the cause, then a long shutdown that pushes it out of any tail) and
    the last ``tail`` lines."""
    try:
        text = path.read_bytes()[-4_000_000:].decode(errors="replace")
    except OSError:
        return f"(no log at {path})"
    lines = text.rstrip().splitlines()
    problems = [line[:600] for line in lines if _LOG_PROBLEM.match(line)][:6]
    parts = [f"log {path}"]
    if problems:
        parts += ["first errors:", *problems]
    parts += [f"last {tail} lines:", *lines[-tail:]]
    return "\n".join(parts)


# the JVM otherwise logs a "Skipping <class>: ..." line per class it cannot archive
_CDS_QUIET = ("-Xlog:cds=off", "-Xlog:cds+dynamic=off")


def _cds_archive(java: Path, libs: Path) -> Path | None:
    """The class-data-sharing archive for this JVM build and this classpath (None when
    ``RETRYD_KAFKA_CDS=0``): a dynamic archive of the classes a broker loads cuts a node's
    start-up by about a second on 2 cores. It is written once, when a broker first exits
    cleanly; a JVM that finds it stale (other JDK build, other jars) ignores it and starts the
    slow way, which is why the name carries the JVM's identity."""
    if os.environ.get("RETRYD_KAFKA_CDS", "1").lower() in ("0", "false", "no", ""):
        return None
    try:
        real = java.resolve()
        st = real.stat()
    except OSError:
        return None
    key = hashlib.sha256(f"{real}:{st.st_mtime_ns}:{st.st_size}".encode()).hexdigest()[:12]
    return libs.parent / f"cds-{key}.jsa"


class ApacheKafkaBroker:
    """One Apache Kafka node in KRaft combined mode (broker and controller in one JVM) on free
    loopback ports; use as a context manager. The interface mirrors ``EmbeddedBroker``.

    Alone it is a one-node cluster with replication factors 1 and its own temporary directory
    (removed by ``stop()``, unless a start failed: its error names the log inside).
    ``ApacheKafkaCluster`` builds three with shared ``voters`` and a ``cluster_id``; those keep
    their data across ``stop()``/``kill()`` so ``restart()`` brings back the same node.
    ``overrides`` are extra ``server.properties`` entries. ``advertised`` (``host:port``), as
    for ``EmbeddedBroker``, is the address named in metadata: a TCP proxy in front of the
    listener then carries every client connection (in a cluster, replication traffic too).
    ``jvm_flags`` replace the JVM's start-fast defaults (``JVM_FLAGS``); the benchmarks pass
    ``SERVER_JVM_FLAGS``, what Kafka's start scripts use.

    Start the process from the thread that will outlive it: ``PR_SET_PDEATHSIG`` fires when
    the *thread* that forked the child exits, so a broker started in a worker thread dies with
    that thread.
    """

    def __init__(
        self,
        port: int | None = None,
        log_file: Path | None = None,
        *,
        version: str | None = None,
        work_dir: Path | None = None,
        node_id: int = 1,
        controller_port: int | None = None,
        cluster_id: str | None = None,
        voters: str | None = None,
        replication_factor: int = 1,
        min_insync_replicas: int = 1,
        overrides: Mapping[str, str] | None = None,
        advertised: str | None = None,
        jvm_flags: Sequence[str] = JVM_FLAGS,
    ) -> None:
        if advertised is not None:
            host, sep, advertised_port = advertised.rpartition(":")
            if not (host and sep and advertised_port.isdigit()) or "/" in host:
                raise ValueError(f"advertised address {advertised!r} is not host:port")
        self.advertised = advertised
        self.version = resolve_version(version)
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        self.node_id = node_id
        self.cluster_id = cluster_id or new_cluster_id()
        self.voters = voters or f"{node_id}@127.0.0.1:{self.controller_port}"
        self.replication_factor = replication_factor
        self.min_insync_replicas = min_insync_replicas
        self.overrides = dict(overrides or {})
        self.jvm_flags = tuple(jvm_flags)
        self._owns_dir = work_dir is None
        self._keep_dir = False
        self._work_dir = work_dir
        self._log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None
        self._cds_tmp: Path | None = None
        self._cds_final: Path | None = None

    # -- addresses and paths ------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def advertised_bootstrap(self) -> str:
        """Where clients end up connecting: the advertised address, else the listener."""
        return self.advertised or self.bootstrap

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def work_dir(self) -> Path:
        if self._work_dir is None:
            self._work_dir = Path(tempfile.mkdtemp(prefix=f"retryd-kafka-{self.node_id}-"))
        return self._work_dir

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    @property
    def log_file(self) -> Path:
        return self._log_file or self.work_dir / "server.log"

    # -- configuration ------------------------------------------------------------------
    def properties(self) -> dict[str, str]:
        """``server.properties``: a static controller quorum (``controller.quorum.voters``)
        rather than the dynamic one, because it formats and starts the same way on 3.9 and
        4.x and needs no ``--standalone``/``--initial-controllers`` bookkeeping."""
        rf = str(self.replication_factor)
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters,
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://{self.advertised_bootstrap}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "default.replication.factor": rf,
            "min.insync.replicas": str(self.min_insync_replicas),
            "offsets.topic.replication.factor": rf,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": str(self.min_insync_replicas),
            # tests join fresh groups all the time: no 3 s wait for more members
            "group.initial.rebalance.delay.ms": "0",
            # retryd creates its topics explicitly and its tests check that nothing else does
            "auto.create.topics.enable": "false",
        }
        if not _is_legacy(self.version):  # share groups (KIP-932) exist from 4.0
            props["share.coordinator.state.topic.replication.factor"] = rf
            props["share.coordinator.state.topic.min.isr"] = str(self.min_insync_replicas)
        props.update(self.overrides)
        return props

    def _write_config(self) -> tuple[Path, list[str]]:
        """Write ``server.properties`` and the logging config; return the config path and the
        JVM's logging flags (Log4j 2 for 4.x, reload4j for 3.x; both to stdout)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config = self.work_dir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        if _is_legacy(self.version):
            log_config = self.work_dir / "log4j.properties"
            log_config.write_text(_LOG4J1)
            return config, [f"-Dlog4j.configuration=file:{log_config}"]
        log_config = self.work_dir / "log4j2.properties"
        log_config.write_text(_LOG4J2)
        return config, [f"-Dlog4j2.configurationFile={log_config}"]

    def _jvm_prefix(self, java: Path, libs: Path, log_flags: list[str]) -> list[str]:
        return [str(java), *self.jvm_flags, *log_flags, "-cp", classpath(libs)]

    def _cds_flags(self, java: Path, libs: Path) -> list[str]:
        """Use the archive if there is one; otherwise have this JVM write one when it exits
        (to a private name, renamed into place only after a clean exit, so parallel writers
        and a SIGKILL mid-dump never leave a torn archive behind)."""
        self._cds_tmp = self._cds_final = None
        archive = _cds_archive(java, libs)
        if archive is None:
            return []
        if archive.exists():
            return [f"-XX:SharedArchiveFile={archive}", *_CDS_QUIET]
        self._cds_final = archive
        self._cds_tmp = archive.with_name(f"{archive.stem}.{uuid.uuid4().hex[:12]}.tmp")
        return [f"-XX:ArchiveClassesAtExit={self._cds_tmp}", *_CDS_QUIET]

    @staticmethod
    def _cds_read_flags(java: Path, libs: Path) -> list[str]:
        """The archive, if any, for a short-lived tool JVM (formatting): it shares the
        broker's classes but never writes an archive of its own."""
        archive = _cds_archive(java, libs)
        if archive is None or not archive.exists():
            return []
        return [f"-XX:SharedArchiveFile={archive}", *_CDS_QUIET]

    def _finish_cds(self, clean_exit: bool) -> None:
        tmp, final, self._cds_tmp, self._cds_final = self._cds_tmp, self._cds_final, None, None
        if tmp is None or final is None:
            return
        if clean_exit and tmp.exists() and tmp.stat().st_size > 0:
            os.replace(tmp, final)
        else:
            tmp.unlink(missing_ok=True)

    # -- start ----------------------------------------------------------------------------
    def _formatted(self) -> bool:
        return (self.data_dir / "meta.properties").exists()

    def _launch_format(self, java: Path, libs: Path) -> subprocess.Popen[bytes] | None:
        """Format the log directory with the cluster id (``kafka-storage.sh format``; the
        class is ``kafka.tools.StorageTool`` in 3.9 through 4.4). Returns the running tool, or
        None when the directory is already formatted (a restart)."""
        config, log_flags = self._write_config()
        if self._formatted():
            return None
        cmd = [
            *self._jvm_prefix(java, libs, log_flags),
            *self._cds_read_flags(java, libs),
            "kafka.tools.StorageTool",
            "format",
            "-t",
            self.cluster_id,
            "-c",
            str(config),
        ]
        return self._popen(cmd, "format storage")

    def _finish_format(self, proc: subprocess.Popen[bytes] | None) -> None:
        if proc is None:
            return
        try:
            proc.wait(_FORMAT_TIMEOUT_S)
        finally:  # a timeout, or an interrupt while waiting: the tool goes too
            _reap(proc)
        if proc.returncode != 0 or not self._formatted():
            raise BrokerStartError(
                f"formatting Kafka storage for node {self.node_id} failed "
                f"(exit {proc.returncode}); {_log_excerpt(self.log_file)}"
            )

    def _popen(self, cmd: list[str], what: str) -> subprocess.Popen[bytes]:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as out:
            try:
                return subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: signals reach only it
                    preexec_fn=_die_with_parent,  # only calls prctl: safe before exec
                )
            except OSError as exc:
                raise BrokerStartError(f"cannot {what} with {cmd[0]}: {exc}") from exc

    def _launch(self, java: Path, libs: Path) -> None:
        _, log_flags = self._write_config()
        cmd = [
            *self._jvm_prefix(java, libs, log_flags),
            *self._cds_flags(java, libs),
            "kafka.Kafka",
            str(self.work_dir / "server.properties"),
        ]
        self.process = self._popen(cmd, "start Apache Kafka")
        log.info("apache kafka %s node %s pid=%s", self.version, self.node_id, self.pid)

    def _ready(self) -> bool:
        """A real request answered: this node serves metadata naming itself as a live broker.
        A node's listener accepts connections before it has caught up with the metadata log
        and been unfenced; metadata only lists unfenced brokers, so this is the moment it can
        lead partitions and take produce requests."""
        from confluent_kafka.admin import AdminClient

        try:
            md = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0}).list_topics(
                timeout=2
            )
        except Exception:
            return False
        return self.node_id in md.brokers

    def _check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            status = self.process.returncode
            self.process = None
            self._finish_cds(clean_exit=False)
            raise BrokerStartError(
                f"Apache Kafka node {self.node_id} exited with status {status} during "
                f"start-up; {_log_excerpt(self.log_file)}"
            )

    def _wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._check_alive()
            if self._ready():
                log.info("apache kafka node %s ready on %s", self.node_id, self.bootstrap)
                return
            time.sleep(0.1)  # start-up probe, not part of any poll loop
        raise BrokerStartError(
            f"Apache Kafka node {self.node_id} did not become ready on {self.bootstrap}; "
            f"{_log_excerpt(self.log_file)}"
        )

    def start(self, timeout_s: float = 60.0) -> ApacheKafkaBroker:
        """Provision, format (first start only), launch and wait until the node serves
        requests; on failure the process is stopped and the error carries the log's tail."""
        if self.process is not None:
            return self
        libs = provision(self.version)
        java = java_binary()
        try:
            self._finish_format(self._launch_format(java, libs))
            self._launch(java, libs)
            self._wait_ready(time.monotonic() + timeout_s)
        except BaseException:
            self._halt()
            self._keep_dir = True  # the error names its log: stop() leaves it to be read
            raise
        return self

    # -- stop and faults ------------------------------------------------------------------
    def _halt(self, timeout_s: float = 20.0) -> None:
        """Stop the process, keeping its data: SIGTERM (a controlled shutdown), SIGKILL if it
        is still there after ``timeout_s``. SIGCONT follows SIGTERM because a paused JVM
        would otherwise never act on it."""
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            _signal_group(proc.pid, signal.SIGCONT)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        # a JVM ending on SIGTERM exits 143 after running its shutdown (and CDS dump)
        self._finish_cds(clean_exit=proc.returncode in (0, 143))

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the node; a broker that made its own temporary directory also removes it."""
        self._halt(timeout_s)
        if self._keep_dir and self._work_dir is not None:
            log.warning("kept %s: Apache Kafka failed to start there", self._work_dir)
        elif self._owns_dir and self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
            self._work_dir = None

    def kill(self) -> None:
        """SIGKILL: a crash, no controlled shutdown; the data stays for ``restart()``."""
        proc, self.process = self.process, None
        if proc is not None:
            _reap(proc)
            self._finish_cds(clean_exit=False)

    def pause(self) -> None:
        """SIGSTOP: the node stops answering without closing a connection (a GC pause, a
        frozen VM); its session with the controller expires and it gets fenced."""
        if self.process is not None:
            _signal_group(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.process is not None:
            _signal_group(self.process.pid, signal.SIGCONT)

    def restart(self, timeout_s: float = 60.0) -> ApacheKafkaBroker:
        """Stop (if running) and start again with the same id, ports and data."""
        self._halt()
        return self.start(timeout_s)

    def __enter__(self) -> ApacheKafkaBroker:
        return self.start() if self.process is None else self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _reap(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL ``proc`` by PID if it still runs, and wait for it."""
    if proc is None:
        return
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def _distinct_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


class ApacheKafkaCluster:
    """Three (``size``) Apache Kafka nodes on loopback forming one KRaft cluster: every node
    is a broker and one of the controller voters, so losing one keeps both the metadata quorum
    and ``acks=all`` writes (replication factor 3, ``min.insync.replicas=2``) working.

    ``nodes`` are ``ApacheKafkaBroker`` handles (``stop``, ``kill``, ``pause``, ``resume``,
    ``restart``); ``node(id)`` finds one by node id. ``stop()`` ends every process and
    removes the cluster's directory if it made it (and it started).
    """

    def __init__(
        self,
        size: int = 3,
        *,
        version: str | None = None,
        base_dir: Path | None = None,
        overrides: Mapping[str, str] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        self.version = resolve_version(version)
        self.cluster_id = new_cluster_id()
        self._owns_dir = base_dir is None
        self._keep_dir = False
        self.base_dir = base_dir or Path(tempfile.mkdtemp(prefix="retryd-kafka-cluster-"))
        ports = _distinct_ports(2 * size)
        voters = ",".join(f"{i + 1}@127.0.0.1:{ports[2 * i + 1]}" for i in range(size))
        replication = min(3, size)
        self.nodes = [
            ApacheKafkaBroker(
                ports[2 * i],
                version=self.version,
                work_dir=self.base_dir / f"node-{i + 1}",
                node_id=i + 1,
                controller_port=ports[2 * i + 1],
                cluster_id=self.cluster_id,
                voters=voters,
                replication_factor=replication,
                min_insync_replicas=max(1, replication - 1),
                overrides=overrides,
            )
            for i in range(size)
        ]

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    def node(self, node_id: int) -> ApacheKafkaBroker:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(f"no node {node_id} in this cluster")

    def __iter__(self) -> Iterator[ApacheKafkaBroker]:
        return iter(self.nodes)

    def start(self, timeout_s: float = 120.0) -> ApacheKafkaCluster:
        """Format and launch every node at once (no node is ready before a quorum of voters
        runs), then wait for each to serve metadata naming itself live."""
        libs = provision(self.version)
        java = java_binary()
        formats: list[subprocess.Popen[bytes] | None] = []
        try:
            for n in self.nodes:
                formats.append(n._launch_format(java, libs))
            for n, proc in zip(self.nodes, formats, strict=True):
                n._finish_format(proc)
            for n in self.nodes:
                n._launch(java, libs)
            deadline = time.monotonic() + timeout_s
            for n in self.nodes:
                n._wait_ready(deadline)
        except BaseException:
            for proc in formats:
                _reap(proc)
            self._keep_dir = True  # the error names a node's log: stop() leaves it
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM every node at once, SIGKILL what is left at the deadline. One at a time,
        the last nodes would wait out their controlled shutdown against a lost quorum.

        Even at once it takes ~5.5 s: the Raft leader's graceful shutdown waits for another
        leader to be elected, which never happens when every voter is leaving, and gives up
        after a fixed 5 s ("Graceful shutdown timed out after 5000ms"). Seen once in ~15
        runs: a node still there at 20 s; hence the deadline."""
        running = [n.process for n in self.nodes if n.process is not None]
        for proc in running:
            if proc.poll() is None:
                _signal_group(proc.pid, signal.SIGTERM)
                _signal_group(proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + timeout_s
        for proc in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
        for n in self.nodes:
            n._halt(timeout_s=1.0)  # reaps, SIGKILLs stragglers, settles the CDS archive
        if self._keep_dir:
            log.warning("kept %s: the cluster failed to start there", self.base_dir)
        elif self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _admin(self):  # type: ignore[no-untyped-def]
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})

    def leader_of(self, topic: str, partition: int = 0, timeout_s: float = 10.0) -> int:
        """The node id leading ``topic``/``partition`` as the cluster reports it now (-1 while
        it has no leader). After a kill, the dead node stays leader until the controller
        fences it (``broker.session.timeout.ms``, 9 s by default)."""
        from confluent_kafka import TopicCollection

        admin = self._admin()  # referenced until the result is in: a collected client
        futures = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout_s)
        description = futures[topic].result(timeout_s)  # fails its futures with _DESTROY
        for p in description.partitions:
            if p.id == partition:
                return -1 if p.leader is None else int(p.leader.id)
        raise KeyError(f"{topic} has no partition {partition}")

    def coordinator_of(self, group: str, timeout_s: float = 10.0) -> int:
        """The node id coordinating consumer group ``group`` (the leader of its
        ``__consumer_offsets`` partition)."""
        admin = self._admin()
        futures = admin.describe_consumer_groups([group], request_timeout=timeout_s)
        description = futures[group].result(timeout_s)
        if description.coordinator is None:
            raise KeyError(f"no coordinator reported for group {group}")
        return int(description.coordinator.id)

    def __enter__(self) -> ApacheKafkaCluster:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
