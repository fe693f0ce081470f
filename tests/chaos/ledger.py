"""The ledger check: N uniquely identified messages with a known fate, reconciled at the end.

Every id has one *expected* terminal place: handled (a successful handler call), or
``failed_topic`` with a given ``retryd_dead_reason``. What actually happened is tallied from
the handlers' append-only call log and from ``failed_topic``; ``reconcile`` then sorts every id:

- *lost*: in no terminal place (must be 0);
- *two places*: handled and dead-lettered (must be 0);
- *misplaced*: in one place, but not the expected one, or dead with the wrong reason (must be 0);
- duplicates: extra successful calls (``handled_twice``) and extra dead letters of the same id
  (``dead_twice``): allowed under at-least-once, counted and reported.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

HANDLED = "handled"
DEAD = "dead"

# The mix of issue 9: 30% transient, 5% poison, 2% non-retryable, the rest succeed at once.
MIX = (("transient", 0.30), ("poison", 0.05), ("non_retryable", 0.02))
REASON = {"poison": "exhausted", "non_retryable": "non_retryable"}


@dataclass(frozen=True, slots=True)
class Expect:
    place: str  # HANDLED | DEAD
    reason: str | None = None  # dead reason when place is DEAD


@dataclass(frozen=True, slots=True)
class Spec:
    """One planned message: its id, what its handler calls do, and where it must end."""

    id: str
    kind: str
    k: int = 0  # transient: how many calls fail before one succeeds
    expect_override: Expect | None = None

    @property
    def expect(self) -> Expect:
        if self.expect_override is not None:
            return self.expect_override
        reason = REASON.get(self.kind)
        return Expect(DEAD, reason) if reason else Expect(HANDLED)

    def value(self, **extra: Any) -> bytes:
        doc: dict[str, Any] = {"id": self.id, "kind": self.kind, "k": self.k, **extra}
        return json.dumps(doc, separators=(",", ":")).encode()


def make_plan(n: int, rng: random.Random, prefix: str, max_k: int) -> list[Spec]:
    """``n`` messages in the issue's mix, shuffled; transient ones fail 1..``max_k`` times
    (``max_k`` = the number of retries in the sequence, so every transient one succeeds)."""
    specs: list[Spec] = []
    start = 0
    for kind, share in MIX:
        count = round(n * share)
        for i in range(start, start + count):
            k = rng.randint(1, max_k) if kind == "transient" else 0
            specs.append(Spec(f"{prefix}{i}", kind, k))
        start += count
    specs += [Spec(f"{prefix}{i}", "ok") for i in range(start, n)]
    rng.shuffle(specs)
    return specs


@dataclass
class Tally:
    """What happened, accumulated incrementally from the call log and ``failed_topic``."""

    handled: Counter[str] = field(default_factory=Counter)  # successful calls per id
    dead: Counter[str] = field(default_factory=Counter)  # dead letters per id
    reasons: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    calls: int = 0  # handler calls of any outcome
    header_mismatch: Counter[str] = field(default_factory=Counter)  # fuzz: user headers changed

    def call(self, entry: Mapping[str, Any], digest: str | None = None) -> None:
        self.calls += 1
        ident = entry.get("id")
        if entry.get("o") == "ok":
            self.handled[str(ident)] += 1
        if digest is not None and entry.get("h") != digest:
            self.header_mismatch[str(ident)] += 1

    def dead_letter(self, ident: str, reason: str | None) -> None:
        self.dead[ident] += 1
        self.reasons[ident][reason or "?"] += 1


@dataclass
class Reconciliation:
    messages: int
    handled: int
    dead: int
    lost: list[str]
    two_places: list[str]
    misplaced: list[str]
    handled_twice: int
    dead_twice: int
    unknown: int
    calls: int
    header_mismatches: int = 0

    @property
    def clean(self) -> bool:
        """Every id in exactly one terminal place, the expected one."""
        return not (self.lost or self.two_places or self.misplaced or self.unknown)

    def row(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "handled": self.handled,
            "dead_lettered": self.dead,
            "lost": len(self.lost),
            "two_places": len(self.two_places),
            "misplaced": len(self.misplaced),
            "duplicates": {"handled_twice": self.handled_twice, "dead_twice": self.dead_twice},
            "handler_calls": self.calls,
            "header_mismatches": self.header_mismatches,
        }

    def describe(self) -> str:
        return (
            f"lost={len(self.lost)} {self.lost[:5]} two_places={len(self.two_places)} "
            f"{self.two_places[:5]} misplaced={len(self.misplaced)} {self.misplaced[:5]} "
            f"unknown={self.unknown} handled_twice={self.handled_twice} "
            f"dead_twice={self.dead_twice}"
        )


def reconcile(plan: Iterable[Spec], tally: Tally) -> Reconciliation:
    lost: list[str] = []
    two: list[str] = []
    misplaced: list[str] = []
    ids = set()
    n = 0
    for spec in plan:
        n += 1
        ids.add(spec.id)
        handled = tally.handled.get(spec.id, 0)
        dead = tally.dead.get(spec.id, 0)
        if not handled and not dead:
            lost.append(spec.id)
            continue
        if handled and dead:
            two.append(spec.id)
            continue
        expect = spec.expect
        if expect.place == HANDLED:
            wrong = not handled
        else:
            wrong = not dead or set(tally.reasons[spec.id]) != {expect.reason}
        if wrong:
            misplaced.append(spec.id)
    unknown = sum(1 for i in set(tally.handled) | set(tally.dead) if i not in ids)
    return Reconciliation(
        messages=n,
        handled=sum(1 for i in tally.handled if i in ids),
        dead=sum(1 for i in tally.dead if i in ids),
        lost=lost,
        two_places=two,
        misplaced=misplaced,
        handled_twice=sum(c - 1 for i, c in tally.handled.items() if i in ids),
        dead_twice=sum(c - 1 for i, c in tally.dead.items() if i in ids),
        unknown=unknown,
        calls=tally.calls,
        header_mismatches=sum(tally.header_mismatch.values()),
    )
