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


def test_an_unset_handler_timeout_fits_the_brokers_default_lock_in_share_mode(
    tmp_path, monkeypatch
) -> None:
    from retryd.config.settings import SHARE_HANDLER_TIMEOUT_S
    from retryd.share.group import LOCK_MARGIN_S

    # the broker's default record lock is 30 s: the defaults must pass the start-up check
    assert SHARE_HANDLER_TIMEOUT_S + LOCK_MARGIN_S < 30
    share = {"consumer_mode": "share", "ordering": "none"}
    assert load_settings(**share).handler_timeout_s == SHARE_HANDLER_TIMEOUT_S
    assert load_settings().handler_timeout_s == 30.0  # group mode keeps its default
    assert load_settings(**share, handler_timeout_s=10).handler_timeout_s == 10.0
    config = tmp_path / "retryd.toml"
    config.write_text('consumer_mode = "share"\nordering = "none"\n')
    assert load_settings(config).handler_timeout_s == SHARE_HANDLER_TIMEOUT_S
    config.write_text('consumer_mode = "share"\nordering = "none"\nhandler_timeout_s = 5\n')
    assert load_settings(config).handler_timeout_s == 5.0
    monkeypatch.setenv("RETRYD_CONSUMER_MODE", "share")
    monkeypatch.setenv("RETRYD_ORDERING", "none")
    assert load_settings().handler_timeout_s == SHARE_HANDLER_TIMEOUT_S
    monkeypatch.setenv("RETRYD_HANDLER_TIMEOUT_S", "12")
    assert load_settings().handler_timeout_s == 12.0
