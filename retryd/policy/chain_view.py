"""One worker's view of the key-state topic (``key_order = strict``): chain id -> {origin
offset: Entry}, for its own consumer group only.

- **Its own group.** Several deployments may share one key-state topic (the entry key names
  the group). Entries of other groups are skipped and counted (``foreign``): they neither count
  toward this worker's limit nor show in its gauges, and never hold back its records.
- **Versions.** Every write of an entry is a record of one state partition (all entries of a
  chain share one), so its offset orders the writes of that entry. The view applies a write
  only if it is newer than what it holds for that entry: the worker applies its own
  acknowledged writes at once (write-through) and reads them again later from the topic,
  and a re-read older add must not bring back an entry it already saw removed.
- **Bounded.** ``max_entries`` live entries: past it (``full``) the engine parks nothing new
  (parking adds an entry), while records of keys without an entry keep running. The group's
  members all stop parking at the same count, so the topic, and so every view, stays near
  the limit. ``max_removed`` recently removed entries are remembered to recognise duplicates of
  finished chain entries.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping

from retryd.policy.key_order import KIND_DEAD, Entry, decode_entry, decode_entry_key


class ChainView:
    def __init__(
        self,
        max_entries: int = 1_000_000,
        max_removed: int = 1_000_000,
        group: str | None = None,
    ) -> None:
        self.group = group  # None: every group's entries (tools reading the whole topic)
        self.chains: dict[bytes, dict[int, Entry]] = {}
        self.entries = 0
        self.max_entries = max_entries
        self.max_removed = max_removed
        # (chain, origin offset) -> the version (state offset) of the tombstone, -1 unknown
        self._removed: OrderedDict[tuple[bytes, int], int] = OrderedDict()
        self.positions: dict[int, int] = {}  # state partition -> next offset read
        self.bad = 0  # state records that are not entries (skipped)
        self.foreign = 0  # entries of other consumer groups (skipped)
        # chains changed since the engine last looked: records waiting on them decide again
        self.dirty: set[bytes] = set()
        self.dead: dict[bytes, int] = {}  # chain -> dead markers it holds (most hold none)

    @property
    def full(self) -> bool:
        return self.entries >= self.max_entries

    def get(self, chain: bytes) -> dict[int, Entry] | None:
        return self.chains.get(chain)

    def removed(self, chain: bytes, offset: int) -> bool:
        return (chain, offset) in self._removed

    def has_dead(self, chain: bytes) -> bool:
        return chain in self.dead

    def apply(self, key: bytes | None, value: bytes | None, version: int = -1) -> bool:
        """Apply one state record (an add, or a tombstone) written at ``version`` (its offset
        in its state partition; -1 when unknown); False when it is not an entry of this
        view's group."""
        if key is None:
            self.bad += 1
            return False
        try:
            ident = decode_entry_key(key)
            entry = decode_entry(ident.offset, value, version) if value is not None else None
        except (ValueError, UnicodeDecodeError, RecursionError):
            self.bad += 1
            return False
        if self.group is not None and ident.group != self.group:
            self.foreign += 1
            return False
        chain = key[:-8]
        if entry is None:
            self.remove(chain, ident.offset, version)
        else:
            self.add(chain, entry)
        return True

    def add(self, chain: bytes, entry: Entry) -> None:
        version = entry.version
        offset = entry.offset
        if version >= 0:
            gone = self._removed.get((chain, offset))
            if gone is not None and gone >= version:
                return  # an older add read after the newer tombstone was applied
        found = self.chains.get(chain)
        if found is None:
            found = self.chains[chain] = {}
        old = found.get(offset)
        if old is None:
            self.entries += 1
        elif version >= 0 and old.version > version:
            return
        found[offset] = entry
        self._removed.pop((chain, offset), None)
        dead = self.dead
        delta = (entry.kind == KIND_DEAD) - (old is not None and old.kind == KIND_DEAD)
        if delta:
            left = dead.get(chain, 0) + delta
            if left:
                dead[chain] = left
            else:
                dead.pop(chain, None)
        # (an add can let a copy run too: one whose own entry this view had not read yet)
        self.dirty.add(chain)

    def remove(self, chain: bytes, offset: int, version: int = -1) -> None:
        found = self.chains.get(chain)
        if found is not None:
            old = found.get(offset)
            if old is not None and version >= 0 and old.version > version:
                return  # a stale tombstone: the entry was added again since
            gone = found.pop(offset, None)
            if gone is not None:
                self.entries -= 1
                self.dirty.add(chain)
                if gone.kind == KIND_DEAD:
                    left = self.dead.get(chain, 0) - 1
                    if left > 0:
                        self.dead[chain] = left
                    else:
                        self.dead.pop(chain, None)
                if not found:
                    del self.chains[chain]
        removed = self._removed
        key = (chain, offset)
        removed[key] = max(version, removed.get(key, -1))
        removed.move_to_end(key)
        while len(removed) > self.max_removed:
            removed.popitem(last=False)

    def caught_up(self, targets: Mapping[int, int]) -> bool:
        """Has the view read every state partition up to ``targets`` (next offsets)?"""
        positions = self.positions
        return all(positions.get(p, 0) >= end for p, end in targets.items())

    def older_than(self, before_ms: int) -> Iterator[tuple[bytes, Entry]]:
        """Entries added before ``before_ms`` (candidates for orphan removal)."""
        for chain, found in self.chains.items():
            for entry in found.values():
                if entry.added_ms < before_ms:
                    yield chain, entry

    def stats(self, now_ms: int) -> tuple[int, int, float]:
        """``(blocked keys, live entries, age of the oldest entry in seconds)``."""
        oldest: int | None = None
        for found in self.chains.values():
            for entry in found.values():
                if oldest is None or entry.added_ms < oldest:
                    oldest = entry.added_ms
        age = 0.0 if oldest is None else max(0.0, (now_ms - oldest) / 1000)
        return len(self.chains), self.entries, age


__all__ = ["ChainView"]
