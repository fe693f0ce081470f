"""The sidecar's view of its group's outage circuit breaker, and operators' orders to it.

Each worker process decides alone (``retryd.policy.circuit``) and reports its circuit in its
heartbeat; the sidecar reads those (``GET /v1/circuit``) and names the worst state among the
live processes, since any process that holds records is what an operator must know about.
An order (``POST /v1/circuit``) is a small file in the shared state dir
(``retryd.runtime.circuit_control``) that every worker process of the group applies once, at
its next heartbeat: like heartbeats, it reaches the processes of this pod only, so an order
for a whole deployment goes to every pod's sidecar. Concurrent orders are serialised by a lock
there, each with its own ``seq``; an order file that is not a usable order (spoiled, hostile)
is shown as no last order, never as an error.

Every order is written to the audit trail (logger ``retryd.audit``, the replay lines' format)
with the token's id, never the token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from retryd.api.schemas import CircuitOrderOut, CircuitOut, CircuitProcessOut
from retryd.config import Settings
from retryd.errors import RetrydError
from retryd.policy.circuit import STATE_VALUE, CircuitAction, CircuitState
from retryd.replay.audit import audit_fields, audit_log
from retryd.runtime.circuit_control import (
    CircuitCommand,
    command_path,
    read_command,
    write_command,
)
from retryd.runtime.heartbeat import STALE, Heartbeat, liveness, read_heartbeats

log = logging.getLogger(__name__)


class CircuitOrderError(RetrydError):
    """The order could not be written to the state dir (the API answers 503)."""


def state_of(value: object) -> CircuitState | None:
    """A state from a heartbeat (written by any version of the worker), or None."""
    try:
        return CircuitState(str(value)) if value is not None else None
    except ValueError:
        return None


def worst(states: Iterable[CircuitState | None]) -> CircuitState | None:
    """open > half_open > closed; None when no state is known."""
    known = [s for s in states if s is not None]
    return max(known, key=STATE_VALUE.__getitem__) if known else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def process_view(hb: Heartbeat, judged: str) -> CircuitProcessOut:
    c = hb.circuit if isinstance(hb.circuit, dict) else {}
    transitions = c.get("transitions")
    return CircuitProcessOut(
        pid=hb.pid,
        liveness="stopping" if judged != "alive" else "alive",
        state=state_of(c.get("state")),
        since_ms=_int(c.get("since_ms")),
        reason=_str(c.get("reason")),
        last_error=_str(c.get("last_error")),
        next_probe_ms=_int(c.get("next_probe_ms")),
        transitions={
            str(k): v
            for k, v in (transitions.items() if isinstance(transitions, dict) else ())
            if _int(v) is not None
        },
        held=_int(c.get("held")) or 0,
        probes=_int(c.get("probes")) or 0,
    )


def live_processes(settings: Settings, now: float | None = None) -> list[CircuitProcessOut]:
    """The circuit of every worker process of this group whose heartbeat is fresh (alive or
    stopping: a stopping process still finishes calls, and may still hold records)."""
    now = time.time() if now is None else now
    out = []
    for hb in read_heartbeats(settings.state_dir):
        if hb.group_id != settings.group_id:
            continue
        judged = liveness(hb, now, settings.heartbeat_stale_s)
        if judged != STALE:
            out.append(process_view(hb, judged))
    return out


def summary(processes: list[CircuitProcessOut]) -> tuple[CircuitState | None, str | None]:
    """The worst state, and the last error of the process in it (the most recent such one)."""
    state = worst(p.state for p in processes)
    if state is None:
        return None, None
    same = [p for p in processes if p.state is state and p.last_error]
    others = [p for p in processes if p.last_error]
    pick = max(same or others, key=lambda p: p.since_ms or 0, default=None)
    return state, pick.last_error if pick is not None else None


def order_out(cmd: CircuitCommand) -> CircuitOrderOut:
    return CircuitOrderOut(seq=cmd.seq, action=cmd.action.value, by=cmd.by, at_ms=cmd.at_ms)


def circuit_view(settings: Settings, now: float | None = None) -> CircuitOut:
    """``GET /v1/circuit`` (reads a few small files: run it off the event loop). The order
    file is read bounded and never raises (``read_command``): a bad one is no last order."""
    processes = live_processes(settings, now)
    state, last_error = summary(processes)
    last = read_command(command_path(settings.state_dir, settings.group_id))
    if last is not None and last.group != settings.group_id:
        last = None  # a digest collision, or a file not written for this group
    return CircuitOut(
        group=settings.group_id,
        state=state,
        last_error=last_error,
        held=sum(p.held for p in processes),
        processes=processes,
        last_order=order_out(last) if last is not None else None,
    )


def give_order(settings: Settings, action: CircuitAction, by: str) -> CircuitOrderOut:
    """Write the order for every worker process of the group and audit it (``by``: the
    token's id). Raises ``CircuitOrderError`` when the state dir cannot be written, or the
    order file stayed locked by another writer for ``LOCK_WAIT_S``."""
    try:
        cmd = write_command(settings.state_dir, settings.group_id, action, by)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        log.error("circuit order %s by %s not written: %s", action.value, by, reason)
        raise CircuitOrderError(
            f"the order could not be written to the state dir ({reason})"
        ) from None
    audit_log.info(
        "circuit_order %s",
        audit_fields(
            {"actor": by, "group": settings.group_id, "action": cmd.action.value, "seq": cmd.seq}
        ),
    )
    return order_out(cmd)


__all__ = [
    "CircuitOrderError",
    "circuit_view",
    "give_order",
    "live_processes",
    "summary",
    "worst",
]
