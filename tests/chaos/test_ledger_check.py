"""The ledger check itself: it must see a lost id, an id in two places, an id in the wrong
place, and count duplicates; a chaos scenario is only as good as this."""

from __future__ import annotations

import random

from tests.chaos.handler import DEAD, FAIL, OK, decide
from tests.chaos.ledger import Spec, Tally, make_plan, reconcile

PLAN = [
    Spec("a", "ok"),
    Spec("b", "transient", 2),
    Spec("c", "poison"),
    Spec("d", "non_retryable"),
]


def test_every_id_in_its_expected_place_is_clean() -> None:
    tally = Tally()
    tally.call({"id": "a", "o": OK})
    tally.call({"id": "b", "o": FAIL})
    tally.call({"id": "b", "o": OK})
    tally.dead_letter("c", "exhausted")
    tally.dead_letter("d", "non_retryable")
    rec = reconcile(PLAN, tally)
    assert rec.clean and rec.handled == 2 and rec.dead == 2 and rec.calls == 3


def test_lost_two_places_misplaced_and_duplicates_are_seen() -> None:
    tally = Tally()
    tally.call({"id": "a", "o": OK})
    tally.call({"id": "a", "o": OK})  # redone after a crash: a duplicate, not an error
    tally.call({"id": "b", "o": OK})
    tally.dead_letter("b", "exhausted")  # handled and dead-lettered
    tally.dead_letter("d", "exhausted")  # dead-lettered with the wrong reason
    tally.dead_letter("d", "exhausted")
    tally.dead_letter("zzz", "malformed")  # not in the plan
    rec = reconcile(PLAN, tally)
    assert rec.lost == ["c"]
    assert rec.two_places == ["b"]
    assert rec.misplaced == ["d"]
    assert rec.unknown == 1
    assert (rec.handled_twice, rec.dead_twice) == (1, 1)
    assert not rec.clean


def test_plan_mix_and_outcomes_by_kind() -> None:
    plan = make_plan(1000, random.Random(1), "m", max_k=2)
    kinds = {
        k: sum(1 for s in plan if s.kind == k) for k in ("transient", "poison", "non_retryable")
    }
    assert kinds == {"transient": 300, "poison": 50, "non_retryable": 20}
    assert len({s.id for s in plan}) == 1000
    assert all(1 <= s.k <= 2 for s in plan if s.kind == "transient")
    # a transient message fails exactly k times, then succeeds
    assert [decide("transient", 2, r) for r in range(3)] == [FAIL, FAIL, OK]
    assert {decide("poison", 0, r) for r in range(3)} == {FAIL}
    assert decide("non_retryable", 0, 0) == DEAD
