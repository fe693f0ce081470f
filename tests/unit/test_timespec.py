"""Time specs for --since/--until: ISO-8601 and relative forms (pure logic)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retryd.errors import RetrydError, TimeSpecError
from retryd.policy.timespec import (
    MAX_MS,
    TimeWindow,
    format_instant,
    parse_duration,
    parse_instant,
    parse_window,
)

NOW = 1_714_557_600_000  # 2024-05-01T10:00:00Z


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-01", 1_714_521_600_000),
        ("2024-05-01T10:00", NOW),
        ("2024-05-01T10:00:00Z", NOW),
        ("2024-05-01 10:00:00Z", NOW),
        ("2024-05-01T12:00:00+02:00", NOW),
        ("2024-05-01T10:00:00.250Z", NOW + 250),
        ("20240501T100000Z", NOW),
        (" now ", NOW),
        ("NOW", NOW),
        ("90s", NOW - 90_000),
        ("30m", NOW - 1_800_000),
        ("2h", NOW - 7_200_000),
        ("7d", NOW - 7 * 86_400_000),
        ("1w", NOW - 7 * 86_400_000),
        ("500ms", NOW - 500),
        ("1h30m", NOW - 5_400_000),
        ("1h 30m ago", NOW - 5_400_000),
        ("2H", NOW - 7_200_000),
        ("0s", NOW),
    ],
)
def test_accepted_forms(text: str, expected: int) -> None:
    assert parse_instant(text, NOW) == expected


@pytest.mark.parametrize(
    "text",
    ["", "  ", "yesterday", "2h from now", "-2h", "2x", "h", "2.5h", "2024-13-01", "2024",
     "1969-12-31", "ago", "5 minutes", "\u0665m"],  # an Arabic-Indic five is not a digit here
)  # fmt: skip
def test_rejected_forms_say_what_is_expected(text: str) -> None:
    with pytest.raises(TimeSpecError) as err:
        parse_instant(text, NOW)
    assert isinstance(err.value, RetrydError)
    assert repr(text.strip()) in str(err.value) or "empty" in str(err.value)


def test_relative_time_cannot_reach_before_1970() -> None:
    with pytest.raises(TimeSpecError, match="before 1970"):
        parse_instant("100000d", NOW)


@given(st.integers(0, MAX_MS))
def test_format_then_parse_is_identity(epoch_ms: int) -> None:
    text = format_instant(epoch_ms)
    assert text.endswith("Z")
    assert parse_instant(text, NOW) == epoch_ms


@given(st.lists(st.tuples(st.integers(0, 1000), st.sampled_from(["ms", "s", "m", "h", "d", "w"])),
                min_size=1, max_size=4))  # fmt: skip
def test_compound_durations_add_up(parts: list[tuple[int, str]]) -> None:
    unit_ms = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
    text = "".join(f"{n}{unit}" for n, unit in parts)
    total = sum(n * unit_ms[unit] for n, unit in parts)
    assert parse_duration(text) == total
    assert parse_instant(text, 10**14) == 10**14 - total


def test_window() -> None:
    window = parse_window("2h", "30m", NOW)
    assert window == TimeWindow(NOW - 7_200_000, NOW - 1_800_000)
    assert window.contains(NOW - 7_200_000) and not window.contains(NOW - 1_800_000)
    assert window.describe() == "[2024-05-01T08:00:00Z, 2024-05-01T09:30:00Z)"
    assert parse_window(None, None, NOW).is_open
    assert parse_window("2024-05-01", None, NOW).describe() == "[2024-05-01T00:00:00Z, now)"
    with pytest.raises(TimeSpecError, match="is not before"):
        parse_window("30m", "2h", NOW)
    with pytest.raises(TimeSpecError, match="is not before"):
        parse_window("now", "now", NOW)
