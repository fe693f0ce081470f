"""The retry engine end to end against a real broker: tiers, exhaustion, success after retries."""

from __future__ import annotations

from pathlib import Path

from retryd.policy import headers as h
from tests.integration.worker_support import calls_for, deployment
from tests.support import read_topic


def test_always_failing_message_walks_every_tier_then_dead_letters(
    bootstrap: str, tmp_path: Path
) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s,1s,2s")
    dep.send([{"id": "a", "mode": "always"}], headers=[("trace", b"t-1"), ("bin", b"\xff\x00")])

    summary = dep.run()

    dead = read_topic(bootstrap, dep.failed, expect=1)
    assert len(dead) == 1
    rec = dead[0]
    assert rec.key == b"a"
    assert rec.header(h.RETRY_NUMBER) == b"3"
    assert rec.header(h.ORIGINAL_TOPIC) == dep.main.encode()
    assert rec.header(h.ORIGINAL_PARTITION) == b"0"
    assert rec.header(h.ORIGINAL_OFFSET) == b"0"
    assert rec.header(h.ERROR_CLASS) == b"RuntimeError"
    assert rec.header(h.DEAD_REASON) == b"exhausted"
    assert rec.header(h.ERROR_MESSAGE) == b"always fails (retry 3)"
    # user headers kept byte for byte; retryd headers replaced, never appended
    assert rec.header("trace") == b"t-1" and rec.header("bin") == b"\xff\x00"
    names = [k for k, _ in rec.headers]
    assert len(names) == len(set(names))

    hops = read_topic(bootstrap, dep.tier("1s"), expect=2) + read_topic(
        bootstrap, dep.tier("2s"), expect=1
    )
    assert [int(r.header(h.RETRY_NUMBER) or 0) for r in hops] == [1, 2, 3]
    for hop, delay in zip(hops, (1000, 1000, 2000), strict=True):
        due = int(hop.header(h.RETRY_TIMESTAMP) or 0)
        assert abs(due - (hop.timestamp + delay)) <= 100, (due, hop.timestamp, delay)
    calls = calls_for("a")
    assert [c["retry_number"] for c in calls] == [0, 1, 2, 3]
    for call in calls[1:]:
        assert call["called_ms"] >= call["retry_timestamp"], "processed before it was due"
    assert summary.dead_reasons == {"exhausted": 1}
    assert summary.total("retried") == 3 and summary.total("dead") == 1


def test_fails_k_times_then_succeeds_exactly_once(bootstrap: str, tmp_path: Path) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s,1s,1s")
    dep.send([{"id": "k2", "mode": "fail_k", "k": 2}, {"id": "ok", "mode": "ok"}])

    summary = dep.run()

    assert [c["retry_number"] for c in calls_for("k2")] == [0, 1, 2]
    assert [c["retry_number"] for c in calls_for("ok")] == [0]
    assert read_topic(bootstrap, dep.failed) == []
    assert summary.total("success") == 2 and summary.total("dead") == 0


def test_non_retryable_goes_straight_to_failed_topic(bootstrap: str, tmp_path: Path) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s,1s", non_retryable="PoisonError")
    dep.send([{"id": "p1", "mode": "non_retryable"}, {"id": "p2", "mode": "poison_by_name"}])

    summary = dep.run()

    dead = read_topic(bootstrap, dep.failed, expect=2)
    assert sorted(r.key for r in dead) == [b"p1", b"p2"]
    for rec in dead:
        assert rec.header(h.DEAD_REASON) == b"non_retryable"
        assert rec.header(h.RETRY_NUMBER) == b"0"
    classes = {r.key: r.header(h.ERROR_CLASS) for r in dead}
    assert classes[b"p1"] == b"retryd.errors.NonRetryableError"
    assert classes[b"p2"] == b"tests.integration.handlers.PoisonError"
    assert read_topic(bootstrap, dep.tier("1s")) == []
    assert len(calls_for("p1")) == 1 and len(calls_for("p2")) == 1
    assert summary.dead_reasons == {"non_retryable": 2}


def test_an_exponential_policy_with_jitter_walks_its_tiers_never_early(
    bootstrap: str, tmp_path: Path
) -> None:
    # 1s, 2s, 4s: three tiers derived from the policy; every due time within ±25 % of its delay
    dep = deployment(bootstrap, tmp_path, sequence="exp(1s, x2, n=3, jitter=25%)")
    assert dep.settings.plan.tier_topics == [dep.tier("1s"), dep.tier("2s"), dep.tier("4s")]
    dep.send([{"id": f"j{i}", "mode": "always"} for i in range(30)])

    summary = dep.run()

    assert len(read_topic(bootstrap, dep.failed, expect=30)) == 30
    offsets: list[float] = []
    for delay_s in (1, 2, 4):
        hops = read_topic(bootstrap, dep.tier(f"{delay_s}s"), expect=30)
        assert len(hops) == 30
        for hop in hops:
            moved = int(hop.header(h.RETRY_TIMESTAMP) or 0) - (hop.timestamp + delay_s * 1000)
            assert abs(moved) <= delay_s * 250 + 5, (delay_s, moved)
            offsets.append(moved / (delay_s * 1000))
    # jitter spreads the copies that failed together: not all moved the same way
    assert min(offsets) < -0.05 and max(offsets) > 0.05
    for i in range(30):
        calls = calls_for(f"j{i}")
        assert [c["retry_number"] for c in calls] == [0, 1, 2, 3]
        for call in calls[1:]:
            assert call["called_ms"] >= call["retry_timestamp"], "processed before it was due"
    assert summary.dead_reasons == {"exhausted": 30}


def test_a_delay_before_the_first_attempt_holds_main_records_never_early(
    bootstrap: str, tmp_path: Path
) -> None:
    dep = deployment(bootstrap, tmp_path, sequence="1s, delay=2s", tier_buffer=4)
    assert dep.settings.plan.tier_topics == [dep.tier("1s")]  # the first delay is not a tier
    dep.send([{"id": f"d{i}", "mode": "ok"} for i in range(12)])

    dep.run()

    written = {r.offset: r.timestamp for r in read_topic(bootstrap, dep.main, expect=12)}
    for i in range(12):
        [call] = calls_for(f"d{i}")
        assert call["called_ms"] >= written[call["offset"]] + 2000, "called before its delay"
