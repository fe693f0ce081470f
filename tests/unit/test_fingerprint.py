"""Error message fingerprints: variable parts out, one template per failure mode (pure logic)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retryd.policy.fingerprint import MAX_FINGERPRINT_CHARS, fingerprint, fingerprint_id


@pytest.mark.parametrize(
    ("message", "template"),
    [
        ("order 81723 not found", "order <num> not found"),
        ("timeout after 30.2s calling 10.0.3.7:8080", "timeout after <num>s calling <num>"),
        ("duplicate key 'a9f3' in table \"orders\"", "duplicate key <str> in table <str>"),
        ("user 123e4567-e89b-12d3-a456-426614174000 missing", "user <uuid> missing"),
        ("at 2024-05-01T10:00:00Z: failed", "at <time>: failed"),
        ("at 2024-05-01 10:00:00.123+02:00 failed", "at <time> failed"),
        ("ptr 0x7f3a, digest deadbeef42", "ptr <hex>, digest <hex>"),
        ("sha256 mismatch for order42", "sha<num> mismatch for order<num>"),
        ("ids [1, 2, 3] rejected", "ids [<num>] rejected"),
        ("ids [4] rejected", "ids [<num>] rejected"),
        ("ref ORD9F8A and a1b2c3", "ref <id> and <id>"),
        ("value -3.5e9 exceeds 512MB (75%)", "value <num> exceeds <num>MB (<num>%)"),
        ("GET /orders/123/items -> 503", "GET /orders/<num>/items -> <num>"),
        ("  many   spaces\n\tand lines ", "many spaces and lines"),
        ("no variable part", "no variable part"),
        ("", ""),
        (None, ""),
    ],
)
def test_templates(message: str | None, template: str) -> None:
    assert fingerprint(message) == template


# Slot values of one kind each (a slot filled with a number and one with a UUID are told apart).
KINDS = [
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: f"{f:.3f}"),
    st.uuids().map(str),
    st.binary(min_size=4, max_size=16).map(lambda b: "0x" + b.hex()),
    st.text("abcdefghijklmnopqrstuvwxyz0123456789 -", max_size=20).map(lambda t: f"'{t}'"),
    st.text("abcdefghijklmnopqrstuvwxyz0123456789 ", max_size=20).map(lambda t: f'"{t}"'),
    st.datetimes().map(lambda d: d.isoformat(timespec="seconds")),
]
SAME_KIND_PAIRS = st.one_of([st.tuples(kind, kind) for kind in KINDS])


@settings(max_examples=300, deadline=None)
@given(SAME_KIND_PAIRS)
def test_same_failure_mode_same_fingerprint(pair: tuple[str, str]) -> None:
    """Messages differing only in what fills the slots share one template."""
    a, b = pair
    template = "cannot charge order {} for customer {}: upstream said no"
    assert fingerprint(template.format(a, "17")) == fingerprint(template.format(b, "99"))
    assert fingerprint(f"lookup {a} failed") == fingerprint(f"lookup {b} failed")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_properties_of_any_message(message: str) -> None:
    fp = fingerprint(message)
    assert len(fp) <= MAX_FINGERPRINT_CHARS
    assert not any(c in "0123456789" for c in fp)  # every ASCII digit is gone
    assert fingerprint(fp) == fp  # a template is its own template


def test_a_million_distinct_messages_are_one_row() -> None:
    messages = {f"order {uuid.uuid4()} failed after {i} attempts" for i in range(20_000)}
    assert len(messages) == 20_000
    assert {fingerprint(m) for m in messages} == {"order <uuid> failed after <num> attempts"}


def test_ids_are_stable_and_include_the_class() -> None:
    key_error = fingerprint_id("KeyError", "missing <str>")
    assert key_error == fingerprint_id("KeyError", "missing <str>")
    assert key_error != fingerprint_id("ValueError", "missing <str>")
    assert len(fingerprint_id(None, "")) == 12
