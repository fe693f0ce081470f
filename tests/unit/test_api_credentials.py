"""API tokens: sources, scopes, ids, refusal of weak or clashing tokens, no token in errors.

(The HTTP behaviour, 401/403 per route and the metrics, is tested against a real server in
tests/integration/test_sidecar_security.py.)"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from retryd.api.auth import required_scope
from retryd.api.credentials import bearer_token, fingerprint, load_credentials
from retryd.config import load_settings
from retryd.errors import ConfigError

READ = "r" * 40
REPLAY = "p" * 40
OTHER = "o" * 32


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RETRYD_"):
            monkeypatch.delenv(name)


def problems(**overrides: object) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_credentials(load_settings(**overrides))
    return info.value.problems


def test_bearer_parsing() -> None:
    assert bearer_token(b"Bearer abc") == b"abc"
    assert bearer_token(b"bearer  abc ") == b"abc"
    assert bearer_token(b"Basic abc") is None
    assert bearer_token(b"Bearer ") is None
    assert bearer_token(b"abc") is None


def test_scopes_ids_and_rotation(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(OTHER + "\n")  # as a Kubernetes Secret is mounted: newline dropped
    entries = tmp_path / "tokens"
    entries.write_text(f"# rotation: both valid\n\nnew:replay:{'n' * 32}\n")
    creds = load_credentials(
        load_settings(
            api_tokens=f"grafana:read:{READ},ops:replay:{REPLAY}",
            api_tokens_file=entries,
            api_token_file=token_file,
        )
    )
    by_id = {t.id: t for t in creds.tokens}
    assert set(by_id) == {"grafana", "ops", "new", fingerprint(OTHER)}
    assert fingerprint(OTHER) == "sha256:" + hashlib.sha256(OTHER.encode()).hexdigest()[:8]
    assert by_id[fingerprint(OTHER)].scope == "replay"  # the legacy single token
    assert creds.identify(READ.encode()) is by_id["grafana"]
    assert creds.identify(("n" * 32).encode()) is by_id["new"]
    assert creds.identify(OTHER.encode()) is by_id[fingerprint(OTHER)]
    assert creds.identify(b"x" * 40) is None
    assert creds.authenticate(None) == (None, "missing_token")
    assert creds.authenticate(b"Basic " + READ.encode()) == (None, "missing_token")
    assert creds.authenticate(b"Bearer nope") == (None, "invalid_token")
    token, _ = creds.authenticate(b"Bearer " + READ.encode())
    assert token is not None and token.allows("read") and not token.allows("replay")
    assert by_id["ops"].allows("read") and by_id["ops"].allows("replay")
    assert READ not in repr(creds.tokens)
    assert required_scope("GET") == required_scope("HEAD") == "read"
    assert {required_scope(m) for m in ("POST", "DELETE", "PUT", "PATCH", "OPTIONS")} == {"replay"}


def test_no_token_means_disabled() -> None:
    assert not load_credentials(load_settings()).enabled


def test_weak_malformed_and_clashing_tokens_are_refused_without_echoing_them(
    tmp_path: Path,
) -> None:
    short = "short-s3cret"
    lines = problems(
        api_token=short,
        api_tokens=f"a:read:{short},b:admin:{READ},bad name:read:{READ},noscope{OTHER}",
        api_tokens_file=tmp_path / "missing",
    )
    text = "\n".join(lines)
    assert short not in text and READ not in text and OTHER not in text
    assert "api_token: the token is 12 bytes; at least 32 are required" in lines
    assert "api_tokens[0] (a): the token is 12 bytes; at least 32 are required" in lines
    assert "api_tokens[1] (b): the scope must be read, replay or circuit" in lines
    assert any(line.startswith("api_tokens[2]: the name must be") for line in lines)
    assert "api_tokens[3]: expected name:scope:token (scope read, replay or circuit)" in lines
    assert f"api_tokens_file: {tmp_path / 'missing'} does not exist" in lines
    lines = problems(api_tokens=f"a:read:{READ},b:replay:{READ},a:replay:{REPLAY}")
    assert "the tokens named a and b are the same token" in lines
    assert "two different tokens are named a: names must be unique" in lines
    spaced = tmp_path / "spaced"
    spaced.write_text("with spaces inside the token value here\n")
    assert problems(api_token_file=spaced) == [
        "api_token_file: the token must be visible ASCII characters only (no spaces)"
    ]
