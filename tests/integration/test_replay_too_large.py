"""Issue 23 item 13, on the real broker: a dead letter too large for its replay target is
skipped with reason ``too_large`` (nothing written, no ledger entry) and every other record
is replayed: by the copy sender itself (a broker refusing a whole batch, a copy refused
locally), a sidecar bulk job, the single-record replay (422 ``too_large``), the explorer's job
page and ``retryd replay``. The Spark replay's case is in ``test_spark_replay.py``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Producer

from retryd.kafka.clients import new_producer
from retryd.policy.headers import REPLAYED_FROM
from retryd.replay.copies import (
    REPLAYED,
    SOLO_TUNING,
    TOO_LARGE,
    CopyOutcome,
    CopyProducer,
    replay_producer_config,
    send_replay_copy,
)
from retryd.replay.ledger import ReplayLedger
from retryd.replay.records import FailedRecord
from tests.integration.sidecar_support import (
    TOKEN,
    Env,
    SidecarProcess,
    failed_headers,
    pretty,
    replay_cli,
    sign_in,
    wait_job,
)
from tests.support import create_topics, read_topic, unique, wait_for

TARGET_MAX = 100_000  # the replay target's max.message.bytes
BIG = 200_000  # fits failed_topic, refused by the target's broker (delivery report)
HUGE = 2_000_000  # over the replay producer's message.max.bytes (refused by produce itself)
SMALL = 30


def create_deployment(bootstrap: str, state_dir: Path) -> Env:
    """Main topics that take 100 KB at most; a failed_topic that takes the big dead letters."""
    env = Env(bootstrap, state_dir)
    create_topics(bootstrap, [env.main, env.other], 2, {"max.message.bytes": str(TARGET_MAX)})
    create_topics(bootstrap, [env.failed], 1, {"max.message.bytes": str(4 * HUGE)})
    return env


def seed_large(bootstrap: str, topic: str, records: list[tuple[bytes, bytes, list]]) -> None:
    """Produce records of up to a few MB (the test helper's producer stops at 1 MB)."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "message.max.bytes": 4 * HUGE + 1000}
    )
    errors: list[Any] = []
    for key, value, headers in records:
        producer.produce(
            topic,
            key=key,
            value=value,
            headers=headers,
            on_delivery=lambda err, _msg: errors.append(err) if err is not None else None,
        )
        producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors


def mixed_records(original_topic: str) -> tuple[list[tuple[bytes, bytes, list]], dict[str, int]]:
    """SMALL small dead letters with a big and a huge one among them (offsets by name)."""
    records = []
    at: dict[str, int] = {}
    for i in range(SMALL):
        if i == SMALL // 3:
            at["big"] = len(records)
            records.append((b"big", b"B" * BIG, failed_headers(original_topic)))
        if i == 2 * SMALL // 3:
            at["huge"] = len(records)
            records.append((b"huge", b"H" * HUGE, failed_headers(original_topic)))
        records.append((b"s%d" % i, b"small-%d" % i, failed_headers(original_topic)))
    return records, at


def test_copies_refused_in_a_batch_are_judged_alone(bootstrap: str) -> None:
    """The sender itself (shared by jobs, the CLI and Spark tasks): small copies batched with a
    big one (a long linger puts them in one batch) are refused with it by the broker, sent
    again alone and replayed; the big one, refused alone too, and the huge one, refused by
    produce itself, are skipped too_large; the ledger has exactly the replayed ones."""
    target, ledger_topic = unique("tl-target"), unique("tl-ledger")
    create_topics(bootstrap, [target], 1, {"max.message.bytes": str(TARGET_MAX)})
    common = {"bootstrap.servers": bootstrap}
    ledger = ReplayLedger(common, ledger_topic)
    ledger.ensure_topic()
    resent: list[bytes] = []

    class Alone(Producer):
        """The real producer, noting what is sent through it."""

        def produce(self, *args: Any, **kwargs: Any) -> None:
            resent.append(kwargs["value"])
            super().produce(*args, **kwargs)

    def factory(conf: dict[str, Any]) -> Any:
        if conf.get("batch.num.messages") == SOLO_TUNING["batch.num.messages"]:
            return Alone(conf)
        return new_producer(conf)

    producer = CopyProducer(factory, replay_producer_config({**common, "linger.ms": "500"}))
    values = {i: b"small-%d" % i for i in range(10)}
    values[4], values[7] = b"B" * BIG, b"H" * HUGE
    refused = {4, 7}
    kept = {i: v for i, v in values.items() if i not in refused}
    outcomes: dict[int, CopyOutcome] = {}
    try:
        for i, value in values.items():
            rec = FailedRecord("tl-source", 0, i, 0, b"k%d" % i, value, [])

            def done(outcome: CopyOutcome, i: int = i) -> None:
                outcomes[i] = outcome

            send_replay_copy(
                producer, ledger, rec, target, 1, replay_id="r-tl", forced=False, by="test",
                on_done=done, idle=producer.poll,
            )  # fmt: skip

        def settled() -> bool:
            producer.poll(0.05)
            ledger.poll(0.05)
            return len(outcomes) == len(values)

        wait_for(settled, 60, 0, "every copy's outcome")
        # the broker refused the one batch: every copy in it was sent again alone
        assert sorted(resent) == sorted(v for i, v in values.items() if i != 7), len(resent)
        for i in refused:
            assert outcomes[i].skipped == TOO_LARGE, outcomes[i]
            assert outcomes[i].error and f"tl-source[0]@{i}" in outcomes[i].error
        assert {i: outcomes[i] for i in kept} == {i: REPLAYED for i in kept}
        # each once: a refused batch wrote nothing, so sending alone duplicates nothing
        copies = read_topic(bootstrap, target)
        assert sorted(c.value or b"" for c in copies) == sorted(kept.values())
        ledger.refresh()
        assert {i for i in values if ledger.is_replayed(f"tl-source/0/{i}")} == set(kept)
    finally:
        producer.flush(10)
        ledger.close()


