"""Strict per-key order through the retry chain (``key_order = strict``): the pure part.

While a key has a record anywhere in the retry chain, later records of that key wait behind
it, so that per key the records are handled successfully in their original offset order,
across tiers, restarts, rebalances and process kills.

The state lives in a compacted Kafka topic (``key_state_topic``). It holds one record per
*chain entry*: a record of key K of main topic T that is in the chain (it failed, or it was
parked behind an earlier one). Its Kafka key is ``entry_key(group, T, K, origin_offset)``;
every entry of one chain (``chain_id(group, T, K)``) goes to one state partition
(``state_partition``: Kafka's murmur2 of the chain id), so the entries of a key are totally
ordered. An entry is written once (added, acks=all) and removed once (a tombstone) when its
record's chain ends (success, or dead letter); nothing is ever read-modified-written, so the
owner of the main partition (who adds) and the tier workers (who remove) never race on one
record.

Decisions (``decide``), taken by the worker that holds the record:

- a main-topic record runs when no entry of its chain has a lower origin offset; otherwise it
  is *parked*: its entry is added and a copy goes into the chain (first tier, ``retryd_parked``
  header, retry number unchanged);
- a tier copy runs when the worker's view holds the copy's *own* entry and no lower one;
  without its own entry it is either a duplicate of a chain entry already finished (the view
  saw its tombstone: dropped) or the view lags (parked again); with a lower entry it is parked
  again;
- a blocking entry older than the cap (``max_blocked_ms``) no longer blocks: the follower runs
  (``RUN_RELEASED``, counted), the blocking record keeps its own retries;
- with ``on_dead_letter = dead_letter`` a dead-lettered head that has followers leaves a
  ``dead`` entry (a marker) instead of a tombstone; a record behind a marker while the chain
  still has live entries is dead-lettered with reason ``blocked_by_dead_letter``; the last of
  them removes the marker, and a marker left behind (two followers dead-lettered at once each
  saw the other) is removed by the next record of the key, which runs: markers alone never
  block.

Seeing its own entry means seeing every earlier entry of the chain: adds are written only by
the main partition's owner, in offset order, each acknowledged before the next record of the
key is decided, all to the one state partition of the chain. A view lagging on removals only
delays (safe).
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from retryd.errors import HeaderError

PARKED = "retryd_parked"  # header of a parked copy: epoch ms of its first park (= headers.PARKED)
DEAD_BLOCKED = "blocked_by_dead_letter"  # followers of a dead-lettered head (by option)

KIND_FAILED = "failed"
KIND_PARKED = "parked"
KIND_DEAD = "dead"  # a dead-lettered head whose followers are dead-lettered too
KINDS = frozenset({KIND_FAILED, KIND_PARKED, KIND_DEAD})

_MAGIC = b"rk1"
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
MAX_NAME = 0xFFFF


class KeyOrder(enum.StrEnum):
    NONE = "none"
    STRICT = "strict"


class OnDeadLetter(enum.StrEnum):
    """What dead-lettering a blocking record does to the records of its key behind it."""

    RELEASE = "release"  # they run (the key is released)
    DEAD_LETTER = "dead_letter"  # they are dead-lettered too (blocked_by_dead_letter)


# ----------------------------------------------------------------------------- encoding
def chain_id(group: str, topic: str, key: bytes) -> bytes:
    """The binary-safe identity of one key's chain: every entry key starts with it."""
    g = group.encode("utf-8", errors="surrogatepass")
    t = topic.encode("utf-8", errors="surrogatepass")
    if len(g) > MAX_NAME or len(t) > MAX_NAME:
        raise ValueError("group or topic name too long for a key-state entry")
    return b"".join((_MAGIC, _U16.pack(len(g)), g, _U16.pack(len(t)), t, _I32.pack(len(key)), key))


def entry_key(chain: bytes, origin_offset: int) -> bytes:
    return chain + _I64.pack(origin_offset)


@dataclass(frozen=True, slots=True)
class EntryId:
    group: str
    topic: str
    key: bytes
    offset: int

    @property
    def chain(self) -> bytes:
        return chain_id(self.group, self.topic, self.key)


def decode_entry_key(data: bytes) -> EntryId:
    """The parts of an entry key; raises ValueError when it is not one."""
    if not data.startswith(_MAGIC):
        raise ValueError("not a key-state entry (magic)")
    pos = len(_MAGIC)
    try:
        (n,) = _U16.unpack_from(data, pos)
        pos += 2
        group = data[pos : pos + n].decode("utf-8", errors="surrogatepass")
        pos += n
        (n,) = _U16.unpack_from(data, pos)
        pos += 2
        topic = data[pos : pos + n].decode("utf-8", errors="surrogatepass")
        pos += n
        (n,) = _I32.unpack_from(data, pos)
        pos += 4
        if n < 0:
            raise ValueError("negative key length")
        key = data[pos : pos + n]
        pos += n
        if len(key) != n:
            raise ValueError("truncated key")
        (offset,) = _I64.unpack_from(data, pos)
        pos += 8
    except struct.error as exc:
        raise ValueError(f"truncated key-state entry: {exc}") from exc
    if pos != len(data):
        raise ValueError("trailing bytes after a key-state entry")
    return EntryId(group, topic, key, offset)


