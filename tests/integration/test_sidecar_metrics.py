"""/metrics after real worker runs: exact counts summed over 2 worker processes, lateness
histogram, measured lag; a dead-lettered message replayed over HTTP is handled once."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from retryd.worker.events import BatchStats, SlotStats
from retryd.worker.slots import Collector
from tests.integration.sidecar_support import Env, SidecarProcess
from tests.integration.worker_support import Deployment, deployment, stop_process
from tests.support import json_lines, produce, read_topic, wait_for


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            assert s.labels.pop("group", None), f"{s.name} has no group label"
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def sidecar_env(dep: Deployment, state_dir: Path, sequence: str) -> Env:
    return Env(
        dep.bootstrap,
        state_dir,
        main=dep.main,
        other=dep.main,
        group=dep.settings.group_id,
        extra={"RETRYD_RETRY_SEQUENCE": sequence, "RETRYD_REPLAY_ALLOWLIST": dep.main},
    )


def _specs(n: int) -> list[dict]:
    modes = {3: {"mode": "fail_k", "k": 1}, 7: {"mode": "non_retryable"}, 9: {"mode": "always"}}
    return [{"id": f"m{i}", **modes.get(i % 10, {"mode": "ok"})} for i in range(n)]


def test_an_iteration_with_only_call_durations_is_published() -> None:
    """The engine publishes a poll iteration's ``BatchStats`` only when it is truthy
    (``Worker._flush_stats``). A failed call's duration is collected from its slot one
    iteration before its outcome, which is counted when its copy is acknowledged: an iteration
    holding only that duration (no record consumed, no outcome) was dropped, and the test below
    saw ``retryd_handler_duration_seconds_count`` one short (119 of 120 tier calls; 599 of 600
    in a loop under load). No broker: the slot and collector the thread pool uses."""
    slot = SlotStats()
    slot.duration("main").observe(0.004)  # a failed call: counted, its outcome still to come
    slot.late("tier").observe(0.2)
    slot.calls += 1
    stats = BatchStats()
    Collector().add(slot, stats)
    assert not stats.outcomes and not stats.records
    assert stats, "an iteration with handler durations and nothing else must be published"
    assert stats.durations["main"].count == 1 and stats.lateness["tier"].count == 1
    assert not BatchStats(), "an empty iteration is not published"


def test_metrics_sum_two_worker_processes_and_measure_lag(bootstrap: str, tmp_path: Path) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s", partitions=2)
    tier = dep.tier("1s")
    dep.send(_specs(600))
    log = tmp_path / "calls.log"
    sup = dep.spawn_worker(log, "--processes", "2", "--until-drained")
    try:
        assert sup.wait(180) == 0
    finally:
        stop_process(sup)
    pids = {json.loads(line)["pid"] for line in log.read_text().splitlines()}
    assert len(pids) == 2, "both worker processes handled messages"

    # Every worker process has exited: the counts below come from the metric files they left,
    # so they survive the processes (a restarted worker adds to them).
    sidecar = SidecarProcess(sidecar_env(dep, dep.settings.state_dir, "1s"), tmp_path / "sc.log")
    with sidecar:
        m = scrape(sidecar.url)
        expected = {
            (dep.main, "success"): 420,
            (dep.main, "retried"): 120,
            (dep.main, "dead"): 60,
            (tier, "success"): 60,
            (tier, "dead"): 60,
        }
        for (topic, outcome), n in expected.items():
            got = value(m, "retryd_messages_total", topic=topic, outcome=outcome)
            assert got == n, (topic, outcome, got)
        assert value(m, "retryd_dead_letters_total", reason="non_retryable") == 60
        assert value(m, "retryd_dead_letters_total", reason="exhausted") == 60
        assert value(m, "retryd_handler_duration_seconds_count", topic=dep.main) == 600
        assert value(m, "retryd_handler_duration_seconds_count", topic=tier) == 120
        late_n = value(m, "retryd_due_lateness_seconds_count", topic=tier)
        late_sum = value(m, "retryd_due_lateness_seconds_sum", topic=tier)
        assert late_n == 120 and late_sum is not None
        assert 0 <= late_sum / late_n < 10, f"mean lateness {late_sum / late_n:.3f}s"
        assert value(m, "retryd_build_info", version="0.1.0") == 1

        # Lag is measured from committed offsets: 0 once drained, then exactly what we add.
        def lag() -> dict[tuple[str, str], float]:
            samples = scrape(sidecar.url)
            return {
                (dict(k[1])["topic"], dict(k[1])["partition"]): v
                for k, v in samples.items()
                if k[0] == "retryd_consumer_lag"
            }

        drained = wait_for(lambda: len(lag()) == 4 and lag(), 30, what="lag of 4 partitions")
        assert set(drained.values()) == {0}, drained
        produce(bootstrap, dep.main, [(b"k", b'{"id": "x"}')] * 25)
        grown = wait_for(
            lambda: sum(v for (t, _), v in lag().items() if t == dep.main) == 25 and lag(),
            30,
            what="lag 25 on the main topic",
        )
        assert sum(v for (t, _), v in grown.items() if t == tier) == 0
        m = scrape(sidecar.url)
        assert (
            value(m, "retryd_http_requests_total", method="GET", route="/metrics", status="200")
            >= 1
        )


def test_replayed_dead_letter_is_handled_once(bootstrap: str, tmp_path: Path) -> None:
    base = deployment(bootstrap, tmp_path, sequence="1s", partitions=1)
    settings = base.settings.model_copy(
        update={"handler": "python:tests.integration.sidecar_handlers:replay_aware"}
    )
    dep = Deployment(bootstrap, settings, base.main)
    produce(bootstrap, dep.main, [(b"p1", b"poison")])
    log = tmp_path / "calls.log"
    worker = dep.spawn_worker(log)
    env = sidecar_env(dep, dep.settings.state_dir, "1s")
    sidecar = SidecarProcess(env, tmp_path / "sc.log")

    def calls() -> list[dict]:
        return json_lines(log)

    try:
        dead = read_topic(bootstrap, dep.failed, expect=1, timeout=60)
        assert dead[0].header("retryd_dead_reason") == b"non_retryable"
        sidecar.start()
        with sidecar.client() as client:
            r = client.post("/v1/failed/0/0/replay")
            assert r.status_code == 200, r.text
            replay_id = r.json()["replay_id"]
            handled = wait_for(
                lambda: [c for c in calls() if c["replay_id"] == replay_id],
                60,
                what="the worker to handle the replayed copy",
            )
            assert handled[0]["retry_number"] == 0  # a fresh retry sequence
            assert handled[0]["replayed_from"] == f"{dep.failed}/0/0"
            assert client.post("/v1/failed/0/0/replay").status_code == 409

            def settled() -> dict | None:
                m = scrape(sidecar.url)
                lag = value(m, "retryd_consumer_lag", kind="main", topic=dep.main, partition="0")
                ok = value(m, "retryd_messages_total", topic=dep.main, outcome="success")
                return m if lag == 0 and ok == 1 else None

            m = wait_for(settled, 30, what="replay committed and counted")
            assert value(m, "retryd_messages_total", topic=dep.main, outcome="dead") == 1
            m = wait_for(
                lambda: (
                    (m := scrape(sidecar.url))
                    and value(m, "retryd_replayed_total", status="replayed", source="sidecar") == 1
                    and m
                ),
                30,
                what="the replay counted from the ledger",
            )
            assert value(m, "retryd_replayed_total", status="skipped", source="sidecar") == 1
            assert value(m, "retryd_replayed_total", status="replayed", source="cli") == 0
        assert len([c for c in calls() if c["replay_id"]]) == 1, "handled exactly once"
        assert len(read_topic(bootstrap, dep.failed)) == 1, "the replay did not fail again"

        sidecar.stop()
        sidecar.start()
        with sidecar.client() as client:
            assert client.post("/v1/failed/0/0/replay").status_code == 409
    finally:
        sidecar.stop()
        stop_process(worker)
