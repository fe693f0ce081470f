"""Command-line tools the suite builds for itself: Helm, from the Go module proxy.

No Helm package is needed on the machine: ``go install helm.sh/helm/v3/cmd/helm@<version>``
builds the pinned release from source (the module proxy checks every module against the Go
checksum database). The binary is cached under ``~/.cache/retryd/tools/helm-<version>/helm``,
so only the first run pays for the build (a few minutes on two cores; later runs take
nothing). A file lock makes parallel pytest workers build it once: the others wait, then use
it. Only a missing Go toolchain skips the tests that need Helm; a failed build fails them,
with Go's output.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

logger = logging.getLogger(__name__)

HELM_VERSION = "v3.22.0"
HELM_MODULE = "helm.sh/helm/v3/cmd/helm"
# What Helm's Makefile stamps into a release build; `go install` alone leaves "v3.22" as the
# version and Kubernetes v1.20 as the default cluster version of `helm template` and `lint`.
# The Kubernetes minor is that of the k8s.io/client-go module v3.22.0 requires (v0.37).
HELM_LDFLAGS = " ".join(
    [
        "-s",
        "-w",
        f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",
        "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1",
        "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=37",
        "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1",
        "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37",
    ]
)
CACHE = Path(os.environ.get("RETRYD_TOOLS_CACHE", Path.home() / ".cache" / "retryd" / "tools"))
BUILD_TIMEOUT_S = 1200  # a cold build on a slow, shared machine; it normally takes minutes
GO_CANDIDATES = ("/usr/local/go/bin/go", "/usr/lib/go/bin/go")


def go_binary() -> str | None:
    """``go`` on PATH, else where the official tarball or Debian put it."""
    found = shutil.which("go")
    if found:
        return found
    return next((c for c in GO_CANDIDATES if os.access(c, os.X_OK)), None)


def _works(path: Path) -> bool:
    try:
        out = subprocess.run(
            [str(path), "version", "--short"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError:
        return False
    return out.returncode == 0 and out.stdout.startswith(HELM_VERSION)


def helm_path() -> Path | None:
    """The pinned Helm, built on first use; None when there is no Go toolchain to build it."""
    target = CACHE / f"helm-{HELM_VERSION}" / "helm"
    if target.exists() and _works(target):
        return target
    go = go_binary()
    if go is None:
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (target.exists() and _works(target)):  # else another process built it meanwhile
            _build(go, target)
    return target


def helm() -> str:
    """For tests: the pinned Helm's path; skips the test only when Go is missing."""
    path = helm_path()
    if path is None:
        pytest.skip(
            f"Helm {HELM_VERSION} is built from the Go module proxy and no Go toolchain was "
            f"found (PATH, {', '.join(GO_CANDIDATES)}): install Go >= 1.24 to run the chart tests"
        )
    return str(path)


def _build(go: str, target: Path) -> None:
    """``go install`` into a scratch GOBIN, then an atomic rename: a killed build never leaves
    a half-written binary at the cached path."""
    for stale in target.parent.glob("build-*"):  # left by a build killed midway
        shutil.rmtree(stale, ignore_errors=True)
    started = time.monotonic()
    logger.warning("building Helm %s with %s (first run only)", HELM_VERSION, go)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix="build-") as scratch:
        env = {**os.environ, "GOBIN": scratch, "CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false"}
        out = subprocess.run(
            [go, "install", "-trimpath", "-ldflags", HELM_LDFLAGS, f"{HELM_MODULE}@{HELM_VERSION}"],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            env=env,
            cwd=scratch,
            check=False,
        )
        built = Path(scratch) / "helm"
        if out.returncode != 0 or not built.exists():
            raise RuntimeError(
                f"go install {HELM_MODULE}@{HELM_VERSION} failed ({out.returncode}):\n"
                f"{out.stderr[-4000:]}"
            )
        os.replace(built, target)
    logger.warning("built Helm %s in %.0f s: %s", HELM_VERSION, time.monotonic() - started, target)


if __name__ == "__main__":  # scripts/test: build before the tests start, so no test waits
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    started = time.monotonic()
    path = helm_path()
    if path is None:
        print(f"Helm {HELM_VERSION}: no Go toolchain, the chart tests will be skipped")
    else:
        print(f"Helm {HELM_VERSION}: {path} ({time.monotonic() - started:.0f} s)")
