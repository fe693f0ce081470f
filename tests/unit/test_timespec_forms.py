"""--since/--until: ISO-8601 (UTC without an offset) and relative forms, one 'now'."""

from __future__ import annotations

import pytest

from retryd.errors import TimeSpecError
from retryd.policy.timespec import parse_instant

NOW = 1_700_000_000_000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("2h", NOW - 7_200_000),
        ("2h ago", NOW - 7_200_000),
        ("1h30m", NOW - 5_400_000),
        ("90s", NOW - 90_000),
        ("1w", NOW - 604_800_000),
        ("2023-11-14", 1_699_920_000_000),
        ("2023-11-14T22:13:20Z", NOW),
        ("2023-11-14T22:13:20", NOW),
        ("2023-11-15T00:13:20+02:00", NOW),
        ("2023-11-14T22:13:20.250Z", NOW + 250),
    ],
)
def test_forms(text: str, expected: int) -> None:
    assert parse_instant(text, NOW) == expected


@pytest.mark.parametrize("text", ["", "yesterday", "5x", "-2h", "1969-12-31", "2h from now"])
def test_rejected_with_one_line(text: str) -> None:
    with pytest.raises(TimeSpecError) as info:
        parse_instant(text, NOW)
    assert "\n" not in str(info.value)


def test_the_api_pattern_admits_every_accepted_form() -> None:
    import re

    from retryd.policy.timespec import TIME_PATTERN

    for text in ("now", "2h", "2h ago", "1h30m", "90s", "2023-11-14", "2023-11-14T22:13:20Z"):
        assert re.match(TIME_PATTERN, text), text
        parse_instant(text, NOW)
    for text in ("yesterday", "5x", "", "-2h"):
        assert not re.match(TIME_PATTERN, text), text
