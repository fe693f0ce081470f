"""Bearer token parsing and comparison (the HTTP behaviour is tested against a real server)."""

from __future__ import annotations

from retryd.api.auth import token_matches


def test_token_matches() -> None:
    assert token_matches(b"Bearer abc", b"abc")
    assert token_matches(b"bearer abc", b"abc")
    assert not token_matches(b"Bearer abd", b"abc")
    assert not token_matches(b"Bearer ", b"abc")
    assert not token_matches(b"Basic abc", b"abc")
    assert not token_matches(b"abc", b"abc")
    assert not token_matches(None, b"abc")
    assert not token_matches(b"", b"abc")
    assert not token_matches("Bearer \u00e9".encode(), b"abc")
