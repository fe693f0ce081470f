"""An error route's dead-letter topic (``dlt:<topic>``) through a real `retryd sidecar` on a
real broker: browse it, read and replay one record, run a bulk job on it, see its backlog;
no other topic can be named, and the DLT is never a replay target."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from retryd.policy.headers import Envelope, routed_headers
from tests.integration.sidecar_support import (
    Env,
    SidecarProcess,
    failed_headers,
    pretty,
    replay_cli,
    seed,
)
from tests.integration.sidecar_support import wait_job as wait_done
from tests.support import create_topics, read_topic, wait_for

ROUTE = "myapp.Declined"
N_DLT = 6
N_FAILED = 3


def routed(original_topic: str, offset: int) -> list[tuple[str, bytes | None]]:
    """The headers a worker writes on a copy an error route sends to its DLT."""
    env = Envelope(
        original_topic=original_topic,
        original_partition=0,
        original_offset=offset,
        original_timestamp=1_700_000_000_000,
        retry_number=1,
        first_failure_timestamp=1_700_000_000_500,
        error_class=ROUTE,
        error_message="Declined: card 1234",
        dead_reason="routed",
        route=ROUTE,
    )
    return routed_headers([("trace", b"t%d" % offset)], env)


@pytest.fixture(scope="module")
def deployment(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Env:
    env = Env(bootstrap, tmp_path_factory.mktemp("sidecar-dlt") / "state")
    env.extra = {
        "RETRYD_ERROR_ROUTES": f"{ROUTE}=dlt:{dlt(env)}",
        "RETRYD_METRICS_INTERVAL_S": "1",
    }
    env.create()
    create_topics(bootstrap, [dlt(env)], 2)
    for i in range(N_DLT):
        seed(bootstrap, dlt(env), [(b"d%d" % i, b"declined-%d" % i, routed(env.main, i))], i % 2)
    for i in range(N_FAILED):
        seed(bootstrap, env.failed, [(b"f%d" % i, b"failed", failed_headers(env.main))], i % 2)
    return env


def dlt(env: Env) -> str:
    return f"{env.group}.declined"


@pytest.fixture(scope="module")
def sidecar(deployment: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    log = tmp_path_factory.mktemp("sidecar-dlt-log") / "sidecar.log"
    proc = SidecarProcess(deployment, log).start()
    try:
        yield proc
    finally:
        proc.stop()


def test_browse_a_routes_dead_letter_topic(deployment: Env, sidecar: SidecarProcess) -> None:
    with sidecar.client() as c:
        page = c.get("/v1/failed", params={"topic": dlt(deployment), "limit": 100}).json()
        assert len(page["items"]) == N_DLT and not page["has_more"], pretty(page)
        for item in page["items"]:
            assert item["topic"] == dlt(deployment)
            assert item["coordinate"].startswith(f"{dlt(deployment)}/")
            assert item["retryd"]["retryd_dead_reason"] == "routed"
            assert item["retryd"]["retryd_route"] == ROUTE
        by_reason = c.get(
            "/v1/failed", params={"topic": dlt(deployment), "dead_reason": "routed"}
        ).json()
        assert len(by_reason["items"]) == N_DLT
        # the default is failed_topic, where no record was routed: an empty page, not a 422
        default = c.get("/v1/failed", params={"limit": 100}).json()
        assert {i["topic"] for i in default["items"]} == {deployment.failed}
        assert len(default["items"]) == N_FAILED
        none = c.get("/v1/failed", params={"dead_reason": "routed"})
        assert none.status_code == 200 and none.json()["items"] == [], none.text
        explicit = c.get("/v1/failed", params={"topic": deployment.failed, "limit": 100}).json()
        assert len(explicit["items"]) == N_FAILED


def test_only_dead_letter_topics_can_be_read(deployment: Env, sidecar: SidecarProcess) -> None:
    with sidecar.client() as c:
        for topic in (deployment.main, deployment.ledger, "__consumer_offsets", "nowhere"):
            for method, path in (
                ("GET", "/v1/failed"),
                ("GET", "/v1/failed/0/0"),
                ("POST", "/v1/failed/0/0/replay"),
            ):
                r = c.request(method, path, params={"topic": topic})
                assert r.status_code == 400, (method, path, topic, r.text)
                body = r.json()
                assert body["error"] == "bad_request"
                assert "not a dead-letter topic" in body["detail"]
                assert f"{deployment.failed}, {dlt(deployment)}" in body["detail"]
            job = c.post("/v1/replays", json={"topic": topic, "dry_run": True})
            assert job.status_code == 400, job.text
        assert c.get("/v1/failed", params={"topic": "a b"}).status_code == 422
        assert c.post("/v1/replays", json={"topic": "a/b"}).status_code == 422


def test_replay_one_record_of_a_dlt(
    bootstrap: str, deployment: Env, sidecar: SidecarProcess
) -> None:
    topic = dlt(deployment)
    with sidecar.client() as c:
        rec = c.get("/v1/failed/1/0", params={"topic": topic}).json()
        assert rec["coordinate"] == f"{topic}/1/0" and rec["replayed"] is None, pretty(rec)
        # a DLT is never a target, whatever the allow-list says
        refused = c.post("/v1/failed/1/0/replay", params={"topic": topic}, json={"target": topic})
        assert refused.status_code == 403 and refused.json()["error"] == "target_reserved"
        assert "dead-letter topic of an error route" in refused.json()["detail"]

        done = c.post("/v1/failed/1/0/replay", params={"topic": topic})
        assert done.status_code == 200, done.text
        out = done.json()
        assert out["coordinate"] == f"{topic}/1/0" and out["target_topic"] == deployment.main
        copies = read_topic(bootstrap, deployment.main, expect=1)
        assert len(copies) == 1 and copies[0].value == b"declined-1"
        assert copies[0].header("retryd_replayed_from") == f"{topic}/1/0".encode()
        assert copies[0].header("retryd_route") is None  # a fresh retry sequence

        # the ledger keys by topic: this record is replayed, failed_topic's 1/0 is not
        again = c.post("/v1/failed/1/0/replay", params={"topic": topic})
        assert again.status_code == 409, again.text
        seen = c.get("/v1/failed/1/0", params={"topic": topic}).json()
        assert seen["replayed"]["replay_id"] == out["replay_id"]
        assert c.get("/v1/failed/1/0").json()["replayed"] is None


def test_bulk_job_on_a_dlt(bootstrap: str, deployment: Env, sidecar: SidecarProcess) -> None:
    topic = dlt(deployment)
    with sidecar.client() as c:
        dry = c.post("/v1/replays", json={"topic": topic, "dry_run": True})
        assert dry.status_code == 202, dry.text
        snap = wait_done(c, dry.json()["id"])
        assert snap["topic"] == topic and snap["state"] == "completed", pretty(snap)
        assert snap["matched"] == N_DLT and snap["by_dead_reason"] == {"routed": N_DLT}

        ledger_before = c.get("/v1/failed", params={"topic": topic, "limit": 100}).json()
        already = sum(1 for i in ledger_before["items"] if i["replayed"] is not None)
        job = c.post(
            "/v1/replays",
            json={"topic": topic, "filter": {"dead_reason": "routed"}, "max_per_second": 1000},
        )
        assert job.status_code == 202, job.text
        snap = wait_done(c, job.json()["id"])
        assert snap["state"] == "completed", pretty(snap)
        assert snap["replayed"] == N_DLT - already and snap["skipped"] == already
        copies = read_topic(bootstrap, deployment.main, expect=N_DLT)
        sources = {(x.header("retryd_replayed_from") or b"").decode() for x in copies}
        assert all(s.startswith(f"{topic}/") for s in sources) and len(sources) == N_DLT
        # the default job still reads failed_topic
        failed_job = c.post("/v1/replays", json={"dry_run": True})
        snap = wait_done(c, failed_job.json()["id"])
        assert snap["topic"] == deployment.failed and snap["matched"] == N_FAILED


def test_backlog_of_each_dead_letter_topic(deployment: Env, sidecar: SidecarProcess) -> None:
    def backlog() -> dict[str, float] | None:
        text = httpx.get(sidecar.url + "/metrics", timeout=10).text
        found = {
            s.labels["topic"]: s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == "retryd_failed_backlog"
        }
        return found if len(found) == 2 else None

    found = wait_for(backlog, 30, 0.2, "retryd_failed_backlog of both topics")
    assert found == {deployment.failed: N_FAILED, dlt(deployment): N_DLT}, json.dumps(found)


def test_replay_cli_reads_a_dlt(deployment: Env) -> None:
    args = ["--topic", dlt(deployment), "--dead-reason", "routed", "--dry-run", "--json"]
    run = replay_cli(deployment, *args)
    assert run.returncode == 0, run.stderr
    snap = json.loads(run.stdout)
    assert snap["topic"] == dlt(deployment) and snap["matched"] == N_DLT