def split_entry_key(data: bytes) -> tuple[bytes, int]:
    """``(chain id, origin offset)`` of an entry key (validated)."""
    decode_entry_key(data)
    return data[:-8], _I64.unpack_from(data, len(data) - 8)[0]


@dataclass(frozen=True, slots=True)
class Entry:
    offset: int  # the record's origin offset on its main topic
    added_ms: int
    kind: str
    # where it came from: the origin's main partition (None in entries written before 0.x),
    # and the state record's own offset (-1: not known), which orders writes of one entry
    partition: int | None = None
    version: int = -1


ENTRY_MAX_BYTES = 256  # a state value is a tiny JSON object: anything bigger is not one


def encode_entry(added_ms: int, kind: str, partition: int | None = None) -> bytes:
    if kind not in KINDS:
        raise ValueError(f"unknown entry kind {kind!r}")
    doc: dict[str, object] = {"v": 1, "added_ms": added_ms, "kind": kind}
    if partition is not None:
        doc["p"] = partition
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_entry(offset: int, value: bytes, version: int = -1) -> Entry:
    """The entry a state record holds; raises ValueError on anything else (bounded: a value
    is a flat object of a few fields, so nothing deep or big is parsed)."""
    if len(value) > ENTRY_MAX_BYTES or value.count(b"{") > 1 or value.count(b"[") > 0:
        raise ValueError("a key-state value is a small flat JSON object")
    doc = json.loads(value)
    if not isinstance(doc, dict):
        raise ValueError("a key-state value is a JSON object")
    added, kind, part = doc.get("added_ms"), doc.get("kind"), doc.get("p")
    if not isinstance(added, int) or isinstance(added, bool) or kind not in KINDS:
        raise ValueError("a key-state value needs added_ms (int) and kind")
    if part is not None and (not isinstance(part, int) or isinstance(part, bool) or part < 0):
        raise ValueError("a key-state value's partition is a non-negative int")
    return Entry(offset, added, kind, part, version)


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``) as a signed int32."""
    m = 0x5BD1E995
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    full = length - length % 4
    for i in range(0, full, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    extra = length % 4
    if extra == 3:
        h ^= data[full + 2] << 16
    if extra >= 2:
        h ^= data[full + 1] << 8
    if extra >= 1:
        h ^= data[full]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def state_partition(chain: bytes, partitions: int) -> int:
    """The state partition of every entry of ``chain``: Kafka's default partitioner applied
    to the chain id (``toPositive(murmur2) % partitions``)."""
    if partitions < 1:
        raise ValueError("a state topic has at least one partition")
    return (murmur2(chain) & 0x7FFFFFFF) % partitions


# ----------------------------------------------------------------------------- decisions
class Verdict(enum.Enum):
    RUN = "run"
    RUN_RELEASED = "run_released"  # runs although blocked: every blocker is past the cap
    PARK = "park"  # (again) into the chain behind the blocking entry, or until the view shows it
    DUPLICATE = "duplicate"  # a copy of an entry whose chain already ended: dropped
    DEAD = "dead"  # behind a dead-lettered head (on_dead_letter = dead_letter)


def decide(
    entries: Mapping[int, Entry] | None,
    origin_offset: int,
    now_ms: int,
    *,
    is_copy: bool,
    removed: bool = False,
    parked_since_ms: int | None = None,
    max_blocked_ms: int | None = None,
    entered_ms: int | None = None,
    has_dead: bool = True,
) -> Verdict:
    """What to do with a record of a strict key about to run (module docstring).

    ``entries``: the chain's entries in the worker's view (None or empty: the key is free);
    ``removed``: the view saw this record's own entry removed; ``parked_since_ms``: when a
    parked copy was first parked (a copy whose own entry the view does not show is parked again
    at most until the cap, then it runs); ``entered_ms``: when the copy's record entered the
    chain (its first park or first failure): an entry older than the cap may have been removed
    as an orphan, so such a copy whose entry is gone runs instead of being dropped;
    ``has_dead``: False when the chain is known to hold no dead marker (the view counts them),
    so the first blocking entry decides (entries are kept in the order they were added, about
    offset order: a chain of many parked records is decided in a step, not a walk)."""
    if is_copy:
        own = entries.get(origin_offset) if entries else None
        if own is None:
            past_cap = max_blocked_ms is not None and (
                (parked_since_ms is not None and now_ms - parked_since_ms > max_blocked_ms)
                or (entered_ms is not None and now_ms - entered_ms > max_blocked_ms)
            )
            if removed:
                return Verdict.RUN_RELEASED if past_cap else Verdict.DUPLICATE
            if past_cap:
                return Verdict.RUN_RELEASED
            return Verdict.PARK
    if not entries:
        return Verdict.RUN
    if not has_dead:
        expired = False
        for offset, entry in entries.items():
            if offset >= origin_offset:
                continue
            if max_blocked_ms is not None and now_ms - entry.added_ms > max_blocked_ms:
                expired = True
                continue
            return Verdict.PARK
        return Verdict.RUN_RELEASED if expired else Verdict.RUN
    blocking = False
    expired = False
    dead_below = False
    live = False
    for offset, entry in entries.items():
        if entry.kind == KIND_DEAD:
            dead_below = dead_below or offset < origin_offset
            continue
        live = True
        if offset >= origin_offset:
            continue
        if max_blocked_ms is not None and now_ms - entry.added_ms > max_blocked_ms:
            expired = True
            continue
        blocking = True
    if dead_below and (is_copy or live):
        # behind a dead-lettered head while its chain lives: a record that has only dead
        # markers below it runs (and removes them: ``after_success``/``after_dead_letter``)
        return Verdict.DEAD
    if blocking:
        return Verdict.PARK
    return Verdict.RUN_RELEASED if expired else Verdict.RUN


def after_dead_letter(
    entries: Mapping[int, Entry] | None, origin_offset: int, on_dead_letter: OnDeadLetter
) -> tuple[str | None, list[int]]:
    """What a dead letter of the record at ``origin_offset`` writes to the state topic:
    ``(kind to write for its own entry, or None for a tombstone; offsets of dead markers to
    remove)``. With ``dead_letter``, a head that has live followers leaves a ``dead`` marker;
    the last live record of a chain behind dead markers removes them."""
    entries = entries or {}
    live_others = [o for o, e in entries.items() if o != origin_offset and e.kind != KIND_DEAD]
    markers = [o for o, e in entries.items() if o != origin_offset and e.kind == KIND_DEAD]
    behind_marker = any(o < origin_offset for o in markers)
    if (
        on_dead_letter is OnDeadLetter.DEAD_LETTER
        and not behind_marker
        and any(o > origin_offset for o in live_others)
    ):
        return KIND_DEAD, []
    if not live_others:
        return None, markers
    return None, []


def after_failure(entries: Mapping[int, Entry] | None, origin_offset: int) -> list[int]:
    """Dead markers a main-topic record entering the chain removes: those below it when no
    live entry is below it. It ran, so they no longer held anything back; left in place they
    would dead-letter its own copy as ``blocked_by_dead_letter``."""
    entries = entries or {}
    if any(o < origin_offset and e.kind != KIND_DEAD for o, e in entries.items()):
        return []
    return sorted(o for o, e in entries.items() if e.kind == KIND_DEAD and o < origin_offset)


def after_success(entries: Mapping[int, Entry] | None, origin_offset: int) -> list[int]:
    """Dead markers a successful record removes with its own entry: those below it when it
    was the last live record of its chain (a follower released past the cap)."""
    entries = entries or {}
    live_others = [o for o, e in entries.items() if o != origin_offset and e.kind != KIND_DEAD]
    if live_others:
        return []
    return [o for o, e in entries.items() if e.kind == KIND_DEAD and o != origin_offset]


def parked_since(value: bytes | None) -> int | None:
    """The ``retryd_parked`` header's first-park time; raises HeaderError when unusable."""
    if value is None:
        return None
    text = value.decode("ascii", errors="replace")
    if not (0 < len(text) <= 19 and text.isdigit()):
        raise HeaderError(f"header {PARKED}={text[:40]!r} is not a timestamp")
    return int(text)


from retryd.policy.chain_view import ChainView  # noqa: E402  (the view of these entries)

__all__ = [
    "DEAD_BLOCKED",
    "KINDS",
    "KIND_DEAD",
    "KIND_FAILED",
    "KIND_PARKED",
    "PARKED",
    "ChainView",
    "Entry",
    "EntryId",
    "KeyOrder",
    "OnDeadLetter",
    "Verdict",
    "after_dead_letter",
    "after_failure",
    "after_success",
    "chain_id",
    "decide",
    "decode_entry",
    "decode_entry_key",
    "encode_entry",
    "entry_key",
    "murmur2",
    "parked_since",
    "split_entry_key",
    "state_partition",
]
