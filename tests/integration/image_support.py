"""The suite's own container base and the buildah calls that build and run retryd's image.

The Dockerfile's ``FROM`` is ``python:3.11-slim`` pinned by digest; a test machine has no
registry to pull it from, and a digest cannot be given to a locally made image. So the suite
makes a stand-in with debootstrap (Debian bookworm, minbase, Debian's python3.11) laid out like
the official image (``/usr/local/bin/python``, ``python3``, ``pip``; ``PATH``, ``LANG``; no
PEP 668 marker, as there), imports it into a private buildah store, and builds the unchanged
Dockerfile on it through its ``PYTHON_IMAGE`` build argument. No Docker engine is needed:
buildah runs each step with ``--isolation chroot`` on vfs storage, which works as plain root
without overlayfs, user namespaces or a container runtime.

The base is cached under ``~/.cache/retryd/image/`` (``RETRYD_IMAGE_CACHE``) by a key of its
inputs (suite, mirror, packages, this module's layout version), made once under a file lock so
parallel test workers wait for the first one instead of running debootstrap twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

CACHE = Path(os.environ.get("RETRYD_IMAGE_CACHE", Path.home() / ".cache" / "retryd" / "image"))
SUITE = "bookworm"
MIRROR = os.environ.get("RETRYD_DEBIAN_MIRROR", "http://deb.debian.org/debian")
# What python:3.11-slim holds beyond Debian's minbase: the interpreter with venv/ensurepip, CA
# certificates, /etc/services and /etc/protocols, time zones.
PACKAGES = (
    "python3.11",
    "python3.11-venv",
    "python3-distutils",  # provides python3.11-distutils, which debootstrap cannot resolve
    "ca-certificates",
    "netbase",
    "tzdata",
)
LAYOUT_VERSION = 1  # bump when _lay_out changes what the base holds
# The official image's environment (its PATH puts /usr/local/bin first, where python lives).
BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}
TOOLS = ("buildah", "debootstrap")
BASE_REPO = "localhost/retryd-test-python"
TEST_REPO = "localhost/retryd:test-"  # the images the tests build, one per run
STALE_S = 3 * 3600
PIP_ARGS = ("--no-index", "--no-cache-dir", "--disable-pip-version-check")
HOST_CA = "/etc/ssl/certs/ca-certificates.crt"  # Debian's bundle, where Debian's pip reads it


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def base_key() -> str:
    inputs = {"suite": SUITE, "mirror": MIRROR, "packages": PACKAGES, "layout": LAYOUT_VERSION}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def base_name() -> str:
    return f"{BASE_REPO}:3.11-{base_key()}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(args: list[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    if done.returncode != 0:
        output = (done.stdout + done.stderr)[-3000:]
        raise RuntimeError(f"{' '.join(args[:4])} ... exited {done.returncode}: {output}")
    return done


def _lay_out(rootfs: Path) -> None:
    """Make a debootstrapped tree look like python:3.11-slim to a Dockerfile: ``python``,
    ``python3`` and ``pip`` on ``/usr/local/bin``, pip importable system-wide (the official
    image's interpreter is not distribution-managed, so no EXTERNALLY-MANAGED marker), and
    no package caches or documentation."""
    local_bin = rootfs / "usr/local/bin"
    local_bin.mkdir(parents=True, exist_ok=True)
    for name in ("python", "python3", "python3.11"):
        (local_bin / name).symlink_to("/usr/bin/python3.11")
    (local_bin / "pydoc").symlink_to("/usr/bin/pydoc3.11")
    for marker in (rootfs / "usr/lib").glob("python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    # pip installed the way the official image has it (/usr/local/bin/pip, pip3, pip3.11),
    # from Debian's own wheel of it (python3-pip-whl, which python3.11-venv brings); Debian's
    # ensurepip refuses the system interpreter, so pip installs itself, run from its wheel.
    wheel = next((rootfs / "usr/share/python-wheels").glob("pip-*.whl"))
    inside = f"/usr/share/python-wheels/{wheel.name}"
    _run(
        [
            "chroot",
            str(rootfs),
            "/usr/bin/python3.11",
            f"{inside}/pip",
            "install",
            *PIP_ARGS,
            inside,
        ],
        timeout=300,
        env={"PATH": BASE_ENV["PATH"], "LANG": "C.UTF-8"},
    )
    for pattern in (
        "var/lib/apt/lists/*",
        "var/cache/apt/*",
        "var/cache/debconf/*-old",
        "var/log/*",
        "usr/share/doc/*",
        "usr/share/man/*",
        "usr/share/info/*",
        "tmp/*",
    ):
        for path in rootfs.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    for cache in rootfs.glob("usr/**/__pycache__"):
        shutil.rmtree(cache, ignore_errors=True)


def base_tarball() -> Path:
    """The stand-in base as a tar of its root filesystem: cached, else made (the cold cost:
    debootstrap downloads and unpacks about 100 packages)."""
    tarball = CACHE / f"base-{base_key()}.tar"
    with _locked(CACHE / "base.lock"):
        if tarball.exists():
            return tarball
        work = Path(tempfile.mkdtemp(prefix="base-", dir=CACHE))
        try:
            rootfs = work / "rootfs"
            log.info("debootstrap %s (%s) from %s", SUITE, ",".join(PACKAGES), MIRROR)
            _run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(PACKAGES)}",
                    SUITE,
                    str(rootfs),
                    MIRROR,
                ],
                timeout=1800,
            )
            _lay_out(rootfs)
            partial = work / "base.tar"
            _run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(partial), "."], 600)
            partial.rename(tarball)
            for other in CACHE.glob("base-*.tar"):
                if other != tarball:
                    other.unlink()
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return tarball


class Buildah:
    """buildah on a private vfs store under the cache directory, chroot isolation."""

    def __init__(self, root: Path = CACHE / "storage") -> None:
        # the store's run state (mount counts, locks) on /run, a tmpfs, so that a reboot
        # clears it as it clears the mounts; one per store
        runroot = Path("/run/retryd-image") / hashlib.sha256(str(root).encode()).hexdigest()[:12]
        self.global_args = [
            "buildah",
            "--storage-driver",
            "vfs",
            "--root",
            str(root),
            "--runroot",
            str(runroot),
        ]

    def __call__(self, *args: str, timeout: float = 600) -> str:
        return _run([*self.global_args, *args], timeout).stdout.strip()

    def command(self, *args: str) -> list[str]:
        return [*self.global_args, *args]

    def has_image(self, name: str) -> bool:
        done = subprocess.run(
            self.command("inspect", "--type", "image", name), capture_output=True, timeout=60
        )
        return done.returncode == 0

    def prune(self) -> None:
        """Remove what runs that were killed left in the store (their images, with the
        containers made from them, once older than ``STALE_S``: another run may be using a
        newer one) and bases of other keys: vfs keeps a full copy of each."""
        now = time.time()
        for image in json.loads(self("images", "--json") or "null") or []:
            stale = now - float(image.get("created", now)) > STALE_S
            for name in image.get("names") or []:
                if (name.startswith(TEST_REPO) and stale) or (
                    name.startswith(BASE_REPO) and name != base_name()
                ):
                    log.info("removing %s from the image store", name)
                    self("rmi", "--force", name)

    def base_image(self) -> str:
        """The stand-in base in the store, imported from its tarball once."""
        name = base_name()
        with _locked(CACHE / "import.lock"):
            if self.has_image(name):
                return name
            tarball = base_tarball()
            container = self("from", "scratch")
            try:
                self("add", container, str(tarball), "/")
                config = [f"--env={k}={v}" for k, v in BASE_ENV.items()]
                self("config", *config, "--cmd", '["python3"]', container)
                self("commit", "--format", "docker", container, name, timeout=900)
            finally:
                subprocess.run(self.command("rm", container), capture_output=True, timeout=60)
        return name

    def build(self, context: Path, tag: str, base: str) -> None:
        """The Dockerfile, unchanged, on ``base``; docker format keeps its HEALTHCHECK (OCI
        image configs have no such field). The host's CA bundle is mounted over the base's
        for the build's steps only (pip reaches PyPI through whatever TLS-inspecting proxy
        the host trusts); the image keeps the base's own."""
        mounts = [f"--volume={HOST_CA}:{HOST_CA}:ro"] if Path(HOST_CA).is_file() else []
        self(
            "bud",
            *mounts,
            "--isolation",
            "chroot",
            "--network",
            "host",
            "--pull=never",
            "--format",
            "docker",
            "--layers=false",
            "--build-arg",
            f"PYTHON_IMAGE={base}",
            "-t",
            tag,
            "-f",
            str(context / "Dockerfile"),
            str(context),
            timeout=1800,
        )

    def inspect(self, image: str) -> dict[str, Any]:
        return json.loads(self("inspect", "--type", "image", image))  # type: ignore[no-any-return]
