"""The delay before the first attempt (``delay=<d>`` in ``retry_sequence``) in share mode.

Group mode holds a main-topic record in its partition's in-memory tail until its timestamp
plus ``d`` (never later than ``d`` after the worker first saw it), for up to an hour: a
consumer group's record costs nothing while it waits. A share group's record waits under its
lock, and the lock cannot be renewed (``retryd.share.group``), so the share worker holds it
*in hand* the same way, but only as long as its lock can hold the wait and the call:

- **at start-up** the worker refuses a ``d`` that, with a whole call and the margin, does not
  fit in the group's record lock (``check_first_delay``): ``d + handler_timeout_s`` (with its
  quick retries) ``+ LOCK_MARGIN_S`` must stay below ``share.record.lock.duration.ms``. Then
  every record fits: it is due at most ``d`` after it was acquired;
- **a record not due yet** stays in hand, unstarted, while the others of its batch run; the
  loop does not sleep for it (its waits on calls and acknowledgements are bounded by the next
  due time) and it starts once due, like any record, when a call is free;
- **a record its lock cannot hold until due** (only when the group's lock was shortened while
  the worker runs, below what start-up accepted) is not called early, and not RELEASEd (it
  would come straight back, a delivery used each time, until its delivery limit): it goes to
  its first tier without a call (error class ``not_due``), whose delay brings it back later,
  never earlier than it was due; only where that tier would bring it back too early, or its
  route has no tier, is it RELEASEd.

Why not route every delayed record through the first tier? A tier copy is a *retry*
(``retry_number`` 1, one retry fewer, a tier's delay instead of ``d``): the first attempt
would not be what ``delay=`` promises. Why not hold it longer than the lock? The broker would
hand it to another worker meanwhile.
"""

from __future__ import annotations

from typing import Any

from retryd.errors import ConfigError
from retryd.policy.classify import HandlerResult, Outcome
from retryd.share.group import LOCK, LOCK_MARGIN_S, ShareGroupConfig, lock_holds
from retryd.worker.intake import effective_due_ms

NOT_DUE = "not_due"  # error class of a record sent on to its tier before its first call


def first_due_ms(msg: Any, delay_ms: int, now_ms: int) -> int:
    """When a main-topic record may first be called: its timestamp plus the delay, bounded
    by ``now_ms`` (when the worker first saw it) plus the delay, as group mode bounds it; a
    record without a timestamp waits the delay from now."""
    try:
        ts = msg.timestamp()[1]
    except Exception:  # a record we cannot read: the delay from now
        ts = 0
    if not isinstance(ts, int) or ts <= 0:
        return now_ms + delay_ms
    return effective_due_ms(ts + delay_ms, ts, delay_ms, now_ms)


def check_first_delay(config: ShareGroupConfig, call_s: float, delay_ms: int) -> None:
    """Refuse a delay that the record lock cannot hold with a whole call (module docstring)."""
    if not delay_ms or lock_holds(config, call_s + delay_ms / 1000):
        return
    most = config.lock_ms / 1000 - call_s - LOCK_MARGIN_S
    raise ConfigError(
        [
            f"retry_sequence delay={delay_ms / 1000:g}s: in share mode a record waits for its "
            f"first attempt under its record lock, so the delay plus a whole call "
            f"({call_s:g}s) plus {LOCK_MARGIN_S:g}s must stay below share group "
            f"{config.group}'s {LOCK}={config.lock_ms}"
            + (f" (the delay must stay below {most:g}s)" if most > 0 else "")
            + f". Shorten the delay, lower handler_timeout_s, raise the group's {LOCK} (at "
            "most 60000 by default), or use consumer_mode=group, which holds a delayed record "
            "for up to 1h"
        ]
    )


def not_due(due_ms: int) -> HandlerResult:
    """The result a record sent on to its tier before its first call carries."""
    return HandlerResult(
        Outcome.RETRY,
        NOT_DUE,
        f"not called: its record lock could not hold it until its first attempt at {due_ms}",
    )
