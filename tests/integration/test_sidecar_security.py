"""Issue 9, Security and item 8, against a real broker and a real `retryd sidecar`:

- scoped tokens (read: browse and get; replay: also replay and jobs), 401 without a valid
  token, 403 without the scope, both counted in /metrics;
- two tokens valid at once (rotation), tokens from files, tokens under 32 bytes refused at
  start-up without being echoed;
- one audit line per replay naming the token's id, never the token;
- a global replay rate ceiling across the jobs of one sidecar;
- retryd's own topics and `__*` topics are never replay targets, whatever the allow-list says;
- a replay ledger that is not compacted stops the sidecar with a clear error;
- HTTPS with a certificate and key.
"""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from retryd.kafka.embedded import free_port
from tests.integration.sidecar_support import (
    REPO,
    TOKEN,
    Env,
    SidecarProcess,
    failed_headers,
    pretty,
    seed,
    wait_job,
)
from tests.support import create_topics, read_topic, wait_for

READ = "grafana-read-token-0123456789abcdef-xyz"
OPS = "ops-replay-token-from-a-file-0123456789"
CEILING = 100  # replay_max_per_second of every sidecar here
BULK = 200  # records in each half of the bulk set (of the rate ceiling's own deployment)


def security_env(bootstrap: str, base: Path) -> Env:
    """A deployment with the three tokens (legacy, read, ops from a file), the rate ceiling and
    an allow-list naming everything a careless one could; its topics created."""
    tokens_file = base / "tokens"
    tokens_file.write_text(f"# mounted from a Secret\nops:replay:{OPS}\n")
    env = Env(bootstrap, base / "state")
    tier = f"{env.group}.retry_1s"
    env.extra = {
        "RETRYD_API_TOKENS": f"grafana:read:{READ}",
        "RETRYD_API_TOKENS_FILE": str(tokens_file),
        "RETRYD_REPLAY_MAX_PER_SECOND": str(CEILING),
        # Everything a careless allow-list could name: still refused.
        "RETRYD_REPLAY_ALLOWLIST": ",".join(
            [env.main, env.other, env.failed, env.ledger, tier, "__consumer_offsets"]
        ),
    }
    return env.create(failed_partitions=1)


