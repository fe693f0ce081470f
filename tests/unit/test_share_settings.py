"""consumer_mode = share: the settings it refuses, each with its reason."""

from __future__ import annotations

import pytest

from retryd.config import ConsumerMode, load_settings
from retryd.errors import ConfigError


def test_group_is_the_default_and_share_needs_ordering_none() -> None:
    assert load_settings().consumer_mode is ConsumerMode.GROUP
    with pytest.raises(ConfigError) as caught:
        load_settings(consumer_mode="share")  # ordering keeps its default, key
    (problem,) = caught.value.problems
    assert "consumer_mode=share needs ordering=none (ordering=key)" in problem
    assert "no key or partition order" in problem
    settings = load_settings(consumer_mode="share", ordering="none", group_id="billing")
    assert settings.consumer_mode is ConsumerMode.SHARE
    assert settings.share_group_id == "billing.share"


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"ordering": "partition"}, "needs ordering=none (ordering=partition)"),
        ({"key_order": "strict"}, "does not work with key_order=strict"),
        ({"exactly_once": True}, "does not work with exactly_once"),
        ({"handler_batch": 10}, "does not work with handler_batch=10"),
    ],
)
def test_share_mode_refuses_what_a_share_group_cannot_give(extra: dict, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(consumer_mode="share", **{"ordering": "none", **extra})
    assert any(says in p for p in caught.value.problems), caught.value.problems


def test_share_mode_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RETRYD_CONSUMER_MODE", "share")
    monkeypatch.setenv("RETRYD_ORDERING", "none")
    assert load_settings().consumer_mode is ConsumerMode.SHARE
    monkeypatch.setenv("RETRYD_CONSUMER_MODE", "queue")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert caught.value.problems[0].startswith("consumer_mode='queue'")
