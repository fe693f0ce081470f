"""The /v1 failed-message API against a real broker and a real `retryd sidecar` process."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.sidecar_support import (
    TOKEN,
    Env,
    SidecarProcess,
    failed_headers,
    pretty,
    seed,
)
from tests.support import read_topic

N = 24
JSON = {"content-type": "application/json"}
BINARY = b"\xff\xfe\x00binary"


@pytest.fixture(scope="module")
def deployment(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Env:
    env = Env(bootstrap, tmp_path_factory.mktemp("sidecar-api") / "state").create()
    for i in range(N):
        original = env.other if i % 3 == 0 else env.main
        value = BINARY if i == 5 else ("x" * 5000).encode() if i == 6 else json.dumps({"i": i})
        headers = failed_headers(
            original,
            error_class="ValueError" if i % 2 else "TimeoutError",
            dead_reason="exhausted" if i % 4 else "non_retryable",
            original_partition=i % 2,
            original_offset=i,
            user=[("trace", f"t{i}".encode())],
        )
        raw = value if isinstance(value, bytes) else value.encode()
        seed(bootstrap, env.failed, [(f"k{i}".encode(), raw, headers)], partition=i % 2)
    # A malformed record: no readable retryd_original_topic.
    seed(bootstrap, env.failed, [(b"bad", b"{}", [("retryd_dead_reason", b"malformed")])], 0)
    return env


@pytest.fixture(scope="module")
def sidecar(deployment: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    log = tmp_path_factory.mktemp("sidecar-api-log") / "sidecar.log"
    proc = SidecarProcess(deployment, log).start()
    try:
        yield proc
    finally:
        proc.stop()


ROUTES = [
    ("GET", "/v1/failed"),
    ("GET", "/v1/failed/0/0"),
    ("POST", "/v1/failed/0/0/replay"),
    ("POST", "/v1/replays"),
    ("GET", "/v1/replays"),
    ("GET", "/v1/replays/job-x"),
    ("DELETE", "/v1/replays/job-x"),
]


def test_every_v1_route_needs_the_token(sidecar: SidecarProcess) -> None:
    with sidecar.client(token=None) as anon, sidecar.client(token="wrong") as wrong:
        for method, path in ROUTES:
            r = anon.request(method, path, json={})
            assert r.status_code == 401, (method, path, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert "Authorization" in r.json()["detail"]
            r = wrong.request(method, path, json={})
            assert r.status_code in (401, 403), (method, path, r.text)
            r = anon.request(method, path, headers={"Authorization": f"Basic {TOKEN}"})
            assert r.status_code == 401
        assert anon.get("/healthz").status_code == 200
        assert anon.get("/metrics").status_code == 200


def test_no_token_configured_disables_v1(deployment: Env, tmp_path: Path) -> None:
    env = Env(
        deployment.bootstrap,
        tmp_path / "state",
        main=deployment.main,
        other=deployment.other,
        group=deployment.group,
        token=None,
    )
    with SidecarProcess(env, tmp_path / "sidecar.log") as proc, proc.client() as client:
        for method, path in ROUTES:
            r = client.request(method, path, json={})
            assert r.status_code == 503, (method, path, r.text)
            assert r.json()["detail"].startswith("disabled: no api_token configured")
        assert client.get("/healthz").status_code == 200


def _all_pages(client, limit: int, **params) -> list[dict]:  # type: ignore[no-untyped-def]
    items: list[dict] = []
    cursor = None
    for _ in range(100):
        query = {"limit": limit, **params, **({"cursor": cursor} if cursor else {})}
        r = client.get("/v1/failed", params=query)
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["items"]) <= limit
        items.extend(body["items"])
        cursor = body["next_cursor"]
        if not body["has_more"]:
            return items
    raise AssertionError("pagination did not end")


def test_browse_pages_and_filters(sidecar: SidecarProcess, deployment: Env) -> None:
    with sidecar.client() as client:
        everything = _all_pages(client, 5)
        coords = [i["coordinate"] for i in everything]
        assert len(coords) == N + 1 and len(set(coords)) == N + 1
        by_key = {i["key"]["data"]: i for i in everything}
        assert by_key["k1"]["retryd"]["retryd_error_class"] == "ValueError"
        assert by_key["k1"]["retryd"]["retry_number"] == 3
        assert by_key["k1"]["headers"] == [
            {"name": "trace", "encoding": "utf-8", "data": "t1", "size": 2, "truncated": False}
        ]
        assert by_key["k5"]["value"]["encoding"] == "base64"
        assert base64.b64decode(by_key["k5"]["value"]["data"]) == BINARY
        assert by_key["k6"]["value"]["truncated"] and by_key["k6"]["value"]["size"] == 5000
        assert len(by_key["k6"]["value"]["data"]) == 1024

        def count(**params) -> int:  # type: ignore[no-untyped-def]
            return len(_all_pages(client, 3, **params))

        assert count(original_topic=deployment.other) == 8
        assert count(original_topic=deployment.main, error_class="ValueError") == 8
        assert count(error_class="ValueError") == 12
        assert count(dead_reason="non_retryable") == 6
        assert count(dead_reason="malformed") == 1
        assert count(key="k7") == 1
        assert count(key="k7", key_base64=base64.b64encode(b"k7").decode()) == 1
        assert count(key="k7", key_base64=base64.b64encode(b"k8").decode()) == 0
        assert count(key_base64=base64.b64encode(b"k8").decode()) == 1
        assert count(partition=1) == 12
        assert count(since_ms=0) == N + 1
        stamps = sorted(i["timestamp"] for i in everything)
        assert count(until_ms=stamps[0]) == 0
        assert count(since_ms=stamps[-1] + 1) == 0
        assert count(since_ms=stamps[0], until_ms=stamps[-1] + 1) == N + 1
        # ISO-8601 and relative forms, like the command line's --since/--until
        assert count(since="1h") == N + 1
        assert count(since="2h ago", until="now") == N + 1
        assert count(until="2001-09-09T01:46:40Z") == 0
        assert count(since="2001-09-09") == N + 1


def test_one_record(sidecar: SidecarProcess, deployment: Env) -> None:
    with sidecar.client() as client:
        r = client.get("/v1/failed/0/3", params={"preview_bytes": 100})
        assert r.status_code == 200, r.text
        rec = r.json()
        assert rec["coordinate"] == f"{deployment.failed}/0/3"
        assert rec["key"]["data"] == "k6" and rec["value"]["truncated"]
        assert rec["value"]["data"] == "x" * 100
        assert rec["retryd"]["retryd_dead_reason"] == "exhausted"
        assert client.get("/v1/failed/0/999").status_code == 404
        r = client.get("/v1/failed/7/0")
        assert r.status_code == 404 and "no partition 7" in r.json()["detail"]


def test_replay_one_then_409_then_force_and_ledger_survives_restart(
    sidecar: SidecarProcess, deployment: Env
) -> None:
    with sidecar.client() as client:
        # k2 lives at failed partition 0 offset 1 (partition 0 holds the even i, in order).
        rec = client.get("/v1/failed/0/1").json()
        assert rec["key"]["data"] == "k2" and rec["replayed"] is None
        r = client.post("/v1/failed/0/1/replay")
        assert r.status_code == 200, r.text
        first = r.json()
        assert first["target_topic"] == deployment.main and first["target_partition"] == 0
        assert not first["forced"] and first["previous"] is None
        r = client.post("/v1/failed/0/1/replay")
        assert r.status_code == 409, r.text
        assert "already replayed" in r.json()["detail"]
        assert client.get("/v1/failed/0/1").json()["replayed"]["replay_id"] == first["replay_id"]
    copies = read_topic(deployment.bootstrap, deployment.main, expect=1)
    assert len(copies) == 1
    copy = copies[0]
    assert copy.key == b"k2" and copy.value == json.dumps({"i": 2}).encode()
    names = [k for k, _ in copy.headers]
    assert names == ["trace", "retryd_replay_id", "retryd_replayed_from"], names
    assert copy.header("retryd_replayed_from") == f"{deployment.failed}/0/1".encode()
    assert copy.header("retryd_replay_id") == first["replay_id"].encode()

    sidecar.stop()
    sidecar.start()
    with sidecar.client() as client:
        r = client.post("/v1/failed/0/1/replay")
        assert r.status_code == 409, "the ledger must survive a sidecar restart: " + r.text
        r = client.post("/v1/failed/0/1/replay", params={"force": "true"})
        assert r.status_code == 200, r.text
        assert r.json()["forced"] and r.json()["previous"]["replay_id"] == first["replay_id"]
        r = client.post("/v1/failed/0/2/replay", json={"target": "not-allowed-topic"})
        assert r.status_code == 403 and "allow-list" in r.json()["detail"]
        # The malformed record has no original topic: it needs an explicit target.
        r = client.post(f"/v1/failed/0/{N // 2}/replay")
        assert r.status_code == 422, r.text
        r = client.post(f"/v1/failed/0/{N // 2}/replay", json={"target": deployment.other})
        assert r.status_code == 200, r.text
        assert client.post("/v1/failed/0/999/replay").status_code == 404
    assert len(read_topic(deployment.bootstrap, deployment.main, expect=2)) == 2


def test_invalid_requests_get_readable_4xx(sidecar: SidecarProcess) -> None:
    with sidecar.client() as client:
        cases = [
            ("GET", "/v1/failed", {"params": {"limit": 0}}, 422, "limit"),
            ("GET", "/v1/failed", {"params": {"dead_reason": "bored"}}, 422, "dead_reason"),
            ("GET", "/v1/failed", {"params": {"cursor": "!!!"}}, 400, "cursor"),
            ("GET", "/v1/failed", {"params": {"cursor": "eyI5IjowfQ"}}, 400, "partition 9"),
            ("GET", "/v1/failed", {"params": {"key_base64": "@@"}}, 422, "key_base64"),
            ("GET", "/v1/failed", {"params": {"since": "yesterday"}}, 422, "since"),
            ("GET", "/v1/failed", {"params": {"until": "1h", "until_ms": 5}}, 400, "not both"),
            ("GET", "/v1/failed", {"params": {"since": "2024-13-01"}}, 400, "ISO-8601"),
            ("POST", "/v1/replays", {"json": {"filter": {"since": "soon"}}}, 422, "since"),
            (
                "POST",
                "/v1/replays",
                {"content": b"r\xff", "headers": {"content-type": "application/json"}},
                422,
                "not valid JSON",
            ),
            ("PUT", "/v1/replays", {}, 405, "not allowed"),
            ("GET", "/v1/failed/-1/0", {}, 422, "partition"),
            ("GET", f"/v1/failed/0/{2**63}", {}, 422, "offset"),
            ("POST", "/v1/replays", {"json": {"bogus": 1}}, 422, "bogus"),
            ("POST", "/v1/replays", {"json": {"max_per_second": 0}}, 422, "max_per_second"),
            ("POST", "/v1/replays", {"content": b"{not json"}, 422, "JSON object"),
            (
                "POST",
                "/v1/replays",
                {"content": b"{not json", "headers": {"content-type": "application/json"}},
                422,
                "invalid JSON",
            ),
            ("POST", "/v1/replays", {"json": {"target": "bad topic!"}}, 422, "target"),
            ("POST", "/v1/replays", {"json": {"target": "elsewhere"}}, 403, "allow-list"),
            ("GET", "/v1/replays/job-missing", {}, 404, "no replay job"),
            ("POST", "/v1/failed/0/0/replay", {"json": {"force": "maybe"}}, 422, "force"),
        ]
        for method, path, kwargs, status, words in cases:
            r = client.request(method, path, **kwargs)
            assert r.status_code == status, (method, path, kwargs, pretty(r.json()))
            body = r.json()
            assert set(body) == {"error", "detail", "problems"}
            if status == 405:
                assert r.headers["allow"] == "GET, POST"
            assert words.lower() in (body["detail"] + " ".join(body["problems"])).lower(), body
