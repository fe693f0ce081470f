"""JSON log lines: one object per line, the documented fields, nothing else of the record."""

from __future__ import annotations

import json
import logging

from retryd.runtime.logs import JsonFormatter


def _record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("retryd.worker", logging.WARNING, __file__, 1, msg, args, None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_json_line_has_the_documented_fields() -> None:
    line = JsonFormatter().format(_record("routed %s to %s", "a\nb", "retry_5m"))
    assert "\n" not in line
    body = json.loads(line)
    assert set(body) == {"time", "level", "logger", "message", "process"}
    assert body["level"] == "WARNING" and body["logger"] == "retryd.worker"
    assert body["message"] == "routed a\nb to retry_5m"
    assert body["time"].endswith("+00:00")


def test_record_coordinates_and_exceptions_are_kept_other_attributes_are_not() -> None:
    record = _record("x", topic="orders", partition=3, offset=17, password="hunter2")
    body = json.loads(JsonFormatter().format(record))
    assert (body["topic"], body["partition"], body["offset"]) == ("orders", 3, 17)
    assert "hunter2" not in json.dumps(body)
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = _record("failed")
        record.exc_info = sys.exc_info()
    body = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in body["exception"]
