"""A rolling upgrade from the previous revision (N, tests/integration/upgrade_support.py) to
this one (N+1) and back, on Apache Kafka, under load; the replay ledger shared by both; what N
does with headers and settings it does not know (a downgrade).

N runs role ``all`` with main topics and tiers on one consumer; N+1 puts the tiers on a group
member of their own. In the middle of the upgrade one group holds both shapes. Every record
must still end in exactly one place, and tier copies written by either revision must be
handled by the other: N's at the upgrade's last step (no N worker is left to handle them),
N+1's once the group is rolled back to one N worker.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from retryd.policy.headers import Envelope, routed_headers
from tests.integration.upgrade_support import (
    Load,
    header_names,
    previous_tree,
    retryd_command,
    run_together,
    settled,
)
from tests.integration.worker_support import REPO, Deployment, deployment, stop_process
from tests.support import ON_TANSU, json_lines, produce, read_topic, unique, wait_for

pytestmark = pytest.mark.skipif(
    ON_TANSU, reason="a rolling upgrade is tested on Apache Kafka (it reads the group's state)"
)

ALL, TIERS = "retryd-worker-all", "retryd-worker-all-tiers"  # group members' client ids
FAST = ("--json", "--rate", "10000")  # replays per second (the default, 100, is for production)
FUTURE = "retryd_future_example"  # a header no revision knows: one a later revision might add
DOWNGRADE_IDS = ("d-main", "d-tier")


def test_rolling_upgrade_and_back(bootstrap: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    old_tree = previous_tree(tmp_path / "previous")
    dep = deployment(bootstrap, tmp_path, sequence="1s,2s", partitions=2)
    env = {**dep.env(), "RETRYD_LEDGER_TOPIC": unique("ledger")}
    log = tmp_path / "calls.log"
    # a setting only N+1 knows, in the environment both revisions are given: N ignores it
    worker_env = {**env, "RETRYD_TEST_LOG": str(log), "RETRYD_TIER_CONSUMER": "own"}
    procs: dict[str, Any] = {}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    partitions = 2 * (1 + len(dep.settings.plan.tier_topics))
    phases: list[str] = []

    def mark(what: str) -> None:
        phases.append(f"{what} {time.monotonic() - t0:.1f}")

    def start(name: str, tree: Path) -> int:
        procs[name] = retryd_command(tree, worker_env, "worker", log=tmp_path / f"{name}.out")
        return procs[name].pid

    def handled_by(pid: int) -> bool:
        return any(c["pid"] == pid for c in json_lines(log))

    def stop_when_settled(name: str, members: dict[str, int]) -> None:
        """SIGTERM ``name`` once the group is stable with ``members``, every partition
        assigned (README, Upgrades: why a rolling upgrade waits for it)."""
        group = dep.settings.group_id
        wait_for(lambda: settled(admin, group, members, partitions), 60, 0.5, f"{members}")
        assert stop_process(procs.pop(name)) == 0

    # the same setting in a config file: N refuses to start (checked at the end)
    toml = tmp_path / "retryd.toml"
    toml.write_text('tier_consumer = "own"\n')
    refused_env = {**env, "RETRYD_GROUP_ID": unique("g")}  # should it start after all
    refused = retryd_command(
        old_tree, refused_env, "worker", "--config", str(toml), log=toml.with_suffix(".out")
    )
    # headers a downgrade meets: those N+1 defines and N does not, and a made-up one
    unknown = [*sorted(header_names(REPO) - header_names(old_tree)), FUTURE]
    _send_downgrade_records(dep, unknown)
    load = Load(dep, per_second=80).start()
    try:
        old = {start("old1", old_tree), start("old2", old_tree)}
        wait_for(lambda: all(handled_by(p) for p in old), 60, what="both N workers handling")
        firsts = {("d-main", 0), ("d-tier", 1)}  # the downgrade records' first hop
        wait_for(lambda: firsts <= _steps(json_lines(log)), 30, what="N on the unknown headers")
        mark("N handling")
        # one at a time, N -> N+1
        stop_when_settled("old1", {ALL: 2})
        new1 = start("new1", REPO)
        wait_for(lambda: handled_by(new1), 60, what="the first N+1 worker handling")
        mark("new1 handling")
        # N's one member (main topics and tiers) beside N+1's two (main topics; tiers)
        stop_when_settled("old2", {ALL: 2, TIERS: 1})
        new2 = start("new2", REPO)
        wait_for(lambda: handled_by(new2), 60, what="the second N+1 worker handling")
        new = {new1, new2}
        wait_for(lambda: _crossings(json_lines(log), old, new)[0], 30, 0.2, "N's copies on N+1")
        mark("upgraded")
        # rolled back one at a time to one N worker, which gets the copies N+1 left
        stop_when_settled("new2", {ALL: 2, TIERS: 2})
        old.add(start("old3", old_tree))
        wait_for(lambda: handled_by(procs["old3"].pid), 60, what="the N worker back")
        stop_when_settled("new1", {ALL: 2, TIERS: 1})
        wait_for(lambda: _crossings(json_lines(log), old, new)[1], 30, 0.2, "N+1's copies on N")
        mark("rolled back")
        specs = load.stop()
        wait_for(lambda: _resolved(json_lines(log), specs), 60, 0.2, "every record settled")
        mark("settled")
    finally:
        load.halt()
        for proc in procs.values():
            stop_process(proc)
        stop_process(refused)
    calls = json_lines(log)
    failed = read_topic(bootstrap, dep.failed)
    _check_outcomes(specs, calls, failed)
    _check_downgrade(dep, calls, old, unknown)
    assert refused.returncode == 2
    said = toml.with_suffix(".out").read_text()
    assert "tier_consumer='own': Extra inputs are not permitted" in said, said
    mark("checked")
    _check_shared_ledger(env, old_tree, failed, calls, old, new)
    mark("replayed")
    print(f"upgrade test: {len(specs)} records; at s: {', '.join(phases)}")


def _send_downgrade_records(dep: Deployment, unknown: list[str]) -> None:
    """A main-topic record and a tier copy carrying headers N does not know, beside a user
    header; they always fail, so every revision on their way writes a copy of them."""
    extra = [(name, b"1") for name in unknown]
    user = [("x-app", b"kept")]
    now_ms = int(time.time() * 1000)
    envelope = Envelope(dep.main, 0, 0, now_ms, retry_number=1, retry_timestamp=now_ms)
    envelope.group = dep.settings.group_id
    d_tier = json.dumps({"id": "d-tier", "mode": "always"}).encode()
    copy = routed_headers(user, envelope) + extra
    produce(dep.bootstrap, dep.tier("1s"), [(b"d-tier", d_tier, copy)], 0)
    d_main = json.dumps({"id": "d-main", "mode": "always"}).encode()
    produce(dep.bootstrap, dep.main, [(b"d-main", d_main, user + extra)], 0)


def _steps(calls: list[dict]) -> set[tuple[str, int]]:
    return {(c["id"], c["retry_number"]) for c in calls}


def _writers(calls: list[dict]) -> dict[tuple[str, int], int]:
    """(id, retry number) -> the pid of the one call that handled it; a step handled twice
    (redone after a handover) has no single writer and is left out."""
    seen = Counter((c["id"], c["retry_number"]) for c in calls)
    return {
        (c["id"], c["retry_number"]): c["pid"]
        for c in calls
        if seen[(c["id"], c["retry_number"])] == 1
    }


def _crossings(calls: list[dict], old: set[int], new: set[int]) -> tuple[bool, bool]:
    """(a tier copy N wrote was handled by N+1, a tier copy N+1 wrote was handled by N): the
    copy of step r is written by the process whose call at step r-1 failed."""
    by = _writers(calls)
    n_to_new = new_to_n = False
    for (ident, r), pid in by.items():
        writer = by.get((ident, r - 1))
        n_to_new |= writer in old and pid in new
        new_to_n |= writer in new and pid in old
    return n_to_new, new_to_n


def _resolved(calls: list[dict], specs: list[dict]) -> bool:
    """Every record of the load had its last call: ok at 0, fail-once at 1, always at 2."""
    last = {"ok": 0, "fail_k": 1, "always": 2}
    done = _steps(calls)
    return all((s["id"], last[s["mode"]]) in done for s in specs)


def _check_outcomes(specs: list[dict], calls: list[dict], failed: list[Any]) -> None:
    """Every record in exactly one place: handled (ok, fail-once) or dead-lettered once."""
    dead = Counter(r.key.decode() for r in failed)
    steps = Counter((c["id"], c["retry_number"]) for c in calls)
    for s in specs:
        i, mode = s["id"], s["mode"]
        if mode == "always":
            assert dead[i] == 1, f"{i}: dead-lettered {dead[i]} times"
        else:
            assert dead[i] == 0, f"{i} ({mode}) was dead-lettered"
            assert steps[(i, 1 if mode == "fail_k" else 0)] >= 1, f"{i} ({mode}) never handled"
    assert set(dead) == {s["id"] for s in specs if s["mode"] == "always"} | set(DOWNGRADE_IDS)
    assert all(dead[i] == 1 for i in DOWNGRADE_IDS)
    redone = sum(n - 1 for n in steps.values())
    print(f"upgrade test: {len(calls)} calls, {redone} redone after a handover")


def _check_downgrade(dep: Deployment, calls: list[dict], old: set[int], unknown: list[str]) -> None:
    """N handled records carrying headers it does not know, without error (never
    ``malformed``): the copies it wrote keep the user header and do not carry the unknown
    ``retryd_*`` ones (a copy's retryd headers are written afresh from the names the writer
    knows). Later copies (by whichever revision) keep the same."""
    by = _writers(calls)
    assert by[("d-main", 0)] in old and by[("d-tier", 1)] in old  # the first copies: by N
    steps = sorted((c["id"], c["retry_number"]) for c in calls if c["id"] in DOWNGRADE_IDS)
    assert steps == [("d-main", 0), ("d-main", 1), ("d-main", 2), ("d-tier", 1), ("d-tier", 2)]
    copies = [
        r
        for topic in (dep.tier("1s"), dep.tier("2s"), dep.failed)
        for r in read_topic(dep.bootstrap, topic)
        if r.key in (b"d-main", b"d-tier") and not (topic == dep.tier("1s") and r.key == b"d-tier")
    ]
    assert len(copies) == 5  # d-main: tier 1, tier 2, failed; d-tier: tier 2, failed
    for r in copies:
        names = {n for n, _ in r.headers}
        assert r.header("x-app") == b"kept", r.headers
        assert not names & set(unknown), r.headers
        assert r.header("retryd_original_topic") == dep.main.encode()
    assert {r.header("retryd_dead_reason") for r in copies if r.topic == dep.failed} == {
        b"exhausted"
    }


def _check_shared_ledger(
    env: dict[str, str],
    old_tree: Path,
    failed: list[Any],
    calls: list[dict],
    old: set[int],
    new: set[int],
) -> None:
    """One replay ledger for both revisions. First N+1 replays a dead letter N wrote while N
    replays one N+1 wrote; then N finds the first replayed, while N+1 replays all the rest
    and skips both. Every dead letter is replayed exactly once."""
    by = _writers(calls)
    keys = [r.key.decode() for r in failed]
    x = next(k for k in keys if by.get((k, 2)) in old)  # dead-lettered by N
    y = next(k for k in keys if by.get((k, 2)) in new)  # dead-lettered by N+1
    one, two = run_together(
        env, (REPO, ["replay", "--key", x, *FAST]), (old_tree, ["replay", "--key", y, *FAST])
    )
    assert json.loads(one.stdout)["replayed"] == 1, one.stderr
    assert json.loads(two.stdout)["replayed"] == 1, two.stderr
    again, rest = run_together(
        env, (old_tree, ["replay", "--key", x, *FAST]), (REPO, ["replay", "--yes", *FAST])
    )
    snap = json.loads(again.stdout)
    assert snap["replayed"] == 0 and snap["skipped_reasons"] == {"already_replayed": 1}, snap
    snap = json.loads(rest.stdout)
    assert snap["replayed"] == len(failed) - 2, snap
    assert snap["skipped_reasons"] == {"already_replayed": 2}, snap
    replayed = Counter(
        r.header("retryd_replayed_from")
        for r in read_topic(env["RETRYD_BOOTSTRAP_SERVERS"], env["RETRYD_MAIN_TOPICS"])
        if r.header("retryd_replay_id") is not None
    )
    coords = {f"{r.topic}/{r.partition}/{r.offset}".encode() for r in failed}
    assert set(replayed) == coords and set(replayed.values()) == {1}, replayed
