"""What every replicated-cluster scenario shares: its topics provisioned as an operator would
(the main topic by the test, retryd's own by ``retryd topics create``, all with replication
factor 3 and min.insync.replicas 2), two ``retryd worker`` processes, the paced load, and the
end of a run (settle, stop, reconcile).
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka.admin import AdminClient, NewTopic

from retryd.config import Settings, load_settings
from retryd.kafka.topics import topic_configs
from tests.chaos.cluster import MIN_INSYNC, REPLICATION, Nodes, Where
from tests.chaos.fleet import CHAOS_HANDLER, Proc, key_order_env
from tests.chaos.ledger import Reconciliation, Spec, reconcile
from tests.chaos.load import PacedProducer, Record
from tests.chaos.scale import SEQUENCE, settle_budget
from tests.chaos.scenario import Scenario, watch
from tests.integration.worker_support import REPO, Deployment
from tests.support import unique, wait_for

if TYPE_CHECKING:
    from tests.chaos.report import ChaosReport

PARTITIONS = 4
# Sessions as in the rest of the suite (the cluster accepts 1 s and up): a member whose
# coordinator does not answer for longer loses its partitions, and its uncommitted work is
# redone. A node crash holds the group's heartbeats for about the broker's fencing time (9 s):
# a scenario may run with retryd's default session (45 s) instead (``session_timeout_ms=None``).
SESSION_TIMEOUT_MS = 2000
JOIN_S = 5.0
SETTLE_S = settle_budget(600.0)
STOP_S = 60.0


def _create_main(nodes: Nodes, topic: str, partitions: int) -> None:
    """The producers' topic, created by the test (retryd never creates main topics) with the
    durability retryd's own topics get."""
    admin = AdminClient({"bootstrap.servers": nodes.bootstrap})
    config = {"min.insync.replicas": str(MIN_INSYNC)}
    futures = admin.create_topics(
        [NewTopic(topic, partitions, REPLICATION, config=config)], operation_timeout=30
    )
    futures[topic].result(40)