@pytest.fixture(scope="module")
def deployment(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Env:
    """Shared by the tests that each touch their own records of it (0-1, 2 and 4)."""
    env = security_env(bootstrap, tmp_path_factory.mktemp("sidecar-security"))
    records = [(f"k{i}".encode(), f"v{i}".encode(), failed_headers(env.main)) for i in range(4)]
    # A hostile record that names failed_topic itself as its original topic.
    records.append((b"loop", b"v", failed_headers(env.failed)))
    seed(bootstrap, env.failed, records)
    return env


@pytest.fixture(scope="module")
def sidecar(deployment: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    log = tmp_path_factory.mktemp("sidecar-security-log") / "sidecar.log"
    proc = SidecarProcess(deployment, log).start()
    try:
        yield proc
    finally:
        proc.stop()


def _auth_failures(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        s.labels["reason"]: s.value
        for fam in text_string_to_metric_families(text)
        if fam.name == "retryd_http_auth_failures"
        for s in fam.samples
    }


def test_scopes_rotation_and_counted_failures(sidecar: SidecarProcess) -> None:
    before = _auth_failures(sidecar.url)
    with sidecar.client(READ) as reader:
        assert reader.get("/v1/failed").status_code == 200
        assert reader.get("/v1/failed/0/0").status_code == 200
        assert reader.get("/v1/replays").status_code == 200
        assert reader.get("/v1/replays/job-x").status_code == 404
        for method, path in [
            ("POST", "/v1/failed/0/0/replay"),
            ("POST", "/v1/replays"),
            ("DELETE", "/v1/replays/job-x"),
        ]:
            r = reader.request(method, path, json={})
            assert r.status_code == 403, (method, path, r.text)
            assert r.json()["error"] == "forbidden"
            assert "has scope read" in r.json()["detail"] and "needs scope replay" in r.text
            assert 'error="insufficient_scope"' in r.headers["www-authenticate"]
    # Two replay tokens at once (the legacy one and one from the file): rotation.
    with sidecar.client(OPS) as ops, sidecar.client(TOKEN) as legacy:
        assert ops.post("/v1/failed/0/0/replay").status_code == 200
        assert legacy.post("/v1/failed/0/1/replay").status_code == 200
        assert ops.get("/v1/failed/0/1").json()["replayed"]["by"].startswith("sidecar:sha256:")
    with sidecar.client("x" * 40) as wrong, sidecar.client(None) as anon:
        assert wrong.get("/v1/failed").status_code == 401
        assert anon.get("/v1/failed").status_code == 401
    after = _auth_failures(sidecar.url)
    assert after["insufficient_scope"] - before.get("insufficient_scope", 0) == 3, after
    assert after["invalid_token"] - before.get("invalid_token", 0) == 1, after
    assert after["missing_token"] - before.get("missing_token", 0) == 1, after


def test_reserved_topics_are_never_targets(sidecar: SidecarProcess, deployment: Env) -> None:
    tier = f"{deployment.group}.retry_1s"
    with sidecar.client(OPS) as ops:
        for target in (deployment.failed, deployment.ledger, tier, "__consumer_offsets"):
            r = ops.post("/v1/failed/0/2/replay", json={"target": target})
            assert r.status_code == 403, (target, r.text)
            body = r.json()
            assert body["error"] == "target_reserved", body
            assert "whatever replay_allowlist says" in body["detail"], body
            r = ops.post("/v1/replays", json={"target": target, "dry_run": True})
            assert r.status_code == 403 and r.json()["error"] == "target_reserved", r.text
        # The hostile record's own original topic is failed_topic: refused as a default too.
        r = ops.post("/v1/failed/0/4/replay")
        assert r.status_code == 403 and deployment.failed in r.json()["detail"], r.text
        job = wait_job(
            ops,
            ops.post("/v1/replays", json={"filter": {"original_topic": deployment.failed}}).json()[
                "id"
            ],
        )
    assert job["skipped_reasons"] == {"target_reserved": 1} and job["replayed"] == 0, pretty(job)
    failed = read_topic(deployment.bootstrap, deployment.failed)
    assert all(r.header("retryd_replay_id") is None for r in failed), "a copy in failed_topic"


def test_rate_ceiling_across_jobs_and_audit_lines(bootstrap: str, tmp_path: Path) -> None:
    """Its own deployment, sidecar and log: every audit line it checks comes from what it
    did (two single replays, two jobs), whichever tests ran before it."""
    env = security_env(bootstrap, tmp_path)
    singles = [(b"one", b"v", failed_headers(env.main)), (b"two", b"v", failed_headers(env.main))]
    bulk = [
        (f"b{i}".encode(), b"v", failed_headers(env.other, error_class=f"Bulk{i % 2}"))
        for i in range(2 * BULK)
    ]
    seed(bootstrap, env.failed, [*singles, *bulk])
    with SidecarProcess(env, tmp_path / "sidecar.log") as sidecar:
        with sidecar.client(OPS) as ops, sidecar.client(TOKEN) as legacy:
            assert ops.post("/v1/failed/0/0/replay").status_code == 200
            assert legacy.post("/v1/failed/0/1/replay").status_code == 200
            started = time.monotonic()
            ids = [
                ops.post(
                    "/v1/replays",
                    json={"filter": {"error_class": f"Bulk{half}"}, "max_per_second": 5000},
                ).json()["id"]
                for half in (0, 1)
            ]
            jobs = [wait_job(ops, job_id, timeout=60) for job_id in ids]
            took = time.monotonic() - started
        for job in jobs:
            assert job["state"] == "completed" and job["replayed"] == BULK, pretty(job)
            assert job["requested_by"] == "ops"
        # 2 x BULK replays under one ceiling of CEILING/s (each job alone would allow 5000/s).
        assert took >= 2 * BULK / CEILING * 0.9, took
        print(f"two jobs, {2 * BULK} replays at a {CEILING}/s ceiling: {took:.2f}s")
        assert len(read_topic(env.bootstrap, env.other, expect=2 * BULK)) == 2 * BULK

        def audit_lines() -> list[str] | None:
            lines = [x for x in sidecar.log_path.read_text().splitlines() if " retryd.audit: " in x]
            finished = any(f"job_finished actor=ops job={ids[1]}" in x for x in lines)
            return lines if finished else None

        audit = wait_for(audit_lines, 30, 0.1, "the second job's job_finished audit line")
        log = sidecar.log_path.read_text()
    for secret in (READ, OPS, TOKEN):
        assert secret not in log
    per_record = [line for line in audit if " replay actor=ops " in line and "job=job-" in line]
    assert len(per_record) == 2 * BULK, len(per_record)
    assert any(f"job_created actor=ops job={ids[0]}" in line for line in audit), audit[:5]
    single = [line for line in audit if " replay " in line and "job=-" in line]
    assert len(single) == 2, single
    assert any(
        f"actor=ops record={env.failed}/0/0 target={env.main}/" in line for line in single
    ), single
    assert any(
        "actor=sha256:" in line and f"record={env.failed}/0/1 " in line for line in single
    ), single


def _sidecar_start_fails(env: Env, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "retryd", "sidecar"],
        env=env.env(free_port()),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_weak_tokens_refused_at_start(tmp_path: Path) -> None:
    env = Env(f"127.0.0.1:{free_port()}", tmp_path / "state", token="short-s3cret")
    (tmp_path / "token").write_text("another-short-one\n")
    env.extra = {
        "RETRYD_API_TOKENS": "ci:read:tiny-s3cret,ci2:admin:" + "z" * 40,
        "RETRYD_API_TOKEN_FILE": str(tmp_path / "token"),
    }
    out = _sidecar_start_fails(env, tmp_path)
    assert out.returncode == 2, out.stderr
    assert "retryd: invalid configuration:" in out.stderr
    assert "  - api_token: the token is 12 bytes; at least 32 are required" in out.stderr
    assert "  - api_tokens[0] (ci): the token is 11 bytes" in out.stderr
    assert "  - api_tokens[1] (ci2): the scope must be read, replay or circuit" in out.stderr
    assert "  - api_token_file: the token is 17 bytes" in out.stderr
    for secret in ("short-s3cret", "tiny-s3cret", "another-short-one", "z" * 40):
        assert secret not in out.stderr + out.stdout


def test_ledger_that_is_not_compacted_is_refused(bootstrap: str, tmp_path: Path) -> None:
    env = Env(bootstrap, tmp_path / "state")
    create_topics(bootstrap, [env.ledger], 1, {"cleanup.policy": "delete"})
    out = _sidecar_start_fails(env, tmp_path)
    assert out.returncode == 1, out.stderr
    assert (
        f"retryd: ledger topic {env.ledger} has cleanup.policy=delete, expected compact"
        in out.stderr
    ), out.stderr


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "retryd-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_https(bootstrap: str, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    env = Env(bootstrap, tmp_path / "state").create(failed_partitions=1)
    env.extra = {
        "RETRYD_SIDECAR_TLS_CERT_FILE": str(cert),
        "RETRYD_SIDECAR_TLS_KEY_FILE": str(key),
    }
    with SidecarProcess(env, tmp_path / "sidecar.log", verify=cert) as sidecar:
        assert sidecar.url.startswith("https://")
        with sidecar.client() as client:
            assert client.get("/healthz").status_code == 200
            r = client.get("/v1/failed")
            assert r.status_code == 200 and r.json()["items"] == [], r.text
        with pytest.raises(httpx.HTTPError):  # plain HTTP is not served on the TLS port
            httpx.get(f"http://127.0.0.1:{sidecar.port}/healthz", timeout=5).raise_for_status()
        with pytest.raises(httpx.ConnectError):  # and the certificate is what we gave it
            httpx.get(sidecar.url + "/healthz", timeout=5, verify=True)
    bad = Env(bootstrap, tmp_path / "state2")
    bad.extra = {
        "RETRYD_SIDECAR_TLS_CERT_FILE": str(cert),
        "RETRYD_SIDECAR_TLS_KEY_FILE": str(cert),
    }
    out = _sidecar_start_fails(bad, tmp_path)
    assert out.returncode == 2 and "cannot load them" in out.stderr, out.stderr
    half = Env(bootstrap, tmp_path / "state3")
    half.extra = {"RETRYD_SIDECAR_TLS_CERT_FILE": str(cert)}
    out = _sidecar_start_fails(half, tmp_path)
    assert out.returncode == 2 and "must be set together" in out.stderr, out.stderr
