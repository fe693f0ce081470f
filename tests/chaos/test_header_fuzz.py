"""Header fuzz through the whole worker, for both handler kinds (a Python callable and a real
HTTP business service): random header names and values, repeated and junk retryd headers, on
main-topic records and on records written straight into a tier. The worker never exits; every
message ends in exactly one terminal place (the one its kind and envelope call for), and the
handler sees every user header byte for byte on every hop."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.chaos.business import BusinessServer
from tests.chaos.fleet import CHAOS_HANDLER
from tests.chaos.fuzz import MALFORMED, main_headers, tier_headers
from tests.chaos.handler import header_digest
from tests.chaos.ledger import Spec, make_plan
from tests.chaos.report import ChaosReport
from tests.chaos.scale import MAX_RETRIES, Sizes, settle_budget
from tests.chaos.scenario import CALL_LOG, start
from tests.support import produce

SETTLE_S = settle_budget(300.0)
USABLE_SHARE = 0.6  # tier records with a usable envelope; the rest are malformed


@pytest.mark.chaos
@pytest.mark.parametrize("kind", ["python", "http"])
def test_header_fuzz_through_the_whole_worker(
    kind: str,
    bootstrap: str,
    tmp_path: Path,
    chaos_sizes: Sizes,
    chaos_rng: random.Random,
    chaos_report: ChaosReport,
) -> None:
    size, rng = chaos_sizes, chaos_rng
    main_plan = make_plan(size.fuzz_main, rng, f"fuzz-{kind}-m", MAX_RETRIES)
    usable = make_plan(round(size.fuzz_tier * USABLE_SHARE), rng, f"fuzz-{kind}-t", MAX_RETRIES)
    malformed = [
        Spec(f"fuzz-{kind}-x{i}", rng.choice(["ok", "poison"]), expect_override=MALFORMED)
        for i in range(size.fuzz_tier - len(usable))
    ]
    server = BusinessServer(tmp_path / CALL_LOG).start() if kind == "http" else None
    fold = kind == "http"
    sc = None
    try:
        sc = start(
            f"header_fuzz_{kind}",
            bootstrap,
            tmp_path,
            [*main_plan, *usable, *malformed],
            partitions=2,
            handler=server.url if server else CHAOS_HANDLER,
            digests={},
        )
        digests = sc.observer.logs[0].digests
        assert isinstance(digests, dict)
        group = sc.dep.settings.group_id
        main_records = []
        for spec in main_plan:
            headers = main_headers(rng)
            digests[spec.id] = header_digest(headers, fold_case=fold)
            main_records.append((spec.id.encode(), spec.value(h=1), headers))
        tier_records = []
        for spec in [*usable, *malformed]:
            headers = tier_headers(rng, sc.dep.main, group, usable=spec in usable)
            digests[spec.id] = header_digest(headers, fold_case=fold)
            tier_records.append((spec.id.encode(), spec.value(h=1), headers))
        rng.shuffle(tier_records)
        worker = sc.fleet.worker("w")
        produce(bootstrap, sc.dep.main, main_records)
        produce(bootstrap, sc.dep.tier("1s"), tier_records)
        rec, behind = sc.observer.settle(SETTLE_S)
        alive = worker.alive()
        code = sc.fleet.terminate(worker)
        rec = sc.observer.final()
    finally:
        if sc is not None:
            sc.close()
        if server is not None:
            server.stop()
    huge = sum(
        1
        for _, _, headers in main_records + tier_records
        if any(v is not None and len(v) >= 65536 for _, v in headers)
    )
    chaos_report.add(
        sc.row(
            rec,
            behind,
            len(main_records) + len(tier_records),
            fault=f"hostile headers ({kind} handler): random names and values (binary, "
            "non-UTF-8, non-ASCII UTF-8, huge, empty, null, CR/LF, NUL), repeated retryd "
            "headers; main-topic records and records written straight into a tier",
            handler_kind=kind,
            main_records=len(main_records),
            tier_records=len(tier_records),
            tier_malformed=len(malformed),
            records_with_huge_headers=huge,
            worker_exits=0 if alive else 1,
        )
    )
    sc.assert_settled(rec, behind)
    assert alive, f"the worker exited: {worker.output()[-3000:]}"
    assert code == 0, f"SIGTERM at the end: exit status {code}"
    assert rec.header_mismatches == 0, f"{rec.header_mismatches} calls saw altered user headers"
    if server is not None:
        assert server.bad_requests == 0, "retryd sent a request whose headers did not decode"
    print(f"\n{kind}: {rec.describe()} huge={huge}")
