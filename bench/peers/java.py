"""The Java peers of the peer benchmark (Spring Kafka, Confluent Parallel Consumer): built
with Maven into one shaded jar each, run as a subprocess that measures itself and writes a
result JSON.

The peers time themselves (first to N-th handled record, process CPU of all JVM threads) so
that JVM start-up, group join and Maven are never in the figures; this module only builds,
starts, waits and reads. Every process it starts is stopped by its PID on any error or
time-out.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from retryd.errors import RetrydError

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
COMMON = HERE / "java-common"
# name -> the jar its pom builds (finalName)
JARS = {"spring": "spring-peer.jar", "parallel-consumer": "parallel-consumer-peer.jar"}
SHAPES = ("success", "keyed", "retry")
# Beyond the peer's own --timeout-s: JVM start, group join and writing the result.
GRACE_S = 60.0
BUILD_TIMEOUT_S = 900.0
REFUSED = 2  # the peer's exit status for a shape it does not run (or a bad command line)


class PeerError(RetrydError):
    """A Java peer could not be built or did not finish its run."""


class PeerBuildError(PeerError):
    """Maven failed: the message names the failing step (plugin goal) and its error lines."""


class PeerRefused(PeerError):
    """The peer does not run this shape (exit status 2): e.g. Parallel Consumer and retry."""


def tools_missing() -> str | None:
    """Why the peers cannot be built or run here (``mvn`` or ``java`` not on PATH), or None."""
    missing = [tool for tool in ("mvn", "java") if shutil.which(tool) is None]
    return f"{' and '.join(missing)} not on PATH" if missing else None


def jar_path(name: str) -> Path:
    if name not in JARS:
        raise PeerError(f"unknown Java peer {name!r}: expected one of {sorted(JARS)}")
    return HERE / name / "target" / JARS[name]


def _sources(name: str) -> list[Path]:
    """Everything a jar is built from: its pom, its sources and the shared sources."""
    files = [HERE / name / "pom.xml"]
    for root in (HERE / name / "src", COMMON / "src"):
        files.extend(p for p in root.rglob("*") if p.is_file())
    return files


def _stale(name: str) -> bool:
    jar = jar_path(name)
    if not jar.exists():
        return True
    built = jar.stat().st_mtime
    return any(p.stat().st_mtime > built for p in _sources(name))


def build(name: str) -> Path:
    """The peer's runnable jar, built with ``mvn -q package`` when missing or older than any
    of its sources (the jar stays in ``bench/peers/<name>/target/`` as the cache). One build
    per peer at a time across processes (a lock file beside its pom): two test workers asking
    at once must not run two Mavens in one ``target``; the second finds the jar fresh."""
    jar = jar_path(name)
    if not _stale(name):
        return jar
    with open(HERE / name / ".build.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _build_locked(name, jar)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build_locked(name: str, jar: Path) -> Path:
    if not _stale(name):
        return jar  # built by whoever held the lock before us
    if shutil.which("mvn") is None:
        raise PeerBuildError(f"cannot build the {name} peer: mvn not on PATH")
    started = time.monotonic()
    log.info("building the %s peer with Maven", name)
    try:
        done = subprocess.run(
            ["mvn", "-q", "-B", "package"],
            cwd=HERE / name,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:  # run() kills Maven before it raises this
        raise PeerBuildError(f"building the {name} peer: mvn package timed out") from exc
    if done.returncode != 0 or not jar.exists():
        raise PeerBuildError(
            f"building the {name} peer: {maven_failure(done.stdout + done.stderr)}"
        )
    log.info("built %s in %.1f s", jar, time.monotonic() - started)
    return jar


def maven_failure(output: str) -> str:
    """The failing Maven step and its first error lines, from Maven's output."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", output)
    errors = [line for line in plain.splitlines() if line.startswith("[ERROR]")]
    step = next(
        (m.group(1) for line in errors if (m := re.search(r"Failed to execute goal (\S+)", line))),
        None,
    )
    detail = "; ".join(
        e.removeprefix("[ERROR]").strip() for e in errors[:6] if e.strip() != "[ERROR]"
    )
    if step:
        return f"Maven step {step} failed: {detail}"
    return f"mvn package failed: {detail or plain.strip()[-2000:] or 'no output'}"


