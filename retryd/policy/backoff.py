"""Backoff policies: what ``retry_sequence`` may say besides a plain list of delays.

    5m,5m,30m                          a list, as always
    exp(1s, x2, max=1h, n=8)           1s 2s 4s ... capped at 1h, 8 retries
    fixed(30s, n=5)                    30s five times
    exp(1s, x2, n=6, jitter=20%)       each due time moved by up to ±20 % of its delay
    5m,30m, jitter=10%                 options after a list too
    exp(1s, n=5, quick=2@100ms)        2 in-place retries 100 ms apart before the first tier
    fixed(1m, n=3, delay=10s)          the first attempt 10 s after the record was written

A policy only decides *delays*: each distinct delay is one tier topic (named after the nominal
delay, so jitter never adds topics), and the number of delays is the number of retries before
``failed_topic``. Jitter spreads the due times of copies routed at the same moment (a
downstream outage that failed thousands of calls at once must not bring them all back in the
same millisecond); the tier's consumers honour the jittered ``retry_timestamp`` and bound it by
the tier delay plus the largest jitter (``Backoff.bound_ms``).

Quick retries (``quick=<n>@<delay>``) call the handler again on the main topic, in the same
worker, before a copy ever goes to a tier: a blip of a few hundred milliseconds never leaves
the main partition. The record waits in memory (its partition's offset is not stored
meanwhile), so both are bounded: at most ``MAX_QUICK`` retries, ``MAX_QUICK_DELAY_MS`` apart.

A delay before the first attempt (``delay=<d>``, at most ``MAX_FIRST_DELAY_MS``) holds each
main-topic record in its partition's in-memory tail until its timestamp plus ``d`` (bounded by
when the worker first saw it plus ``d``, like a tier's due time), with the tiers' bounds: a
partition pauses once ``tier_buffer`` records wait and resumes shortly before a record not yet
fetched could come due. For a longer wait, route to a tier.

Pure functions only: parsing happens at start-up and every error names the text it refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from retryd.errors import SequenceError

UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
# re.ASCII: \d must not accept digits of other scripts (Arabic-Indic five is not a delay).
_DELAY_RE = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$", re.ASCII)
_FUNC_RE = re.compile(r"^\s*(exp|fixed)\s*\((.*)\)\s*$", re.ASCII | re.DOTALL)
_FACTOR_RE = re.compile(r"^x(\d+(?:\.\d+)?)$", re.ASCII)
_PERCENT_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*%$", re.ASCII)
_COUNT_RE = re.compile(r"^\d{1,3}$", re.ASCII)
# Upper bound keeps due times and tier retention (factor x delay) far inside int64 milliseconds.
MAX_DELAY_MS = 365 * UNIT_MS["d"]
# Every distinct delay is a topic per consumer group: a policy that asks for more is a typo.
MAX_RETRIES = 64
# Above half the delay, jitter would reorder a tier's copies beyond recognition and let a copy
# come due in less than half its nominal delay.
MAX_JITTER = 0.5
MAX_QUICK = 10
MAX_QUICK_DELAY_MS = 60_000
MAX_FIRST_DELAY_MS = 3_600_000  # held in memory on the main partition: an hour at most
_QUICK_RE = re.compile(r"^(\d{1,2})\s*@\s*(.+)$", re.ASCII)


def parse_delay(text: str) -> int:
    """Return the delay in milliseconds for ``'500ms'``, ``'5m'``, ``'1h'``, …"""
    match = _DELAY_RE.match(text)
    if match is None:
        raise SequenceError(
            f"invalid delay {text!r}: expected a whole number with a unit ms|s|m|h|d, e.g. '5m'"
        )
    value = int(match.group(1))
    if value <= 0:
        raise SequenceError(f"invalid delay {text!r}: must be greater than zero")
    delay_ms = value * UNIT_MS[match.group(2)]
    if delay_ms > MAX_DELAY_MS:
        raise SequenceError(f"invalid delay {text!r}: must be at most 365d")
    return delay_ms


@dataclass(frozen=True, slots=True)
class Backoff:
    """Nominal delays, one per scheduled retry, and the jitter applied to each due time."""

    delays_ms: tuple[int, ...]
    jitter: float = 0.0  # fraction of the delay, 0 <= jitter <= MAX_JITTER
    quick: int = 0  # in-place retries on the main topic before the first tier
    quick_delay_ms: int = 0  # between two of them
    first_delay_ms: int = 0  # before the first attempt of a main-topic record

    def due_ms(self, delay_ms: int, now_ms: int, draw: Callable[[], float]) -> int:
        """When a copy routed at ``now_ms`` to the tier of ``delay_ms`` comes due; ``draw``
        returns a uniform number in [0, 1) (``random.random``; tests pass their own)."""
        if not self.jitter:
            return now_ms + delay_ms
        spread = delay_ms * self.jitter
        return now_ms + delay_ms + round(spread * (2.0 * draw() - 1.0))

    def bound_ms(self, delay_ms: int) -> int:
        """The latest a copy of this tier can be due after it was routed: the delay plus the
        largest jitter (what a tier consumer allows past a record's own timestamp)."""
        return delay_ms + math.ceil(delay_ms * self.jitter)


def _split(text: str) -> list[str]:
    """Top-level comma split (commas inside a function's parentheses stay with it)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SequenceError(f"invalid retry sequence {text!r}: unbalanced ')'")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise SequenceError(f"invalid retry sequence {text!r}: unbalanced '('")
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _jitter(value: str, text: str) -> float:
    match = _PERCENT_RE.match(value.strip())
    if match is None:
        raise SequenceError(
            f"invalid jitter {value!r} in {text!r}: expected a percentage, e.g. 20%"
        )
    fraction = float(match.group(1)) / 100.0
    if fraction > MAX_JITTER:
        raise SequenceError(f"invalid jitter {value!r} in {text!r}: at most 50%")
    return fraction


def _quick(value: str, text: str) -> tuple[int, int]:
    match = _QUICK_RE.match(value.strip())
    if match is None:
        raise SequenceError(
            f"invalid quick={value!r} in {text!r}: expected <retries>@<delay>, e.g. quick=2@100ms"
        )
    n, delay = int(match.group(1)), parse_delay(match.group(2))
    if not 1 <= n <= MAX_QUICK:
        raise SequenceError(f"invalid quick={value!r} in {text!r}: 1 to {MAX_QUICK} retries")
    if delay > MAX_QUICK_DELAY_MS:
        raise SequenceError(
            f"invalid quick={value!r} in {text!r}: at most 60s apart (use a tier for longer)"
        )
    return n, delay


def _count(value: str, text: str) -> int:
    if not _COUNT_RE.match(value.strip()) or not 1 <= int(value) <= MAX_RETRIES:
        raise SequenceError(
            f"invalid n={value!r} in {text!r}: a whole number of retries, 1 to {MAX_RETRIES}"
        )
    return int(value)


def _options(items: list[str], allowed: set[str], text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not value.strip():
            raise SequenceError(f"invalid option {item!r} in {text!r}: expected name=value")
        if name not in allowed:
            known = ", ".join(sorted(allowed))
            raise SequenceError(f"unknown option {name!r} in {text!r}: known are {known}")
        if name in out:
            raise SequenceError(f"option {name!r} given twice in {text!r}")
        out[name] = value.strip()
    return out


def _function(name: str, body: str, text: str) -> tuple[tuple[int, ...], dict[str, str]]:
    args = _split(body)
    if not args or not args[0]:
        raise SequenceError(f"invalid {name}(...) in {text!r}: the first argument is a delay")
    base = parse_delay(args[0])
    factor = 1.0
    rest = args[1:]
    if name == "exp":
        if rest and "=" not in rest[0]:
            match = _FACTOR_RE.match(rest[0].strip())
            if match is None:
                raise SequenceError(
                    f"invalid factor {rest[0]!r} in {text!r}: expected x<number>, e.g. x2"
                )
            factor = float(match.group(1))
            rest = rest[1:]
        else:
            factor = 2.0
        if not 1.0 < factor <= 100.0:
            raise SequenceError(f"invalid factor x{factor:g} in {text!r}: above 1, at most 100")
    allowed = {"n", "jitter", "quick", "delay"} | ({"max"} if name == "exp" else set())
    opts = _options(rest, allowed, text)
    if "n" not in opts:
        raise SequenceError(f"{name}(...) in {text!r} needs n=<retries>, e.g. n=5")
    n = _count(opts.pop("n"), text)
    cap = parse_delay(opts.pop("max")) if "max" in opts else MAX_DELAY_MS
    if cap < base:
        raise SequenceError(f"max in {text!r} is below the first delay")
    delays = []
    delay = float(base)
    for _ in range(n):
        delays.append(min(cap, round(delay)))
        delay = min(float(cap), delay * factor)
    return tuple(delays), opts


def parse_backoff(text: str) -> Backoff:
    """A ``retry_sequence`` in any of its forms (module docstring)."""
    if not text or not text.strip():
        raise SequenceError(
            f"invalid retry sequence {text!r}: expected a comma list such as '5m,30m,1h' "
            "or a policy such as 'exp(1s, x2, max=1h, n=8)'"
        )
    items = _split(text)
    if any(not item for item in items):
        raise SequenceError(
            f"invalid retry sequence {text!r}: an empty item; expected a comma list such as "
            "'5m,30m,1h'"
        )
    delays: list[int] = []
    options: dict[str, str] = {}
    func = _FUNC_RE.match(items[0]) if len(items) == 1 else None
    if func is not None:
        delays_found, options = _function(func.group(1), func.group(2), text)
        items = []
        delays.extend(delays_found)
    for item in items:
        if _FUNC_RE.match(item) is not None:
            raise SequenceError(
                f"invalid retry sequence {text!r}: a policy is the whole sequence "
                "(its options go inside its parentheses)"
            )
        if "=" in item:
            if not delays:
                raise SequenceError(f"invalid retry sequence {text!r}: options come after delays")
            found = _options([item], {"jitter", "quick", "delay"}, text)
            if found.keys() & options.keys():
                raise SequenceError(f"option {item!r} given twice in {text!r}")
            options.update(found)
        else:
            if options:
                raise SequenceError(f"invalid retry sequence {text!r}: a delay after an option")
            delays.append(parse_delay(item))
    if len(delays) > MAX_RETRIES:
        raise SequenceError(f"invalid retry sequence {text!r}: at most {MAX_RETRIES} retries")
    jitter = _jitter(options.pop("jitter"), text) if "jitter" in options else 0.0
    quick, quick_delay = _quick(options.pop("quick"), text) if "quick" in options else (0, 0)
    first = _first_delay(options.pop("delay"), text) if "delay" in options else 0
    return Backoff(tuple(delays), jitter, quick, quick_delay, first)


def _first_delay(value: str, text: str) -> int:
    delay = parse_delay(value)
    if delay > MAX_FIRST_DELAY_MS:
        raise SequenceError(
            f"invalid delay={value!r} in {text!r}: at most 1h before the first attempt (records "
            "wait in memory on the main partition; for longer, route to a tier)"
        )
    return delay
