"""The ``serve`` command's log on stderr: plain text, or one JSON object a line for log collectors
(``server.log_format``, ``agentcell serve --log-format json``).

A JSON line holds ``ts`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``, and ``exc`` (the traceback)
when there is one. Every logger of the process writes through it (uvicorn's too); agentcell's at INFO, the
others at WARNING.
"""

from __future__ import annotations

import datetime
import logging
import sys
from typing import Literal

import msgspec

__all__ = ["JsonFormatter", "configure"]

_encode = msgspec.json.Encoder().encode


class JsonFormatter(logging.Formatter):
    """A record as one line of JSON."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return _encode(line).decode()


def configure(log_format: Literal["text", "json"]) -> logging.Handler:
    """Log every record of the process to stderr in ``log_format``; the handler added (to the root)."""
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > logging.WARNING:
        root.setLevel(logging.WARNING)
    logging.getLogger("agentcell").setLevel(logging.INFO)
    return handler
