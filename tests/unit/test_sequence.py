"""Retry sequence parsing, tier naming and the attempt -> destination rule (pure logic)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retryd.errors import ConfigError, SequenceError
from retryd.policy.sequence import (
    MAX_DELAY_MS,
    RetryPlan,
    format_delay,
    parse_delay,
    validate_topic_name,
)

UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

delays_ms = st.integers(min_value=1, max_value=MAX_DELAY_MS)
sequences = st.lists(delays_ms, min_size=1, max_size=12)


def plan_of(delays: list[int], **kw: str) -> RetryPlan:
    return RetryPlan.parse(",".join(format_delay(d) for d in delays), failed_topic="dead", **kw)


# --- parse_delay / format_delay ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500ms", 500),
        ("1s", 1000),
        ("5m", 300_000),
        ("1h", 3_600_000),
        ("2d", 172_800_000),
        (" 30 m ", 1_800_000),
        ("05m", 300_000),
        ("365d", MAX_DELAY_MS),
    ],
)
def test_parse_delay_units(text: str, expected: int) -> None:
    assert parse_delay(text) == expected


@given(value=st.integers(1, 10_000), unit=st.sampled_from(sorted(UNIT_MS)))
def test_parse_delay_any_unit(value: int, unit: str) -> None:
    ms = value * UNIT_MS[unit]
    if ms > MAX_DELAY_MS:
        with pytest.raises(SequenceError, match="at most 365d"):
            parse_delay(f"{value}{unit}")
    else:
        assert parse_delay(f"{value}{unit}") == ms


@given(delays_ms)
def test_format_parse_round_trip(ms: int) -> None:
    text = format_delay(ms)
    assert parse_delay(text) == ms
    # canonical: the largest unit that divides exactly, so equal delays share one tier name
    number, unit = int(text.rstrip("mshd")), text.lstrip("0123456789")
    bigger = [u for u in ("s", "m", "h", "d") if UNIT_MS[u] > UNIT_MS[unit]]
    assert all((number * UNIT_MS[unit]) % UNIT_MS[u] for u in bigger)


@pytest.mark.parametrize(
    ("a", "b"), [("60s", "1m"), ("60m", "1h"), ("24h", "1d"), ("1000ms", "1s"), ("90s", "90s")]
)
def test_equal_delays_format_the_same(a: str, b: str) -> None:
    assert format_delay(parse_delay(a)) == format_delay(parse_delay(b))


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "5",
        "m",
        "5x",
        "5M",
        "-5m",
        "+5m",
        "5.5m",
        "1e3ms",
        "5 minutes",
        "5m5s",
        "\u0665m",
        "0m",
    ],
)
def test_invalid_delay_is_a_readable_sequence_error(text: str) -> None:
    with pytest.raises(SequenceError) as info:
        parse_delay(text)
    message = str(info.value)
    assert repr(text) in message
    assert "expected a whole number" in message or "greater than zero" in message
    assert isinstance(info.value, ConfigError) and info.value.problems == [message]


def test_too_long_delay_is_rejected() -> None:
    with pytest.raises(SequenceError, match=r"'366d': must be at most 365d"):
        parse_delay("366d")


@given(st.text(max_size=12))
def test_parse_delay_never_crashes(text: str) -> None:
    try:
        assert 0 < parse_delay(text) <= MAX_DELAY_MS
    except SequenceError as exc:
        assert repr(text) in str(exc)


# --- RetryPlan.parse ----------------------------------------------------------------------------


def test_default_sequence() -> None:
    plan = RetryPlan.parse("5m,5m,30m,30m,30m,1h", failed_topic="failed_topic")
    assert plan.max_retries == 6
    assert plan.tier_topics == ["retry_5m", "retry_30m", "retry_1h"]
    assert plan.tier_delays == {"retry_5m": 300_000, "retry_30m": 1_800_000, "retry_1h": 3_600_000}


@pytest.mark.parametrize("seq", ["", " ", ",", "5m,", ",5m", "5m,,5m", "5m;30m", "5m 30m"])
def test_invalid_sequences(seq: str) -> None:
    with pytest.raises(SequenceError) as info:
        RetryPlan.parse(seq, failed_topic="dead")
    assert "'5m,30m,1h'" in str(info.value) or "invalid delay" in str(info.value)


def test_invalid_element_is_named() -> None:
    with pytest.raises(SequenceError, match=r"invalid delay '10x'"):
        RetryPlan.parse("5m,10x,1h", failed_topic="dead")


@given(sequences)
def test_tier_topics_one_per_distinct_delay(delays: list[int]) -> None:
    plan = plan_of(delays)
    assert len(plan.tier_topics) == len(set(delays))
    assert len(set(plan.tier_topics)) == len(plan.tier_topics)
    # first-occurrence order, and every tier maps back to its delay
    assert plan.tier_topics == [plan.tier_topic(d) for d in dict.fromkeys(delays)]
    assert {plan.tier_delays[plan.tier_topic(d)] for d in delays} == set(delays)
    for topic in plan.tier_topics:
        validate_topic_name(topic)
        assert topic != "dead"


@given(sequences)
def test_next_destination_for_every_attempt(delays: list[int]) -> None:
    plan = plan_of(delays)
    for n in range(len(delays)):
        dest = plan.next_destination(n)
        assert not dest.is_dead
        assert dest.delay_ms == delays[n]
        assert dest.topic == plan.tier_topic(delays[n])
        assert dest.retry_number == n + 1
    for n in (len(delays), len(delays) + 1, len(delays) + 100):
        dest = plan.next_destination(n)
        assert dest.is_dead and dest.topic == "dead" and dest.delay_ms is None
        assert dest.retry_number == n


def test_next_destination_rejects_negative() -> None:
    with pytest.raises(ValueError):
        RetryPlan.parse("5m", failed_topic="dead").next_destination(-1)


def test_dead_destination_keeps_retry_count() -> None:
    dest = RetryPlan.parse("5m,1h", failed_topic="dead").dead_destination(1)
    assert dest.is_dead and dest.topic == "dead" and dest.retry_number == 1


# --- templates ----------------------------------------------------------------------------------


def test_group_template_separates_groups() -> None:
    a = RetryPlan.parse("5m,1h", tier_template="{group}.retry_{delay}", failed_topic="f", group="a")
    b = RetryPlan.parse("5m,1h", tier_template="{group}.retry_{delay}", failed_topic="f", group="b")
    assert a.tier_topics == ["a.retry_5m", "a.retry_1h"]
    assert b.tier_topics == ["b.retry_5m", "b.retry_1h"]
    assert a.next_destination(1).topic == "a.retry_1h"


@given(
    group=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=30),
    delays=sequences,
)
def test_group_template_any_group(group: str, delays: list[int]) -> None:
    seq = ",".join(format_delay(d) for d in delays)
    plan = RetryPlan.parse(seq, tier_template="{group}.{delay}", failed_topic="dead", group=group)
    assert all(t.startswith(f"{group}.") for t in plan.tier_topics)
    assert len(plan.tier_topics) == len(set(delays))


@pytest.mark.parametrize(
    ("template", "fragment"),
    [
        ("retry", "must contain '{delay}'"),
        ("retry_{delay}_{foo}", "may only use {delay} and {group}"),
        ("retry_{delay}_{0}", "may only use {delay} and {group}"),
        ("retry {delay}", "invalid topic name"),
        ("retry/{delay}", "invalid topic name"),
    ],
)
def test_bad_templates(template: str, fragment: str) -> None:
    with pytest.raises(SequenceError, match=fragment.replace("{", r"\{").replace("}", r"\}")):
        RetryPlan.parse("5m", tier_template=template, failed_topic="dead")


def test_failed_topic_may_not_be_a_tier() -> None:
    with pytest.raises(SequenceError, match="collides with a tier topic"):
        RetryPlan.parse("5m,1h", failed_topic="retry_1h")


@pytest.mark.parametrize("name", ["", ".", "..", "a b", "a/b", "ä", "x" * 250])
def test_invalid_topic_names(name: str) -> None:
    with pytest.raises(SequenceError, match="invalid topic name"):
        validate_topic_name(name)


def test_long_but_valid_topic_name() -> None:
    validate_topic_name("x" * 249)
