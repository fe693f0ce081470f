"""Share mode with error routes, the dead-letter explorer's API and HTTP replay, on a real
Apache Kafka 4.4 broker, run as users run it (``python -m retryd worker`` and ``sidecar``).

A share worker plans a failure with the same planner as a group worker, so a route by error
class picks its own sequence or a named dead-letter topic; its dead letters land in
``failed_topic`` like any other, so the sidecar lists them and replays one to the main topic,
where the share group hands the copy to a handler again. The replay ledger refuses a second
replay of the same dead letter (409).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.sidecar_support import SidecarProcess
from tests.integration.test_share_mode import calls, share_deployment, spawn
from tests.integration.test_sidecar_metrics import sidecar_env
from tests.integration.worker_support import stop_process
from tests.support import ON_TANSU, broker_older_than, create_topics, read_topic, unique, wait_for

pytestmark = pytest.mark.skipif(
    ON_TANSU or broker_older_than(4, 2),
    reason="share groups (KIP-932) need Apache Kafka 4.2 or newer",
)


def test_routes_explorer_and_replay_in_share_mode(bootstrap: str, tmp_path: Path) -> None:
    dlt = unique("declined")
    create_topics(bootstrap, [dlt], 1)
    d = share_deployment(
        bootstrap,
        tmp_path,
        sequence="2s",
        error_routes={"ValueError": "1s,1s", "PoisonError": f"dlt:{dlt}"},
    )
    t1, t2 = d.tier("1s"), d.tier("2s")
    d.send(
        [
            {"id": "ok"},
            {"id": "routed", "mode": "fail_k", "k": 2},  # ValueError: its route's 1s, 1s
            {"id": "declined", "mode": "poison_by_name"},  # PoisonError: the named topic
            {"id": "always", "mode": "always"},  # RuntimeError: retry_sequence, then dead
        ]
    )
    log = tmp_path / "calls.jsonl"
    routes = json.dumps({"ValueError": "1s,1s", "PoisonError": f"dlt:{dlt}"})
    worker = spawn(d, log, RETRYD_ERROR_ROUTES=routes)
    env = sidecar_env(d, d.settings.state_dir, "2s")
    env.extra.update(
        RETRYD_CONSUMER_MODE="share", RETRYD_ORDERING="none", RETRYD_ERROR_ROUTES=routes
    )
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")
    try:
        wait_for(
            lambda: len(calls(log, "routed")) == 3 and len(calls(log, "always")) == 2,
            90,
            what="the routed record's two retries and the other's one",
        )
        assert [c["topic"] for c in calls(log, "routed")] == [d.main, t1, t1]
        assert [c["topic"] for c in calls(log, "always")] == [d.main, t2]
        assert [c["topic"] for c in calls(log, "declined")] == [d.main]
        (named,) = read_topic(bootstrap, dlt, expect=1, timeout=30)
        assert named.key == b"declined"
        assert named.header("retryd_dead_reason") == b"routed"
        assert named.header("retryd_route") == b"PoisonError"
        (dead,) = read_topic(bootstrap, d.failed, expect=1, timeout=30)
        assert dead.key == b"always" and dead.header("retryd_dead_reason") == b"exhausted"

        with sidecar, sidecar.client() as client:
            rows = client.get("/v1/failed", params={"dead_reason": "exhausted"}).json()["items"]
            assert [r["key"]["data"] for r in rows] == ["always"], rows
            partition, offset = rows[0]["partition"], rows[0]["offset"]
            r = client.post(f"/v1/failed/{partition}/{offset}/replay")
            assert r.status_code == 200, r.text
            assert r.json()["target_topic"] == d.main
            # the share group hands the replayed copy to a handler: a third call, from main
            wait_for(lambda: len(calls(log, "always")) >= 3, 60, what="the replayed copy")
            replayed = calls(log, "always")[2]
            assert replayed["topic"] == d.main
            again = client.post(f"/v1/failed/{partition}/{offset}/replay")
            assert again.status_code == 409, again.text
    finally:
        assert stop_process(worker) == 0
