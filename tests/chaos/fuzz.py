"""Hostile Kafka headers for the header fuzz: random names and values (binary, non-UTF-8,
non-ASCII UTF-8, huge, empty, null, CR/LF, NUL), repeated names, and repeated retryd headers
with junk in them.

Two shapes of record:

- a *main-topic* record may carry any headers, retryd's included: retryd reads no envelope
  there (a main-topic record is where a message enters), so its fate depends on its kind only;
- a *tier* record, written straight into a tier as a foreign producer might, has an envelope
  that is either usable or not. Kafka lets a name repeat and the last occurrence wins, so junk
  occurrences come first and the *last* occurrence of each retryd header decides: a usable
  envelope is handled by its kind, an unusable one is dead-lettered ``malformed`` (spec §2).
"""

from __future__ import annotations

import random

from tests.chaos.ledger import Expect

Headers = list[tuple[str, bytes | None]]

# (No NUL inside a name: the client library cuts a header name at NUL before it is produced.)
USER_NAMES = [
    "trace-id",
    "Content-Type",
    "content-type",
    "Content-Length",
    "Host",
    "Transfer-Encoding",
    "Connection",
    "X-Retryd-Key",
    "X-Retryd-Headers-B64",
    "X-Kafka-nested",
    "grüße",
    "日本語",
    "emoji-🙂",
    "",
    " ",
    "a b",
    "colon:name",
    "crlf\r\nX-Injected",
    "under_score",
    "dash-and_underscore",
    "n" * 1000,
]
RETRYD_NAMES = [
    "retry_number",
    "retry_timestamp",
    "retryd_original_topic",
    "retryd_original_partition",
    "retryd_original_offset",
    "retryd_original_timestamp",
    "retryd_first_failure_timestamp",
    "retryd_error_class",
    "retryd_error_message",
    "retryd_dead_reason",
    "retryd_replay_id",
    "retryd_replayed_from",
    "retryd_some_future_header",
]
ENVELOPE_NAMES = RETRYD_NAMES[:5]  # the required fields, always written last on tier records
HUGE_SIZES = (70_000, 250_000)


def value(rng: random.Random) -> bytes | None:
    roll = rng.random()
    if roll < 0.02:  # huge: binary or printable
        size = rng.choice(HUGE_SIZES)
        return rng.randbytes(size) if rng.random() < 0.5 else b"h" * size
    choices: list[bytes | None] = [
        rng.randbytes(rng.randint(1, 64)),  # binary
        b"\xff\xfe\xfd" + rng.randbytes(4),  # not UTF-8
        b"\xc3\x28",  # an invalid UTF-8 sequence
        "héllo wörld 日本 🙂".encode(),  # UTF-8, not ASCII
        b"",
        None,
        b"a\r\nX-Injected: 1",
        b"\x00",
        b"  padded  ",
        b"plain-value",
        b"%41%0D%0A",
        str(rng.randint(0, 10**6)).encode(),
    ]
    return rng.choice(choices)


def junk_retryd_value(rng: random.Random) -> bytes | None:
    return rng.choice(
        [
            b"\xff",
            b"",
            None,
            b"-1",
            b"0",
            b"7",
            b"12345678901234567890",
            b"abc",
            "日本".encode(),
            "tópico".encode(),
            b"a b",
            b"exhausted",
            b"x" * 300,
            rng.randbytes(8),
        ]
    )


def user_headers(rng: random.Random, most: int = 10) -> Headers:
    out: Headers = []
    for _ in range(rng.randint(0, most)):
        repeat = out and rng.random() < 0.2  # a repeated name, same or other value
        name = rng.choice(out)[0] if repeat else rng.choice(USER_NAMES)
        out.append((name, value(rng)))
    return out


def main_headers(rng: random.Random) -> Headers:
    """User headers with junk retryd headers mixed in (some repeated)."""
    headers = user_headers(rng)
    for _ in range(rng.randint(0, 6)):
        headers.insert(
            rng.randint(0, len(headers)), (rng.choice(RETRYD_NAMES), junk_retryd_value(rng))
        )
    return headers


def tier_headers(rng: random.Random, main_topic: str, group: str, usable: bool) -> Headers:
    """A tier record's headers: user headers, junk retryd occurrences first, then the
    deciding (last) occurrences: a usable envelope, or one with a required field broken."""
    headers = user_headers(rng)
    for _ in range(rng.randint(0, 4)):  # junk only where a later occurrence decides
        headers.insert(
            rng.randint(0, len(headers)), (rng.choice(ENVELOPE_NAMES), junk_retryd_value(rng))
        )
    envelope: dict[str, bytes | None] = {
        "retry_number": b"1",
        "retry_timestamp": rng.choice([b"0", b"1700000000000", b"9999999999999999"]),
        "retryd_original_topic": main_topic.encode(),
        "retryd_original_partition": str(rng.randint(0, 3)).encode(),
        "retryd_original_offset": str(rng.randint(0, 10**9)).encode(),
    }
    if rng.random() < 0.5:
        envelope["retryd_group"] = group.encode()
    if not usable:
        broken = rng.choice(
            ["retry_number", "retryd_original_topic", "retryd_original_partition",
             "retryd_original_offset", "retry_timestamp"]
        )  # fmt: skip
        bad = {
            "retry_number": [b"0", b"-1", b"\xff", b"", None, b"one", b"12345678901234567890"],
            "retryd_original_topic": ["tópico".encode(), b"", None, b"a b", b"\xff", b"t" * 300],
        }.get(broken, [b"\xff", b"", None, b"x", b"-5", "٣".encode()])
        if rng.random() < 0.2:
            del envelope[broken]  # missing altogether, junk occurrences included
            headers = [(n, v) for n, v in headers if n != broken]
        else:
            envelope[broken] = rng.choice(bad)
    for name, val in envelope.items():
        headers.append((name, val))
    return headers


MALFORMED = Expect("dead", "malformed")
