"""The share worker's lock check: a handler call (quick retries included) plus the margin to
route and acknowledge must end within the share group's record lock."""

from __future__ import annotations

import pytest

from retryd.errors import ConfigError
from retryd.handlers.quick import quick_timeout_s
from retryd.share.delay import check_first_delay
from retryd.share.group import LOCK_MARGIN_S, ShareGroupConfig, check_lock

GROUP = ShareGroupConfig("orders.share", 30_000, 5, "earliest", False)


def test_a_call_that_ends_within_the_lock_passes() -> None:
    check_lock(GROUP, 27.9, 27.9)
    check_lock(GROUP, quick_timeout_s(8.0, 2, 500), 8.0)  # 25 s


@pytest.mark.parametrize("call_s", [28.0, 30.0, 45.0])
def test_a_call_that_may_outlast_the_lock_is_refused(call_s: float) -> None:
    with pytest.raises(ConfigError) as caught:
        check_lock(GROUP, call_s, call_s)
    (problem,) = caught.value.problems
    assert problem.startswith(
        f"handler_timeout_s={call_s:g} plus {LOCK_MARGIN_S:g}s to route and acknowledge must "
        "stay below share group orders.share's record lock, share.record.lock.duration.ms=30000"
    )
    assert "--entity-name orders.share --add-config share.record.lock.duration.ms=<ms>" in problem


def test_quick_retries_count_in_the_bound() -> None:
    with pytest.raises(ConfigError) as caught:
        check_lock(GROUP, quick_timeout_s(10.0, 2, 1000), 10.0)  # 32 s
    assert "handler_timeout_s=10 (32s with its quick retries)" in caught.value.problems[0]


def test_a_first_delay_must_fit_in_the_lock_with_a_call() -> None:
    """delay= holds a record under its lock (retryd.share.delay): refused at start-up when the
    lock cannot hold the wait, a whole call and the margin."""
    check_first_delay(GROUP, 10.0, 17_900)  # 17.9 + 10 + 2 < 30
    check_first_delay(GROUP, 28.0, 0)  # no delay: nothing to check here
    with pytest.raises(ConfigError) as caught:
        check_first_delay(GROUP, 10.0, 18_000)
    (problem,) = caught.value.problems
    assert problem.startswith(
        "retry_sequence delay=18s: in share mode a record waits for its first attempt under "
        "its record lock, so the delay plus a whole call (10s) plus 2s must stay below share "
        "group orders.share's share.record.lock.duration.ms=30000 (the delay must stay below 18s)"
    )
    assert "consumer_mode=group" in problem
