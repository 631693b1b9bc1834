"""Logging setup: key=value text (default) or one JSON object per line."""

from __future__ import annotations

import json
import logging
import time
from typing import Any


class JsonFormatter(logging.Formatter):
    """One JSON object per record; structured ``extra={"fields": {...}}`` values become top-level keys."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(entry, default=str)


def configure(level: int, fmt: str) -> None:
    """Configure the root logger once for a command (text or json)."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("psycopg.pool").setLevel(max(level, logging.ERROR))
    # psycopg's own warnings about connections it is cleaning up ("error ignored terminating
    # <AsyncPipeline … (user=… database=…)>") name the principal's role after a failed attempt: the
    # attempt is logged by the engine, redacted; these would undo the redaction
    logging.getLogger("psycopg").setLevel(max(level, logging.ERROR))
