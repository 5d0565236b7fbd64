"""Logging for the process: a line for people (`--log-format text`) or one JSON object a line (`json`).

A JSON line has `time` (UTC, RFC 3339, milliseconds), `level`, `logger`, `message`, the `request_id` of the
request being served when the line was written (a context variable the request context middleware sets, so
every line a request causes carries it, not only the access line), the `trace_id` and `span_id` when a trace is
being recorded, `exception` with the traceback for an error, and the structured fields a line was given
(`log.info(..., extra={"fields": {...}})`: the access line's route, status, key id, tokens and stage times).
Nothing here reads request headers or bodies: what a line holds is what its caller chose, and no caller passes
a secret or a prompt.

Every record is one line in either format. JSON escapes by itself; the text format escapes every control
character of the message (sluicegate/textsafe.py), so a path a client sent with `%0a` in it cannot start a
line that looks like a record of its own. A text record's traceback follows on lines that begin with `  | `,
which no record's first line does (the traceback's text is escaped the same way, line by line).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from contextvars import ContextVar
from typing import Any

from sluicegate.textsafe import escape

REQUEST_ID: ContextVar[str | None] = ContextVar("sluicegate_request_id", default=None)
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _trace_ids() -> tuple[str, str] | None:
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        if request_id:
            out["request_id"] = request_id
        ids = _trace_ids()
        if ids is not None:
            out["trace_id"], out["span_id"] = ids
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update({k: v for k, v in fields.items() if k not in out})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT`, the message on one line; a traceback after it, each of its lines marked `  | `."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return TEXT_FORMAT % {**record.__dict__, "message": escape(record.message)}

    def formatException(self, ei: Any) -> str:
        return "\n".join("  | " + escape(line) for line in super().formatException(ei).splitlines())

    def formatStack(self, stack_info: str) -> str:
        return "\n".join("  | " + escape(line) for line in stack_info.splitlines())


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    """The root logger writes to stderr at `level` in `fmt` (`text` or `json`); replaces what was there."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):  # through the root handler, in the same format
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


__all__ = ["REQUEST_ID", "TEXT_FORMAT", "JsonFormatter", "TextFormatter", "setup_logging"]
