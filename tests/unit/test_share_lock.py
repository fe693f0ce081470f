"""The share worker's lock check: a handler call (quick retries included) plus the margin to
route and acknowledge must end within the share group's record lock."""

from __future__ import annotations

import pytest

from retryd.errors import ConfigError
from retryd.handlers.quick import quick_timeout_s
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
