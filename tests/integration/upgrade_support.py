"""Two revisions of retryd side by side: the previous one (N) from git history, this one (N+1).

retryd has no published releases yet, so "the previous release" is a pinned revision of this
repository, extracted with ``git archive`` (the working tree is untouched) and run as its own
``python -m retryd`` processes with ``PYTHONPATH`` (and the working directory: ``-m`` puts it
first on ``sys.path``) pointing at that tree. Its dependencies are this one's (the same
requirements files), so the suite's interpreter runs both.

Moving it forward: at each release, set ``PREVIOUS_REVISION`` to the commit (or tag) of the
release before it: the revision users upgrade *from*. While no release exists it is the last
revision whose worker is a different deployment (here: role ``all`` with the tiers on the main
topics' consumer, before ``retryd.worker.split_consumer``). A checkout without that history
(a shallow clone, a source archive) skips the upgrade tests and says why.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState, Producer
from confluent_kafka.admin import AdminClient

from retryd.policy.headers import is_retryd_header
from tests.integration.worker_support import REPO, Deployment

# The revision users upgrade from (see the module docstring for how to move it forward).
PREVIOUS_REVISION = "46ac6b6d680d98af979ed6db7b842fa5805787e9"


def previous_tree(into: Path, rev: str = PREVIOUS_REVISION) -> Path:
    """The source tree of ``rev`` (its ``retryd`` and ``tests`` packages) under ``into``;
    skips the test when git or the revision is not available."""
    if shutil.which("git") is None:
        pytest.skip("the upgrade test needs git to extract the previous revision")
    found = subprocess.run(
        ["git", "cat-file", "-e", f"{rev}^{{commit}}"], cwd=REPO, capture_output=True
    )
    if found.returncode != 0:
        pytest.skip(f"revision {rev[:12]} is not in this checkout's history (a shallow clone?)")
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "archive", rev, "retryd", "tests"], cwd=REPO, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def retryd_command(
    tree: Path, env: dict[str, str], *args: str, log: Path
) -> subprocess.Popen[bytes]:
    """``python -m retryd <args>`` from source tree ``tree``, output to ``log``."""
    out = open(log, "ab")  # noqa: SIM115 - the child holds it
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "retryd", *args],
            env={**env, "PYTHONPATH": str(tree)},
            cwd=tree,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    finally:
        out.close()


def run_together(
    env: dict[str, str], *commands: tuple[Path, list[str]]
) -> list[subprocess.CompletedProcess[str]]:
    """``python -m retryd <args>`` from each ``(tree, args)``, all at once, to completion."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "retryd", *args],
            env={**env, "PYTHONPATH": str(tree), "COLUMNS": "160"},
            cwd=tree,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tree, args in commands
    ]
    try:
        out = []
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=120)
            out.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
        return out
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def header_names(tree: Path) -> set[str]:
    """The header names the revision in ``tree`` defines: the text constants of its
    retryd.policy.headers that name a retryd header (read from the source, not imported)."""
    module = ast.parse((tree / "retryd" / "policy" / "headers.py").read_text())
    names: set[str] = set()
    for node in module.body:
        if (
            isinstance(node, ast.Assign)
            and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and is_retryd_header(node.value.value)
        ):
            names.add(node.value.value)
    return names


def settled(admin: AdminClient, group: str, members: dict[str, int], partitions: int) -> bool:
    """The group is stable with exactly ``members`` (client id -> how many) and every one of
    its ``partitions`` assigned: no rebalance under way, nor a cooperative second round still
    owed. (A worker stopped during a rebalance cannot commit its last offsets: its generation
    is stale, the broker answers ILLEGAL_GENERATION, and its successor redoes those records.)"""
    desc = admin.describe_consumer_groups([group])[group].result(timeout=30)
    owned = sum(len(m.assignment.topic_partitions) for m in desc.members)
    return (
        desc.state == ConsumerGroupState.STABLE
        and Counter(m.client_id for m in desc.members) == Counter(members)
        and owned == partitions
    )


@dataclass
class Load:
    """Records produced to the main topic at a steady rate from a thread, until stopped: the
    traffic a rolling upgrade happens under. ``mix`` says which ``behave`` mode the i-th
    record gets."""

    dep: Deployment
    per_second: float
    specs: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    error: BaseException | None = None

    @staticmethod
    def mix(i: int) -> dict[str, Any]:
        if i % 10 == 3:
            return {"mode": "always"}
        if i % 10 in (1, 6):
            return {"mode": "fail_k", "k": 1}  # fails once, handled on its first retry
        return {"mode": "ok"}

    def start(self) -> Load:
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        producer = Producer({"bootstrap.servers": self.dep.bootstrap, "linger.ms": 5})
        failed: list[Any] = []

        def done(err: Any, msg: Any) -> None:
            if err is not None:
                failed.append(err)

        try:
            i = 0
            while not self._stop.wait(1 / self.per_second):
                spec = {"id": f"u{i}", **self.mix(i)}
                producer.produce(
                    self.dep.main, key=spec["id"].encode(), value=json.dumps(spec), on_delivery=done
                )
                producer.poll(0)
                self.specs.append(spec)
                i += 1
            if producer.flush(30) or failed:
                raise AssertionError(f"load: records not acknowledged: {failed[:3]}")
        except BaseException as exc:
            self.error = exc

    def halt(self) -> None:
        """Stop producing (idempotent; a failure is reported by ``stop``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def stop(self) -> list[dict[str, Any]]:
        """Stop producing; every record produced, each acknowledged."""
        self.halt()
        if self.error is not None:
            raise AssertionError(f"load producer failed: {self.error!r}") from self.error
        return self.specs
