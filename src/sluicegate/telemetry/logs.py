"""Logging for the process: a line for people (`--log-format text`) or one JSON object a line (`json`).

A JSON line has `time` (UTC, RFC 3339, milliseconds), `level`, `logger`, `message`, the `request_id` of the
request being served when the line was written (a context variable the request context middleware sets, so
every line a request causes carries it, not only the access line), the `trace_id` and `span_id` when a trace is
being recorded, `exception` with the traceback for an error, and the structured fields a line was given
(`log.info(..., extra={"fields": {...}})`: the access line's route, status, key id, tokens and stage times).
Nothing here reads request headers or bodies: what a line holds is what its caller chose, and no caller passes
a secret or a prompt.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
from contextvars import ContextVar
from typing import Any

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


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    """The root logger writes to stderr at `level` in `fmt` (`text` or `json`); replaces what was there."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):  # through the root handler, in the same format
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True


__all__ = ["REQUEST_ID", "TEXT_FORMAT", "JsonFormatter", "setup_logging"]
