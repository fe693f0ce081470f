"""The pure part of strict per-key order: entry encoding, the state partition, decisions and
the in-memory view of the key-state topic."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retryd.policy import key_order as ko
from retryd.policy.key_order import ChainView, Entry, OnDeadLetter, Verdict, decide

NOW = 1_000_000


@pytest.mark.parametrize(
    ("data", "expected"),
    [  # Kafka's own test vectors (UtilsTest.testMurmur2)
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_is_kafkas(data: bytes, expected: int) -> None:
    assert ko.murmur2(data) == expected


@given(
    group=st.text(min_size=1, max_size=20),
    topic=st.text(min_size=1, max_size=20),
    key=st.binary(max_size=64),
    offset=st.integers(min_value=0, max_value=2**63 - 1),
)
def test_entry_keys_round_trip_and_share_the_chain_partition(
    group: str, topic: str, key: bytes, offset: int
) -> None:
    chain = ko.chain_id(group, topic, key)
    data = ko.entry_key(chain, offset)
    assert ko.split_entry_key(data) == (chain, offset)
    ident = ko.decode_entry_key(data)
    assert (ident.key, ident.offset) == (key, offset)
    assert ident.chain == chain
    assert 0 <= ko.state_partition(chain, 7) < 7


def test_chains_are_binary_safe() -> None:
    # a key that contains what would be a separator in a text encoding
    a = ko.chain_id("g", "t", b"a|b")
    b = ko.chain_id("g", "t|a", b"b")
    assert a != b
    assert ko.chain_id("g", "t", b"") != ko.chain_id("g", "t", b"\x00")


@pytest.mark.parametrize("bad", [b"", b"xx", b"rk1\x00", b"rk1" + b"\x00" * 3, b"nope" * 10])
def test_garbage_is_not_an_entry(bad: bytes) -> None:
    with pytest.raises(ValueError):
        ko.decode_entry_key(bad)
    view = ChainView()
    assert not view.apply(bad, b"{}")
    assert view.bad == 1


def test_entry_values() -> None:
    raw = ko.encode_entry(5, ko.KIND_PARKED)
    assert ko.decode_entry(3, raw) == Entry(3, 5, "parked")
    for bad in (b"[]", b'{"added_ms": "x", "kind": "failed"}', b'{"added_ms": 1, "kind": "?"}'):
        with pytest.raises(ValueError):
            ko.decode_entry(1, bad)
    with pytest.raises(ValueError):
        ko.encode_entry(1, "other")


def entries(*items: tuple[int, str] | int, age_ms: int = 0) -> dict[int, Entry]:
    out = {}
    for item in items:
        offset, kind = (item, ko.KIND_FAILED) if isinstance(item, int) else item
        out[offset] = Entry(offset, NOW - age_ms, kind)
    return out


def test_a_main_record_runs_when_nothing_lower_is_in_the_chain() -> None:
    assert decide(None, 5, NOW, is_copy=False) is Verdict.RUN
    assert decide({}, 5, NOW, is_copy=False) is Verdict.RUN
    assert decide(entries(7, 9), 5, NOW, is_copy=False) is Verdict.RUN
    # its own entry (consumed again after a crash) does not block it
    assert decide(entries(5), 5, NOW, is_copy=False) is Verdict.RUN


def test_a_main_record_behind_a_chain_entry_is_parked() -> None:
    assert decide(entries(3), 5, NOW, is_copy=False) is Verdict.PARK
    assert decide(entries((3, ko.KIND_PARKED), 5), 5, NOW, is_copy=False) is Verdict.PARK


def test_a_copy_runs_only_as_the_head_with_its_own_entry_seen() -> None:
    assert decide(entries(5, 7), 5, NOW, is_copy=True) is Verdict.RUN
    assert decide(entries(5, 7), 7, NOW, is_copy=True) is Verdict.PARK
    # the view has not read its add yet: parked again (a lag only delays)
    assert decide(entries(3), 5, NOW, is_copy=True) is Verdict.PARK
    assert decide(None, 5, NOW, is_copy=True) is Verdict.PARK
    # its entry was removed: a duplicate of a finished chain entry
    assert decide(None, 5, NOW, is_copy=True, removed=True) is Verdict.DUPLICATE


def test_the_cap_releases_followers_of_an_old_head() -> None:
    cap = 60_000
    old = {3: Entry(3, NOW - cap - 1, ko.KIND_FAILED), 5: Entry(5, NOW, ko.KIND_PARKED)}
    assert decide(old, 5, NOW, is_copy=True, max_blocked_ms=cap) is Verdict.RUN_RELEASED
    assert decide(old, 5, NOW, is_copy=True) is Verdict.PARK  # no cap: blocked for ever
    # one young blocker is enough to block
    young = {**old, 4: Entry(4, NOW, ko.KIND_PARKED)}
    assert decide(young, 5, NOW, is_copy=True, max_blocked_ms=cap) is Verdict.PARK
    # a copy whose own entry never shows runs once parked longer than the cap
    assert (
        decide(None, 5, NOW, is_copy=True, parked_since_ms=NOW - cap - 1, max_blocked_ms=cap)
        is Verdict.RUN_RELEASED
    )
    assert (
        decide(None, 5, NOW, is_copy=True, parked_since_ms=NOW, max_blocked_ms=cap) is Verdict.PARK
    )


def test_followers_of_a_dead_marker_are_dead_lettered() -> None:
    chain = entries((3, ko.KIND_DEAD), (5, ko.KIND_PARKED))
    assert decide(chain, 5, NOW, is_copy=True) is Verdict.DEAD
    assert decide(chain, 7, NOW, is_copy=False) is Verdict.DEAD
    assert decide(chain, 2, NOW, is_copy=False) is Verdict.RUN
    # markers alone never block: the next record runs (and its end removes them)
    markers = entries((3, ko.KIND_DEAD))
    assert decide(markers, 7, NOW, is_copy=False) is Verdict.RUN
    assert ko.after_success({**markers, **entries(7)}, 7) == [3]


def test_what_a_dead_letter_writes() -> None:
    release, dead = OnDeadLetter.RELEASE, OnDeadLetter.DEAD_LETTER
    alone = entries(5)
    assert ko.after_dead_letter(alone, 5, release) == (None, [])
    assert ko.after_dead_letter(alone, 5, dead) == (None, [])  # no follower: nothing to poison
    chain = entries(5, (7, ko.KIND_PARKED))
    assert ko.after_dead_letter(chain, 5, release) == (None, [])
    assert ko.after_dead_letter(chain, 5, dead) == (ko.KIND_DEAD, [])
    # the last follower behind a marker removes it
    behind = entries((5, ko.KIND_DEAD), (7, ko.KIND_PARKED))
    assert ko.after_dead_letter(behind, 7, dead) == (None, [5])
    more = entries((5, ko.KIND_DEAD), (7, ko.KIND_PARKED), (9, ko.KIND_PARKED))
    assert ko.after_dead_letter(more, 7, dead) == (None, [])
    assert ko.after_success(behind, 7) == [5]
    assert ko.after_success(more, 7) == []


def test_the_view_applies_adds_and_tombstones() -> None:
    view = ChainView(max_entries=2, max_removed=2)
    chain = ko.chain_id("g", "t", b"k")
    assert view.apply(ko.entry_key(chain, 5), ko.encode_entry(NOW - 2000, ko.KIND_FAILED))
    assert view.apply(ko.entry_key(chain, 7), ko.encode_entry(NOW, ko.KIND_PARKED))
    assert view.full
    assert sorted(view.get(chain) or {}) == [5, 7]
    assert view.stats(NOW) == (1, 2, 2.0)
    view.apply(ko.entry_key(chain, 5), None)
    assert view.removed(chain, 5) and not view.full
    # applied twice (a view read again): idempotent
    view.apply(ko.entry_key(chain, 5), None)
    view.apply(ko.entry_key(chain, 7), None)
    assert view.get(chain) is None and view.entries == 0
    assert view.stats(NOW) == (0, 0, 0.0)
    other = ko.chain_id("g", "t", b"other")
    view.remove(other, 1)
    assert not view.removed(chain, 5)  # bounded memory of removals: the oldest goes first
    # re-added (a record consumed again after its entry was removed): live again
    view.apply(ko.entry_key(chain, 7), ko.encode_entry(NOW, ko.KIND_FAILED))
    assert not view.removed(chain, 7) and view.entries == 1


def test_catching_up() -> None:
    view = ChainView()
    assert view.caught_up({})
    assert not view.caught_up({0: 3})
    view.positions[0] = 3
    assert view.caught_up({0: 3, 1: 0})


def test_parked_header() -> None:
    assert ko.parked_since(None) is None
    assert ko.parked_since(b"123") == 123
    with pytest.raises(Exception, match="retryd_parked"):
        ko.parked_since(b"x")
