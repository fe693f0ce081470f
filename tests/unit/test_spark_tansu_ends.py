"""Partition ends checked against a fetch (issue 23): which answer is used, and when the broker's
ListOffsets is named as wrong; the native connector gets retryd's planned offsets."""

from __future__ import annotations

import json

from retryd.pipeline.native import native_options
from retryd.pipeline.offsets import EndCheck, OffsetRange, checked_end

TP = ("dlq", 0)


def test_agreeing_answers_give_that_end() -> None:
    assert checked_end(TP, EndCheck(40, 40)) == (40, None)


def test_records_appended_between_the_requests_are_not_a_contradiction() -> None:
    assert checked_end(TP, EndCheck(40, 43, relisted=43)) == (43, None)
    assert checked_end(TP, EndCheck(40, 43, relisted=45)) == (43, None)


def test_a_list_offsets_below_the_fetch_after_it_is_named() -> None:
    """Tansu: 20 records in one batch, ListOffsets says 1 before and after the fetch."""
    end, problem = checked_end(TP, EndCheck(1, 20, relisted=1))
    assert end == 20
    assert problem == (
        "dlq[0]: ListOffsets answered end offset 1 after a fetch had shown records up to offset 19"
    )


def test_a_listed_end_the_fetch_does_not_reach_is_named_and_not_used() -> None:
    end, problem = checked_end(TP, EndCheck(50, 40))
    assert end == 40
    assert problem == (
        "dlq[0]: ListOffsets answered end offset 50, but a fetch's high watermark is 40"
    )


def test_native_options_take_the_planned_ranges_instead_of_the_offset_options() -> None:
    ranges = [OffsetRange("dlq", 0, 3, 20), OffsetRange("dlq", 1, 0, 0)]
    mapped = native_options(
        {
            "topics": "dlq",
            "startingOffsets": "earliest",
            "endingTimestamp": "1700000000000",
            "maxRecordsPerPartition": "10",
        },
        ranges,
    )
    assert json.loads(mapped["startingOffsets"]) == {"dlq": {"0": 3, "1": 0}}
    assert json.loads(mapped["endingOffsets"]) == {"dlq": {"0": 20, "1": 0}}
    assert "endingTimestamp" not in mapped and mapped["maxRecordsPerPartition"] == "10"