def _retryd_topics_create(dep: Deployment, ledger: str) -> str:
    """``retryd topics create`` as an operator runs it (a child process, stopped by its PID
    if it overruns); returns its output."""
    env = {**dep.env(), **key_order_env(dep.settings), "RETRYD_LEDGER_TOPIC": ledger}
    cmd = [
        sys.executable,
        "-m",
        "retryd",
        "topics",
        "create",
        "--replication-factor",
        str(REPLICATION),
        "--min-insync-replicas",
        str(MIN_INSYNC),
    ]
    done = subprocess.run(
        cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"retryd topics create: {done.stdout}\n{done.stderr}"
    return done.stdout


def replicated_deployment(
    nodes: Nodes,
    tmp_path: Path,
    partitions: int,
    session_timeout_ms: int | None,
    **extra: Any,
) -> Deployment:
    """Fresh topics and group on the cluster: every partition of every topic the group reads
    or writes has 3 replicas and min.insync.replicas=2 (checked here, from the cluster).
    ``session_timeout_ms`` None: retryd's defaults for the session and the poll interval.
    ``extra``: further settings (``key_order="strict"``: the key-state topic is made too)."""
    group = unique("g")
    session: dict[str, int] = {}
    if session_timeout_ms is not None:
        session = {"session_timeout_ms": session_timeout_ms, "max_poll_interval_ms": 30_000}
    main = unique("main")
    ledger = f"{group}.ledger"
    settings = load_settings(
        bootstrap_servers=nodes.bootstrap,
        main_topics=main,
        retry_sequence=SEQUENCE,
        tier_template="{group}.retry_{delay}",
        failed_topic=f"{group}.failed",
        ledger_topic=ledger,
        group_id=group,
        handler=CHAOS_HANDLER,
        handler_timeout_s=10.0,
        state_dir=tmp_path / "state",
        poll_timeout_s=0.2,
        replication_factor=REPLICATION,
        min_insync_replicas=MIN_INSYNC,
        # the plan fails records on purpose, from many keys: the outage circuit breaker would
        # hold them (its own chaos scenario is tests/chaos/test_circuit_kills.py)
        circuit_breaker=False,
        **session,
        **extra,
    )
    _create_main(nodes, main, partitions)
    dep = Deployment(nodes.bootstrap, settings, main)
    _retryd_topics_create(dep, ledger)
    topics = [main, *settings.plan.tier_topics, settings.failed_topic, ledger]
    topics += state_topics(settings)
    desc = wait_for(lambda: nodes.describe(topics), 60, 0.5, what="the new topics described")
    assert {n for _, _, n in desc.values()} == {REPLICATION}, desc
    configs = topic_configs(AdminClient({"bootstrap.servers": nodes.bootstrap}), topics, 15)
    assert {t: c["min.insync.replicas"] for t, c in configs.items()} == dict.fromkeys(
        topics, str(MIN_INSYNC)
    )
    return dep


def state_topics(settings: Settings) -> list[str]:
    """The key-state topic of a ``key_order = strict`` deployment (a topic the workers write
    and read), or nothing."""
    return [settings.key_state_topic] if key_order_env(settings) else []


def start_replicated(
    name: str,
    nodes: Nodes,
    tmp_path: Path,
    plan: list[Spec],
    partitions: int = PARTITIONS,
    session_timeout_ms: int | None = SESSION_TIMEOUT_MS,
    **extra: Any,
) -> Scenario:
    dep = replicated_deployment(nodes, tmp_path, partitions, session_timeout_ms, **extra)
    return watch(name, dep, tmp_path, plan)


def cluster_fields(nodes: Nodes, sc: Scenario) -> dict[str, Any]:
    """The report's description of the cluster a row ran on, and of the group's session."""
    return {
        "broker": f"Apache Kafka {nodes.version}, 3 KRaft nodes (broker and controller each)",
        "replication_factor": REPLICATION,
        "min_insync_replicas": MIN_INSYNC,
        "session_timeout_ms": sc.dep.settings.session_timeout_ms,
    }


@dataclass
class Ending:
    rec: Reconciliation
    behind: int
    survivors: list[tuple[str, bool]]
    codes: list[int]


@dataclass
class Run:
    """Two independent ``retryd worker`` processes and the paced load of one scenario.

    The load comes in ``shares`` equal parts: the first while the group joins, then one per
    call to ``feed`` (before a fault, during one), so every fault hits a system under load.
    ``records``: what to produce (default: the plan's, each keyed by its id)."""

    sc: Scenario
    shares: int
    workers: list[Proc] = field(default_factory=list)
    load: PacedProducer = field(init=False)
    share: int = 1
    records: list[Record] | None = None

    def __post_init__(self) -> None:
        sc = self.sc
        self.workers = [sc.fleet.worker("w0"), sc.fleet.worker("w1")]
        records = sc.records() if self.records is None else self.records
        self.load = PacedProducer(sc.dep.bootstrap, sc.dep.main, records)
        self.load.allow_share(1, self.shares, JOIN_S)
        wait_for(
            lambda: sc.observer.refresh().calls > 0, 120, what="the workers to handle messages"
        )

    def feed(self, over_s: float) -> None:
        """Release the next share of the messages, spread over ``over_s`` seconds."""
        self.share = min(self.share + 1, self.shares)
        self.load.allow_share(self.share, self.shares, over_s)

    def gap(self, seconds: float) -> None:
        """Load without a fault for ``seconds`` (the schedule's pace), then check that no
        worker exited on its own."""
        self.feed(seconds)
        time.sleep(seconds)  # the fault schedule's pace
        self.assert_alive()

    def ended(self, *, read_dead: bool = False) -> tuple[int, int]:
        """(ids in a terminal place, dead letters read) so far, from the call log and what
        was read of ``failed_topic`` before (``read_dead``: and what it holds now, a read a
        node down can hold up for a few seconds)."""
        obs = self.sc.observer
        for log in obs.logs:
            log.read_new(obs.tally)
        if read_dead:
            obs.dead.read_new(obs.tally, timeout_s=5.0)
        rec = reconcile(obs.plan, obs.tally)
        return rec.messages - len(rec.lost), sum(obs.tally.dead.values())

    def entry(self, at: float, **fields: Any) -> dict[str, Any]:
        """What a fault hit: messages produced so far, ended, and still on their way."""
        ended, _ = self.ended()
        return {
            "at_s": round(at - self.sc.began, 1),
            **fields,
            "produced": self.load.produced,
            "ended": ended,
            "in_flight": self.load.produced - ended,
        }

    def assert_alive(self) -> None:
        for proc in self.workers:
            assert proc.alive(), (
                f"{proc.name} pid={proc.pid} exited on its own (status {proc.popen.returncode})"
                f": {proc.output()[-3000:]}"
            )

    def end(self) -> Ending:
        """The rest of the messages, then wait until every id has its terminal place and
        everything is committed; stop the workers cleanly; reconcile from scratch."""
        sc = self.sc
        self.load.finish()
        self.load.join(600)
        _, behind = sc.observer.settle(SETTLE_S)
        survivors = [(w.name, w.alive()) for w in self.workers]
        codes = [sc.fleet.terminate(w, STOP_S) for w in self.workers]
        return Ending(sc.observer.final(), behind, survivors, codes)


def sigkill_and_restart(
    nodes: Nodes, run: Run, victim: int, down_s: float, group: str | None = None, **fields: Any
) -> dict[str, Any]:
    """SIGKILL ``victim`` under load, keep it down ``down_s`` seconds (fencing included),
    start it again and wait until every replica is back in sync. The entry says how long the
    partitions it led had no leader (``failover_s``), with ``group`` how long that group had
    no coordinator (``coordinator_failover_s``), and how long catching up took."""
    topics = [*run.sc.topics, run.sc.dep.failed, *state_topics(run.sc.dep.settings)]
    led = nodes.led_by(victim, topics)
    at = time.monotonic()
    pid = nodes.kill(victim)
    entry = run.entry(at, node=victim, pid=pid, led=len(led), **fields)
    run.feed(down_s)
    if group is not None:
        new = wait_for(
            lambda: (c := nodes.coordinator_now(group)) not in (None, victim) and c,
            120,
            0.25,
            what=f"a coordinator of {group} other than node {victim}",
        )
        entry["coordinator_failover_s"] = round(time.monotonic() - at, 1)
        entry["new_coordinator"] = new
    return restart_after(nodes, run, victim, at, led, down_s, entry)


def restart_after(
    nodes: Nodes,
    run: Run,
    victim: int,
    at: float,
    led: list[Where],
    down_s: float,
    entry: dict[str, Any],
) -> dict[str, Any]:
    """The end of a node kill at ``at``: wait until the partitions it ``led`` have leaders
    elsewhere (``failover_s``), keep it down until ``down_s`` has passed, check the workers
    are alive, start it again and wait until every replica is back in sync."""
    entry["failover_s"] = nodes.wait_led_elsewhere(led, victim, at) if led else 0.0
    rest = down_s - (time.monotonic() - at)
    if rest > 0:
        time.sleep(rest)  # the fault schedule: the node stays down this long
    run.assert_alive()
    entry["down_s"] = round(time.monotonic() - at, 1)
    entry["start_s"] = nodes.start(victim)
    entry["in_sync_s"] = nodes.wait_in_sync(nodes.topics())
    return entry


def check(sc: Scenario, end: Ending) -> None:
    """What every replicated scenario asserts once its row is reported."""
    sc.assert_settled(end.rec, end.behind)
    assert all(alive for _, alive in end.survivors), f"a worker exited: {end.survivors}"
    assert end.codes == [0, 0], f"SIGTERM at the end: exit statuses {end.codes}"


def report_and_check(
    report: ChaosReport,
    sc: Scenario,
    end: Ending,
    nodes: Nodes,
    *,
    fault: str,
    faults: int,
    **events: Any,
) -> None:
    """Add the scenario's row to the chaos report, then assert what every replicated scenario
    asserts: the row is written first, so a failing run is reported too."""
    report.add(
        sc.row(end.rec, end.behind, faults, fault=fault, **cluster_fields(nodes, sc), **events)
    )
    check(sc, end)
    print(f"\n{end.rec.describe()} {events}")
