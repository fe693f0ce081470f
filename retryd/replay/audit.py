"""The audit trail of replays: one log line per replayed record, on logger ``retryd.audit``.

Every line names the actor (the API token's id: its configured name or a short SHA-256
fingerprint, never the token; ``cli`` for ``retryd replay``), the failed record, the target
and the replay id, so "who replayed what, where" can be answered from logs alone. Bulk jobs
log when they start, stop, and once per replayed record (a job of 100,000 records writes
100,000 lines: the safer reading of "every replay logged"). Lines are ``key=value`` pairs
whose values never contain spaces (topic names, ids and coordinates cannot).
"""

from __future__ import annotations

import logging
from typing import Any

audit_log = logging.getLogger("retryd.audit")


def audit_fields(values: dict[str, Any]) -> str:
    return " ".join(f"{k}={_clean(v)}" for k, v in values.items())


def _clean(value: Any) -> str:
    text = "-" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return "".join(c if c.isprintable() and not c.isspace() else "?" for c in text)[:512]


def replayed(
    *,
    actor: str,
    record: str,
    target: str,
    partition: int | None,
    offset: int | None,
    replay_id: str,
    forced: bool,
    job: str | None = None,
) -> None:
    """One replayed copy, acknowledged and recorded in the ledger."""
    audit_log.info(
        "replay %s",
        audit_fields(
            {
                "actor": actor,
                "record": record,
                "target": f"{target}/{partition}/{offset}",
                "replay_id": replay_id,
                "forced": forced,
                "job": job,
            }
        ),
    )


def job_event(event: str, *, actor: str, job: str, **details: Any) -> None:
    """A bulk job was created, cancelled or finished (``details``: filter, target, counts)."""
    audit_log.info("job_%s %s", event, audit_fields({"actor": actor, "job": job, **details}))
