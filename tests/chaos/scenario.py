"""What every scenario shares: fresh topics and group, the plan, the worker fleet, the
observer, and its report row."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.fleet import CHAOS_HANDLER, Fleet
from tests.chaos.ledger import Reconciliation, Spec
from tests.chaos.load import PacedProducer, Record
from tests.chaos.observe import CallLog, DeadLetters, Observer, id_from_json
from tests.chaos.report import Row
from tests.chaos.scale import SEQUENCE, scale
from tests.integration.worker_support import Deployment, deployment

CALL_LOG = "calls.jsonl"


@dataclass
class Scenario:
    name: str
    plan: list[Spec]
    dep: Deployment
    fleet: Fleet
    observer: Observer
    call_log: Path
    began: float = field(default_factory=time.monotonic)

    @property
    def topics(self) -> list[str]:
        """Every topic the group consumes (main and tiers)."""
        return [self.dep.main, *self.dep.settings.plan.tier_topics]

    def records(self) -> list[Record]:
        return [(s.id.encode(), s.value(), []) for s in self.plan]

    def row(self, rec: Reconciliation, behind: int, faults: int, **extra: Any) -> Row:
        return {
            "scenario": self.name,
            "scale": scale(),
            "messages": rec.messages,
            "faults": faults,
            **rec.row(),
            "partitions_behind_at_end": behind,
            "seconds": round(time.monotonic() - self.began, 1),
            **({"settle_notes": self.observer.notes[-3:]} if self.observer.notes else {}),
            **extra,
        }

    def fault_entry(self, load: PacedProducer, at: float, **fields: Any) -> dict[str, Any]:
        """What a fault hit: messages produced so far, ended, and still on their way."""
        rec = self.observer.refresh()
        ended = rec.messages - len(rec.lost)
        return {
            "at_s": round(at - self.began, 1),
            **fields,
            "produced": load.produced,
            "ended": ended,
            "in_flight": load.produced - ended,
        }

    def assert_settled(self, rec: Reconciliation, behind: int) -> None:
        """Every id in its one expected place and nothing left uncommitted; a failure says
        what settling met and the last warnings and errors of every worker process this
        scenario started (their logs outlive ``close``)."""
        assert rec.clean, rec.describe() + self.diagnosis()
        assert behind == 0, f"{behind} partitions still held uncommitted records" + self.diagnosis()

    def diagnosis(self, lines: int = 12) -> str:
        notes = "".join(f"\n{note}" for note in self.observer.notes[-3:])
        return notes + self.fleet.warnings(lines)

    def close(self) -> None:
        try:
            self.fleet.close()
        finally:
            self.observer.close()


def start(
    name: str,
    bootstrap: str,
    tmp_path: Path,
    plan: list[Spec],
    *,
    partitions: int = 4,
    handler: str = CHAOS_HANDLER,
    digests: dict[str, str] | None = None,
    **settings: Any,
) -> Scenario:
    """Fresh topics (main, tiers, failed) and a fresh group for one scenario."""
    dep = deployment(
        bootstrap,
        tmp_path,
        sequence=SEQUENCE,
        partitions=partitions,
        handler=handler,
        handler_timeout_s=settings.pop("handler_timeout_s", 10.0),
        **settings,
    )
    return watch(name, dep, tmp_path, plan, digests)


def watch(
    name: str,
    dep: Deployment,
    tmp_path: Path,
    plan: list[Spec],
    digests: dict[str, str] | None = None,
) -> Scenario:
    """The observer and the worker fleet of a scenario whose topics and group exist (``dep``):
    the call log, ``failed_topic``'s reader, and the processes it will start."""
    bootstrap = dep.bootstrap
    call_log = tmp_path / CALL_LOG
    dead = DeadLetters(bootstrap, dep.failed, id_from_json)
    observer = Observer(
        plan,
        [CallLog(call_log, digests)],
        dead,
        bootstrap,
        dep.settings.group_id,
        [dep.main, *dep.settings.plan.tier_topics],
    )
    fleet = Fleet(dep, tmp_path / "procs", call_log)
    return Scenario(name, plan, dep, fleet, observer, call_log)
