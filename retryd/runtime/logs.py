"""Log output: readable text lines, or one JSON object per line for log collectors.

``log_format = "json"`` (``RETRYD_LOG_FORMAT``, ``--log-format``) writes every record as
``{"time", "level", "logger", "message", "process"}``, plus ``topic``/``partition``/``offset``
when the record carries them (``log.info(..., extra={"topic": ...})``) and ``exception`` with
the traceback when there is one. Nothing else of the record is copied, so a JSON line never
holds more than its text twin: secrets are kept out of messages where they are written (API
tokens are named by id, librdkafka options redacted), and both formats print the same message.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s"
RECORD_FIELDS = ("topic", "partition", "offset")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "process": record.process,
        }
        for name in RECORD_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure(level: str = "INFO", fmt: str = "text") -> None:
    """(Re)configure the root logger: the CLI calls it first from flags and the environment,
    then again once the settings file is read; worker processes call it at start."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, str(level).upper(), logging.INFO))
