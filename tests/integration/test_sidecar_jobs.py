"""Bulk replay jobs over HTTP: rate limit, exact filtered set, dry run, cancel."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.sidecar_support import (
    Env,
    SidecarProcess,
    failed_headers,
    pretty,
    seed,
    wait_job,
)
from tests.support import read_topic, wait_for

MATCHING = 2100
OTHERS = 300


@pytest.fixture(scope="module")
def deployment(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Env:
    env = Env(bootstrap, tmp_path_factory.mktemp("sidecar-jobs") / "state").create()
    records = []
    for i in range(MATCHING + OTHERS):
        matching = i % 8 != 0 or i >= 8 * OTHERS
        headers = failed_headers(
            env.main if matching else env.other,
            error_class="ValueError" if matching else "KeyError",
            original_partition=i % 2,
            original_offset=i,
        )
        records.append((f"k{i}".encode(), f"v{i}".encode(), headers))
    seed(bootstrap, env.failed, records)
    return env


@pytest.fixture(scope="module")
def sidecar(deployment: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    log = tmp_path_factory.mktemp("sidecar-jobs-log") / "sidecar.log"
    proc = SidecarProcess(deployment, log).start()
    try:
        yield proc
    finally:
        proc.stop()


def test_dry_run_counts_and_produces_nothing(sidecar: SidecarProcess, deployment: Env) -> None:
    with sidecar.client() as client:
        r = client.post(
            "/v1/replays", json={"filter": {"original_topic": deployment.main}, "dry_run": True}
        )
        assert r.status_code == 202, r.text
        job = wait_job(client, r.json()["id"])
    assert job["state"] == "completed", pretty(job)
    assert job["matched"] == MATCHING and job["to_replay"] == MATCHING
    assert job["replayed"] == 0 and job["by_target"] == {deployment.main: MATCHING}
    assert job["by_error_class"] == {"ValueError": MATCHING}
    assert read_topic(deployment.bootstrap, deployment.main) == []


def test_bulk_job_is_rate_limited_and_replays_exactly_the_filtered_set(
    sidecar: SidecarProcess, deployment: Env
) -> None:
    with sidecar.client() as client:
        t0 = time.monotonic()
        r = client.post(
            "/v1/replays",
            json={"filter": {"error_class": "ValueError"}, "max_per_second": 500},
        )
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        running = wait_for(
            lambda: (b := client.get(f"/v1/replays/{job_id}").json())["replayed"] > 200 and b,
            30,
            what="progress",
        )
        assert running["state"] == "running" and running["to_replay"] == MATCHING
        assert running["rate_per_second"] > 0 and running["eta_seconds"] is not None
        job = wait_job(client, job_id, timeout=120)
        took = time.monotonic() - t0
    assert job["state"] == "completed", pretty(job)
    assert took >= MATCHING / 500, took
    assert job["replayed"] == MATCHING and job["failed"] == 0 and job["skipped"] == 0
    # the reported rate is the job's own (measured here against the test's clock), and the
    # limit held; how close to the limit it ran depends on the machine, not on retryd
    assert job["rate_per_second"] <= 600, job["rate_per_second"]
    assert 0.5 * MATCHING / took <= job["rate_per_second"], (job["rate_per_second"], took)
    copies = read_topic(deployment.bootstrap, deployment.main, expect=MATCHING)
    sources = [c.header("retryd_replayed_from") for c in copies]
    assert len(sources) == MATCHING and len(set(sources)) == MATCHING
    assert all(c.header("retryd_replay_id") == job_id.encode() for c in copies)
    assert all(c.header("retryd_error_class") is None for c in copies)
    assert {c.value for c in copies} == {
        f"v{i}".encode() for i in range(MATCHING + OTHERS) if i % 8 != 0 or i >= 8 * OTHERS
    }
    print(f"bulk job: {MATCHING} records at max_per_second=500 took {took:.2f}s")

    # A second job over the same set skips everything: the ledger has it.
    with sidecar.client() as client:
        again = wait_job(
            client,
            client.post(
                "/v1/replays",
                json={"filter": {"error_class": "ValueError"}, "max_per_second": 5000},
            ).json()["id"],
        )
    assert again["replayed"] == 0 and again["skipped"] == MATCHING, pretty(again)
    assert again["skipped_reasons"] == {"already_replayed": MATCHING}


def test_cancel_stops_and_reports_where(sidecar: SidecarProcess, deployment: Env) -> None:
    with sidecar.client() as client:
        r = client.post(
            "/v1/replays",
            json={
                "filter": {"original_topic": deployment.other},
                "target": deployment.other,
                "max_per_second": 50,
            },
        )
        job_id = r.json()["id"]
        wait_for(
            lambda: client.get(f"/v1/replays/{job_id}").json()["replayed"] >= 20,
            30,
            what="20 replays",
        )
        r = client.delete(f"/v1/replays/{job_id}")
        assert r.status_code == 200, r.text
        job = r.json()
        assert job["state"] == "cancelled", pretty(job)
        assert 20 <= job["replayed"] < OTHERS
        assert job["last_replayed"] is not None
        assert job["position"] and sum(job["position"].values()) < sum(job["end_offsets"].values())
        assert client.get(f"/v1/replays/{job_id}").json()["replayed"] == job["replayed"]
        listed = client.get("/v1/replays").json()["jobs"]
        assert job_id in [j["id"] for j in listed]
    copies = read_topic(deployment.bootstrap, deployment.other)
    assert len(copies) == job["replayed"]
    # Exactly the matching records before the reported position were replayed.
    position = {int(p): o for p, o in job["position"].items()}
    failed = read_topic(deployment.bootstrap, deployment.failed)
    before = {
        f"{r.topic}/{r.partition}/{r.offset}".encode()
        for r in failed
        if r.header("retryd_original_topic") == deployment.other.encode()
        and r.offset < position[r.partition]
    }
    assert {c.header("retryd_replayed_from") for c in copies} == before


def test_max_messages(sidecar: SidecarProcess, deployment: Env, tmp_path: Path) -> None:
    with sidecar.client() as client:
        r = client.post(
            "/v1/replays",
            json={
                "filter": {"original_topic": deployment.other},
                "target": deployment.other,
                "max_per_second": 1000,
                "max_messages": 7,
            },
        )
        job = wait_job(client, r.json()["id"])
    assert job["state"] == "completed" and job["replayed"] == 7, pretty(job)
    assert "max_messages" in job["stop_reason"]