def test_sidecar_job_single_replay_and_explorer(bootstrap: str, tmp_path: Path) -> None:
    """A real sidecar over a failed_topic holding a 200 KB and a 2 MB dead letter among small
    ones, all for a topic taking 100 KB: one-record replays answer 422 too_large, the bulk job
    completes with both skipped too_large and every small one replayed once, the ledger has
    no entry for the skipped ones, and the explorer's job page says why they were skipped."""
    env = create_deployment(bootstrap, tmp_path / "state")
    env.extra = {"RETRYD_REPLAY_MAX_PER_SECOND": "100000"}
    records, at = mixed_records(env.main)
    seed_large(bootstrap, env.failed, records)
    with SidecarProcess(env, tmp_path / "sidecar.log") as sidecar, sidecar.client() as c:
        # one record: a clear 422 naming the reason, nothing written, no ledger entry
        for name in ("big", "huge"):
            r = c.post(f"/v1/failed/0/{at[name]}/replay")
            assert r.status_code == 422, r.text
            body = r.json()
            assert body["error"] == TOO_LARGE and "max.message.bytes" in body["detail"], body
            assert c.get(f"/v1/failed/0/{at[name]}").json()["replayed"] is None
        # a bulk job: done, the two skipped too_large, every other one replayed
        job = c.post("/v1/replays", json={"max_per_second": 5000}).json()
        snap = wait_job(c, job["id"])
        assert snap["state"] == "completed" and snap["failed"] == 0, pretty(snap)
        assert (snap["replayed"], snap["skipped"]) == (SMALL, 2), pretty(snap)
        assert snap["skipped_reasons"] == {TOO_LARGE: 2}, pretty(snap)
        assert snap["errors"] == [], pretty(snap)
        for name in ("big", "huge"):
            assert c.get(f"/v1/failed/0/{at[name]}").json()["replayed"] is None
        small = next(o for o in range(len(records)) if o not in at.values())
        assert c.get(f"/v1/failed/0/{small}").json()["replayed"] is not None

        with httpx.Client(base_url=sidecar.url, timeout=60, follow_redirects=False) as ui:
            sign_in(ui, TOKEN)
            page = ui.get(f"/ui/jobs/{job['id']}")
            assert page.status_code == 200, page.text[-800:]
            assert f"{TOO_LARGE} 2" in page.text, page.text[-2000:]
            # one record from the explorer: the API's status and error code, on the page
            found = re.search(r'name="csrf" value="([^"]+)"', page.text)
            assert found is not None
            form = {"csrf": found[1], "mode": "one", "topic": env.failed}
            refused = ui.post("/ui/replay", data={**form, "record": f"0:{at['big']}"})
            assert refused.status_code == 422, refused.text[-2000:]
            assert f"Error code: {TOO_LARGE}" in refused.text, refused.text[-2000:]
            assert "max.message.bytes" in refused.text
        assert c.get(f"/v1/failed/0/{at['big']}").json()["replayed"] is None
    copies = read_topic(bootstrap, env.main)  # every copy was acknowledged: read to the end
    sources = [dict(r.headers)[REPLAYED_FROM].decode() for r in copies]
    assert len(sources) == len(set(sources)) == SMALL  # each small one once
    assert not {f"{env.failed}/0/{at[n]}" for n in ("big", "huge")} & set(sources)


def test_cli_replay_skips_and_succeeds(bootstrap: str, tmp_path: Path) -> None:
    """`retryd replay` runs the same job: exit 0, the skip reason in its summary."""
    env = create_deployment(bootstrap, tmp_path / "state")
    records, _ = mixed_records(env.main)
    seed_large(bootstrap, env.failed, records)
    done = replay_cli(env, "--original-topic", env.main, "--rate", "5000", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    snap = json.loads(done.stdout.strip().splitlines()[-1])
    assert (snap["state"], snap["replayed"], snap["failed"]) == ("completed", SMALL, 0), snap
    assert snap["skipped_reasons"] == {TOO_LARGE: 2}, snap
    assert len(read_topic(bootstrap, env.main, expect=SMALL)) == SMALL
    # again, as a person reads it: nothing new, the reasons in the summary, still exit 0
    again = replay_cli(env, "--original-topic", env.main, "--rate", "5000")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "skipped, by reason" in again.stdout, again.stdout
    assert TOO_LARGE in again.stdout and "already_replayed" in again.stdout, again.stdout
    assert len(read_topic(bootstrap, env.main)) == SMALL
