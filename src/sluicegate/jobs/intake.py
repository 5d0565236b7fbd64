"""Reading a job's input into items: OpenAI's strict validation, and the seed shape's keep-going rule.

OpenAI's Batch API checks the whole input file before any request runs: a line that is not JSON, lacks
`custom_id`/`method`/`url`/`body`, repeats a `custom_id`, names another endpoint than the batch's, or asks
for `stream: true` fails the batch (`errors.data[]` with the line number), and nothing runs. The seed shape
(`/v1/batch-predictions`) keeps every good line: a bad one becomes its own failed item carrying `{line, code,
message}`, and the rest run (docs/jobs.md says why the two differ). Either way items are written in pages as
the input is read, so an input is never held whole in memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sluicegate.jobs import states as S
from sluicegate.jobs.files import MAX_LINE
from sluicegate.jobs.store import JobStore
from sluicegate.refusal import Rejected
from sluicegate.serving import predictions
from sluicegate.serving.strict_json import MAX_DEPTH, parse_json

LINE_DEPTH = MAX_DEPTH + 1  # an OpenAI line's envelope around its body: the body nests as deep as a request's
PAGE = 500  # items inserted per statement
MAX_ERRORS = 100  # validation errors reported on a failed OpenAI batch


class TooManyItems(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


def estimate_tokens(body: dict[str, Any], raw_len: int, estimate_new: int) -> int:
    """A cheap cost estimate with no tokenizer: about four bytes a token of input, plus the new tokens the
    request may generate (its own limit, else the server's estimate); what the enqueued-token limit counts."""
    new = estimate_new
    for name in ("max_completion_tokens", "max_tokens"):
        if isinstance(body.get(name), int):
            new = body[name]
            break
    opts = body.get("options")
    if isinstance(opts, dict) and isinstance(opts.get("max_new_tokens"), int):
        new = opts["max_new_tokens"]
    return raw_len // 4 + max(0, int(new))


@dataclass(slots=True)
class Intake:
    jobs: JobStore
    job_id: str
    max_items: int
    estimate_new: int
    count: int = 0
    est_tokens: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    _rows: list[dict[str, Any]] = field(default_factory=list)
    _ids: set[str] = field(default_factory=set)

    def _add(self, row: dict[str, Any]) -> None:
        self.count += 1
        if self.count > self.max_items:
            raise TooManyItems(self.max_items)
        self._rows.append(row)
        if len(self._rows) >= PAGE:
            self.flush()

    def flush(self) -> None:
        if not self.errors:
            self.jobs.add_items(self.job_id, self._rows)
        self._rows.clear()

    def _error(self, line: int, code: str, message: str, param: str | None = None) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append({"code": code, "message": message, "param": param, "line": line})

    # -- OpenAI ------------------------------------------------------------------------------------------
    def openai_line(self, line: int, raw: bytes | None, endpoint: str) -> None:
        if raw is None:
            return self._error(line, "line_too_long", f"The line is over {MAX_LINE} bytes.")
        if not raw.strip():
            return
        try:
            obj = parse_json(raw, LINE_DEPTH)  # a request body's rules: depth, numbers, keys, Unicode
        except Rejected as exc:
            why = "" if exc.code == "syntax_error" else f": {_on_line(exc.message)}"
            return self._error(line, "invalid_json_line", f"This line is not parseable as valid JSON{why}.")
        if not isinstance(obj, dict):
            return self._error(line, "invalid_json_line", "This line is not a JSON object.")
        for name in ("custom_id", "method", "url", "body"):
            if name not in obj:
                return self._error(line, "missing_required_parameter", f"The line has no {name}.", name)
        custom_id, body = obj["custom_id"], obj["body"]
        if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
            return self._error(line, "invalid_custom_id", "custom_id must be a string of 1 to 512 characters.",
                               "custom_id")
        if obj["method"] != "POST":
            return self._error(line, "invalid_method", "The method must be POST.", "method")
        if obj["url"] != endpoint:
            return self._error(line, "mismatched_endpoint",
                               f"The line's url is not the batch's endpoint {endpoint}.", "url")
        if not isinstance(body, dict):
            return self._error(line, "invalid_request", "body must be a JSON object.", "body")
        if body.get("stream") is True:
            return self._error(line, "stream_unsupported", "Streaming is not supported in a batch.", "body.stream")
        if custom_id in self._ids:
            return self._error(line, "duplicate_custom_id",
                               "The custom_id for this request is a duplicate of another request.", "custom_id")
        self._ids.add(custom_id)
        text = json.dumps(body, separators=(",", ":"))
        self.est_tokens += estimate_tokens(body, len(text), self.estimate_new)
        self._add({"line": line, "custom_id": custom_id, "body": text})

    # -- the seed shape ----------------------------------------------------------------------------------
    def seed_item(self, line: int, obj: Any) -> None:
        """One prediction request; a bad one is kept as a failed item with its error record."""
        problem = _seed_problem(obj)
        if problem is not None:
            code, message = problem
            record = {"line": line, "code": code, "message": message}
            self._add({"line": line, "state": S.ITEM_FAILED, "status_code": 400, "result": json.dumps(record),
                       "result_writes": 1})
            return
        text = json.dumps(obj, separators=(",", ":"))
        self.est_tokens += estimate_tokens(obj, len(text), self.estimate_new)
        self._add({"line": line, "custom_id": None, "body": text})

    def seed_line(self, line: int, raw: bytes | None) -> None:
        if raw is None:
            self._add({"line": line, "state": S.ITEM_FAILED, "status_code": 413, "result_writes": 1,
                       "result": json.dumps({"line": line, "code": "line_too_long",
                                             "message": f"this line is over {MAX_LINE} bytes"})})
            return
        if not raw.strip():
            return
        try:
            obj = parse_json(raw)  # a request body's rules: depth, numbers, keys, Unicode
        except Rejected as exc:
            code, message = (("invalid_json_line", "this line is not valid JSON") if exc.code == "syntax_error"
                             else (exc.code or "invalid_json_line", _on_line(exc.message)))
            self._add({"line": line, "state": S.ITEM_FAILED, "status_code": 400, "result_writes": 1,
                       "result": json.dumps({"line": line, "code": code, "message": message})})
            return
        self.seed_item(line, obj)


def _on_line(message: str) -> str:
    """A body refusal's message (it never echoes the input) said of a line."""
    return message.replace("the body", "the line", 1)


def _seed_problem(obj: Any) -> tuple[str, str] | None:
    """The prediction request checked as `POST /v1/predictions` checks it (serving/predictions.py): a bad one
    is this line's error record, with the error's code and message."""
    try:
        predictions.parse(obj)
    except Rejected as exc:
        return exc.code or exc.type, exc.message
    return None
