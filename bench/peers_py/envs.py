"""One virtual environment per Python peer, made on first use under the user's cache.

quix-streams 3.28 pins ``confluent-kafka<2.13`` and an older pydantic: installed beside retryd
it would downgrade retryd's own dependencies, so the peers never share retryd's environment.
Each peer's requirement is tried pinned (the versions the issue measured) and then unpinned
(the newest that installs); an environment that cannot be made leaves that peer out of the
run, with the reason.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

# peer -> (distribution whose version is reported, requirements pinned, requirements unpinned)
PEERS: dict[str, tuple[str, list[str], list[str]]] = {
    "quix-streams": ("quixstreams", ["quixstreams==3.28.1"], ["quixstreams"]),
    "faststream": ("faststream", ["faststream[kafka]==0.7.8"], ["faststream[kafka]"]),
}
CACHE = Path(
    os.environ.get("RETRYD_BENCH_PEERS_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "retryd" / "bench-peers"
)


class PeerUnavailable(Exception):
    """A peer's environment could not be made: the run goes on without that peer."""


def _python(env: Path) -> Path:
    return env / "bin" / "python"


def _installed_version(python: Path, dist: str) -> str | None:
    out = subprocess.run(
        [str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() if out.returncode == 0 else None


def ensure(peer: str) -> tuple[Path, str]:
    """The interpreter of ``peer``'s environment and the peer's installed version; made (or
    repaired) when missing. Raises ``PeerUnavailable`` with pip's last words on failure."""
    dist, pinned, newest = PEERS[peer]
    env = CACHE / peer
    python = _python(env)
    stamp = env / ".bench-peer.json"
    if python.exists() and stamp.exists():
        version = _installed_version(python, dist)
        if version:
            return python, version
    if not python.exists():
        env.parent.mkdir(parents=True, exist_ok=True)
        logger.info("creating the %s environment in %s", peer, env)
        made = subprocess.run(
            [sys.executable, "-m", "venv", str(env)], capture_output=True, text=True, check=False
        )
        if made.returncode != 0:
            raise PeerUnavailable(f"{peer}: venv failed: {made.stderr[-500:]}")
    errors = []
    for reqs in (pinned, newest):
        print(f"  installing {' '.join(reqs)} into {env}", file=sys.stderr)
        got = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *reqs],
            capture_output=True,
            text=True,
            check=False,
        )
        if got.returncode == 0:
            version = _installed_version(python, dist)
            if version:
                stamp.write_text(json.dumps({"requirements": reqs, "version": version}))
                return python, version
        errors.append(got.stderr.strip().splitlines()[-1:] or ["unknown error"])
    raise PeerUnavailable(f"{peer}: pip could not install it: {errors}")
