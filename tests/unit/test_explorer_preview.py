"""How dead letters' bytes reach a page: JSON pretty, UTF-8 text, hex; bounded; bidi and
control characters made visible; the overview's tallies and sparklines (pure logic)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from retryd.explorer import preview as pv
from retryd.explorer.overview import MAX_FINGERPRINTS, OTHER, Tally, buckets, sparkline_points
from retryd.policy import headers as h
from retryd.replay.records import FailedRecord, RecordFilter


def test_json_is_pretty_printed() -> None:
    shown = pv.preview(b'{"order": {"id": 7, "items": [1, 2]}}')
    assert shown.kind == "json" and not shown.truncated
    assert json.loads(shown.text) == {"order": {"id": 7, "items": [1, 2]}}
    assert '\n  "order": {' in shown.text


def test_text_and_scalars_stay_text() -> None:
    assert pv.preview("grüße".encode()).kind == "text"
    assert pv.preview(b"42").kind == "text"
    assert pv.preview(b'{"broken": ').kind == "text"
    assert pv.preview(b"[" * 100_000).kind == "text"  # too deep for the parser: text
    assert pv.preview(b'{"n": ' + b"9" * 100_000 + b"}").kind == "text"  # int too long
    assert pv.preview(None) == pv.Preview("none", "", 0, False)


def test_invalid_utf8_is_a_hex_dump() -> None:
    shown = pv.preview(b"\xff\xfe\x00\x01<script>")
    assert shown.kind == "hex"
    assert shown.text.startswith("00000000  ff fe 00 01 3c 73")
    assert "|....<script>|" in shown.text  # escaped by the template, like all text


def test_one_megabyte_is_cut_at_the_bound_with_its_size() -> None:
    for value in (b"A" * 1_000_000, b"\xff" * 1_000_000, json.dumps(["x"] * 200_000).encode()):
        shown = pv.preview(value, 4096)
        assert shown.truncated and shown.size == len(value)
        assert len(shown.text) <= 4096 * 5  # hex: about 4.2 characters per byte


def test_bidi_and_invisible_characters_are_shown_as_escapes() -> None:
    hostile = "invoice\u202egnp.exe\u2066x\u200b\x00\x1b[31m\ud800"
    shown = pv.neutralise(hostile)
    for raw in ("\u202e", "\u2066", "\u200b", "\x00", "\x1b", "\ud800"):
        assert raw not in shown
    assert "\\u202e" in shown and "\\u2066" in shown and "\\u0000" in shown
    assert pv.neutralise("a\nb\tc", keep_newlines=True) == "a\nb\tc"
    assert pv.neutralise("a\nb") == "a\\u000ab"
    assert "\\u202e" in pv.preview("x\u202ey".encode()).text


@given(st.binary(max_size=2000))
def test_any_bytes_preview_without_raising(data: bytes) -> None:
    shown = pv.preview(data, 512)
    assert shown.size == len(data)
    assert not any(0x202A <= ord(c) <= 0x202E or 0x2066 <= ord(c) <= 0x2069 for c in shown.text)
    pv.cell(data)


def test_cells_are_short_and_inert() -> None:
    assert pv.cell(None) == "(null)"
    assert pv.cell(b"<script>") == "<script>"  # autoescape's job
    assert pv.cell(b"x" * 1000).endswith("…") and len(pv.cell(b"x" * 1000)) == 201
    assert pv.cell(b"\xff\xfe").startswith("0x")
    assert pv.cell("é".encode() * 1000).endswith("…")  # cut inside a character: still text


def test_header_rows_keep_order_and_show_binary_as_hex() -> None:
    rows = pv.header_rows(
        [
            ("note", b'"><img src=x onerror=alert(1)>'),
            ("rtl\u202e", "a\u202eb".encode()),
            ("bin", b"\xff\x00\xfe"),
            ("nothing", None),
            ("big", b"v" * 10_000),
        ]
    )
    assert [r.kind for r in rows] == ["text", "text", "hex", "none", "text"]
    assert rows[0].value == '"><img src=x onerror=alert(1)>'
    assert rows[1].name == "rtl\\u202e" and rows[1].value == "a\\u202eb"
    assert rows[2].value == "ff 00 fe"
    assert rows[4].truncated and rows[4].size == 10_000 and len(rows[4].value) == pv.HEADER_MAX


def envelope(**over: object) -> dict[str, str | int | None]:
    env = h.Envelope(
        original_topic="orders",
        original_partition=1,
        original_offset=42,
        original_timestamp=1_700_000_000_000,
        retry_number=3,
        first_failure_timestamp=1_700_000_000_500,
        error_class="TimeoutError",
        error_message="order 81723 timed out after 30s",
        dead_reason="exhausted",
    )
    headers = h.routed_headers([], env)
    decoded = h.decode_lenient(headers)
    decoded.update(over)  # type: ignore[arg-type]
    return decoded


def test_decoded_headers_in_words() -> None:
    rows = dict(pv.decoded(envelope(retry_timestamp=1_700_000_060_000)))
    assert rows["Retry number"] == "3"
    assert rows["Dead reason"] == "exhausted"
    assert rows["Original coordinates"] == "orders / partition 1 / offset 42"
    assert rows["Due time"] == "2023-11-14T22:14:20Z (1700000060000)"
    assert rows["Error fingerprint"].endswith("order <num> timed out after <num>s")
    assert pv.decoded({}) == []
    assert pv.instant(10**30) == str(10**30)


def test_fingerprint_filter_matches_what_the_overview_groups() -> None:
    env = envelope()
    fp_id, _ = pv.record_fingerprint(env)
    rec = FailedRecord(
        "failed",
        0,
        5,
        1,
        b"k",
        b"v",
        h.routed_headers(
            [],
            h.Envelope(
                original_topic="orders",
                original_partition=1,
                original_offset=42,
                original_timestamp=1,
                retry_number=3,
                first_failure_timestamp=1,
                error_class="TimeoutError",
                error_message="order 1 timed out after 2s",
                dead_reason="exhausted",
            ),
        ),
    )
    assert RecordFilter(fingerprint=fp_id).matches(rec)
    assert not RecordFilter(fingerprint="0" * 12).matches(rec)
    assert RecordFilter(records=frozenset({(0, 5)})).matches(rec)
    assert not RecordFilter(records=frozenset({(0, 6)})).matches(rec)
    assert RecordFilter(records=frozenset({(0, 5)})).describe() == {"records": 1}


def test_tally_counts_waiting_by_reason_and_fingerprint() -> None:
    tally = Tally()
    for i in range(10):
        tally.add(envelope(), 1000 + i, replayed=i < 3)
    tally.add(envelope(retryd_dead_reason="malformed", retryd_error_class="X"), 500, False)
    assert tally.scanned == 11 and tally.waiting == 8
    assert tally.by_reason == {"exhausted": 7, "malformed": 1}
    top = tally.top()
    assert top[0].count == 7 and top[0].first_ms == 1003 and top[0].last_ms == 1009
    assert top[1].first_ms == top[1].last_ms == 500


def test_tally_is_bounded() -> None:
    tally = Tally(max_times=10)
    for i in range(MAX_FINGERPRINTS + 50):
        tally.add(envelope(retryd_error_class=f"E{i}"), i, False)
    assert len(tally.rows) == MAX_FINGERPRINTS + 1
    assert tally.rows[OTHER].count == 50
    assert all(len(r.times) <= 10 for r in tally.rows.values())
    assert len(tally.top(5)) == 5


def test_buckets_and_sparkline() -> None:
    assert buckets([0, 1, 30, 50, 99, 100, 200], 0, 100, 4) == [2, 1, 1, 2]
    assert buckets([], 0, 0, 3) == [0, 0, 0]
    points = sparkline_points([0, 5, 10])
    assert points == "0.0,23.0 60.0,12.0 120.0,1.0"
    assert sparkline_points([]) == ""
    assert sparkline_points([0, 0]) == "0.0,23.0 120.0,23.0"


def test_a_binary_key_is_hex_in_the_list_as_on_the_record_page() -> None:
    """The API hands a key that is not UTF-8 in base64; the list shows it as the record page
    does (hex), cut at a cell's bound, and an unreadable one as such."""
    import base64

    from retryd.explorer.routes import _binary_key

    assert _binary_key(base64.b64encode(b"\xff\xfe\x00ab").decode()) == "0xfffe006162"
    long = _binary_key(base64.b64encode(bytes(range(256))).decode())
    assert long.startswith("0x000102") and long.endswith("…") and len(long) == 2 + 120 + 1
    assert _binary_key("not base64!") == "(unreadable key)"
