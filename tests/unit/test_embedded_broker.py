"""The embedded broker's command line: what it listens on and what it advertises."""

from __future__ import annotations

from pathlib import Path

import pytest

from retryd.kafka.embedded import EmbeddedBroker


def test_advertises_its_own_listener_by_default() -> None:
    broker = EmbeddedBroker(port=19092)
    argv = broker.command(Path("/bin/tansu"))
    assert argv == [
        "/bin/tansu",
        "broker",
        "--listener-url",
        "tcp://127.0.0.1:19092",
        "--advertised-listener-url",
        "tcp://127.0.0.1:19092",
    ]
    assert broker.advertised_bootstrap == broker.bootstrap == "127.0.0.1:19092"


def test_advertises_another_address_when_asked() -> None:
    # e.g. a TCP proxy in front of the listener: clients bootstrap there and stay there
    broker = EmbeddedBroker(port=19092, advertised="127.0.0.1:19093")
    argv = broker.command(Path("/bin/tansu"))
    assert argv[argv.index("--listener-url") + 1] == "tcp://127.0.0.1:19092"
    assert argv[argv.index("--advertised-listener-url") + 1] == "tcp://127.0.0.1:19093"
    assert broker.bootstrap == "127.0.0.1:19092"
    assert broker.advertised_bootstrap == "127.0.0.1:19093"


@pytest.mark.parametrize("bad", ["", "localhost", ":9092", "host:port", "tcp://h:1"])
def test_rejects_an_advertised_address_that_is_not_host_port(bad: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        EmbeddedBroker(port=19092, advertised=bad)
