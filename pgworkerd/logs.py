"""Logging: one line per event, human-readable or JSON lines; passwords are masked."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from pgworkerd.db import mask_password


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        ms = int(record.msecs)
        line = f"{ts}.{ms:03d}Z {record.levelname:<7} {mask_password(record.getMessage())}"
        if record.exc_info:
            line += "\n" + mask_password(self.formatException(record.exc_info))
        return line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "msg": mask_password(record.getMessage()),
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exception"] = mask_password(self.formatException(record.exc_info))
        return json.dumps(entry, default=str)


def setup(fmt: str = "text", level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _TextFormatter())
    root = logging.getLogger("pgworkerd")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def event(logger: logging.Logger, message: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log a job event: the text line carries the fields readably, JSON carries them as keys."""
    logger.log(level, message, extra={"fields": {"event": message.split(" ", 1)[0], **fields}})