def command(
    jar: Path,
    bootstrap: str,
    topic: str,
    group: str,
    count: int,
    shape: str,
    out: Path,
    *,
    concurrency: int | None = None,
    handler_ms_max: float | None = None,
    retry_delay_ms: int | None = None,
    warm_from: int | None = None,
    timeout_s: int = 600,
    jvm_props: dict[str, str] | None = None,
    java: str = "java",
) -> list[str]:
    """The peer's command line (the CLI contract both jars share)."""
    if shape not in SHAPES:
        raise PeerError(f"unknown shape {shape!r}: expected one of {SHAPES}")
    cmd = [java, *(f"-D{k}={v}" for k, v in (jvm_props or {}).items()), "-jar", str(jar)]
    cmd += ["--bootstrap", bootstrap, "--topic", topic, "--group", group]
    cmd += ["--count", str(count), "--shape", shape, "--out", str(out)]
    cmd += ["--timeout-s", str(int(timeout_s))]
    optional = {
        "--concurrency": concurrency,
        "--handler-ms-max": handler_ms_max,
        "--retry-delay-ms": retry_delay_ms,
        "--warm-from": warm_from,
    }
    for flag, value in optional.items():
        if value is not None:
            cmd += [flag, str(value)]
    return cmd


def run(
    name: str,
    bootstrap: str,
    topic: str,
    group: str,
    count: int,
    shape: str,
    **options: Any,
) -> dict[str, Any]:
    """Runs the peer until it handled ``count`` records and returns its result JSON.

    ``options``: ``concurrency``, ``handler_ms_max``, ``retry_delay_ms``, ``warm_from``,
    ``timeout_s`` (the peer's own, default 600), ``jvm_props`` (``-D`` settings, e.g.
    ``{"peer.consumer.fetch.max.wait.ms": "20"}`` for the Spring peer's client overrides).
    Raises ``PeerRefused`` for a shape the peer does not run, ``PeerError`` otherwise.
    """
    jar = build(name)
    timeout_s = float(options.get("timeout_s", 600))
    with tempfile.TemporaryDirectory(prefix=f"peer-{name}-") as tmp:
        out = Path(tmp) / "result.json"
        stdout, stderr = Path(tmp) / "stdout", Path(tmp) / "stderr"
        cmd = command(jar, bootstrap, topic, group, count, shape, out, **options)
        log.info("running %s", " ".join(cmd))
        with stdout.open("wb") as so, stderr.open("wb") as se:
            proc = subprocess.Popen(cmd, stdout=so, stderr=se, stdin=subprocess.DEVNULL)
            try:
                status = proc.wait(timeout=timeout_s + GRACE_S)
            except subprocess.TimeoutExpired:
                _stop(proc)
                raise PeerError(
                    f"{name} peer did not finish within {timeout_s + GRACE_S:.0f} s "
                    f"(stopped): {_tail(stderr)}"
                ) from None
            except BaseException:  # interrupted (Ctrl-C, SIGTERM as KeyboardInterrupt)
                _stop(proc)
                raise
        if status == REFUSED:
            raise PeerRefused(f"{name} peer refused: {_tail(stderr)}")
        if status != 0:
            raise PeerError(f"{name} peer exited with {status}: {_tail(stderr)}")
        if not out.exists():
            raise PeerError(f"{name} peer exited 0 without writing {out.name}: {_tail(stderr)}")
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stops the peer by its PID: SIGTERM, then SIGKILL if it is still there after 10 s."""
    if proc.poll() is not None:
        return
    log.warning("stopping peer process %d", proc.pid)
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def _tail(path: Path, lines: int = 8) -> str:
    if not path.exists():
        return "no output"
    text = path.read_text(errors="replace").strip().splitlines()
    return " | ".join(text[-lines:]) or "no output"


def java_version() -> str:
    """The JVM the peers run on, as ``java -version`` names it."""
    done = subprocess.run(
        ["java", "-version"], capture_output=True, text=True, check=False, env=os.environ
    )
    first = (done.stderr or done.stdout).splitlines()
    return first[0] if first else "unknown"
