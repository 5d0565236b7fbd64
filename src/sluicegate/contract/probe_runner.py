"""Send probes to a server (over a socket, or in process through any httpx.Client) and grade the answers.

Two gradings, both always computed:
- strict (our contract): the exact status; for an error, the envelope `{"error": {type, code, message, param,
  request_id}}` (on Anthropic's routes `{"type": "error", "error": {...}, "request_id"}`) with the expected
  `type` and `request_id` equal to the `X-Request-Id` header;
- loose (any server): the status class (2xx vs 4xx vs 5xx); for an error, a JSON object with an `error` that
  carries a message (OpenAI's and llama.cpp's shapes both pass).
Whatever the grading: a 2xx for a probe that should be refused is *silently accepted*; a response containing
the probe's marker *echoed* the input; a 5xx or no answer is a failure.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from sluicegate.contract.probes import MARKER, Probe

READ_CAP = 1 << 20  # read at most this much of any answer
_ENVELOPE_KEYS = ("type", "code", "message", "param", "request_id")


@dataclass(slots=True)
class Result:
    probe: Probe
    status: int | None  # None: no answer (connection error or timeout)
    elapsed_ms: float
    size: int = 0  # bytes of the answer's body (read up to READ_CAP)
    transport_error: str | None = None
    error_type: str | None = None  # error.type when the answer has one
    envelope: bool = False  # our full envelope, with the header's request id
    loose_envelope: bool = False  # an error object with a message
    request_id: bool = False  # the answer carries X-Request-Id
    echoed: bool = False
    warnings: list[str] = field(default_factory=list)
    failed_checks: list[str] = field(default_factory=list)

    @property
    def status_ok(self) -> bool:
        return self.status == self.probe.expect_status

    @property
    def class_ok(self) -> bool:
        return self.status is not None and self.status // 100 == self.probe.expect_status // 100

    @property
    def type_ok(self) -> bool:
        return self.probe.expect_type is None or self.error_type == self.probe.expect_type

    @property
    def is_error(self) -> bool:
        return self.status is not None and self.status >= 400

    @property
    def server_error(self) -> bool:
        return self.status is None or self.status >= 500

    @property
    def silently_accepted(self) -> bool:
        return self.probe.refuses and self.status is not None and 200 <= self.status < 300

    def passed(self, strict: bool = True) -> bool:
        if self.server_error or self.silently_accepted or self.echoed or self.failed_checks:
            return False
        if strict:
            ok = self.status_ok and self.type_ok and self.request_id
            return ok and (self.envelope or not self.is_error)
        return self.class_ok and (self.loose_envelope or not self.is_error)

    def as_dict(self) -> dict[str, Any]:
        p = self.probe
        return {
            "name": p.name,
            "method": p.method,
            "path": p.path[:80],
            "note": p.note,
            "expect_status": p.expect_status,
            "expect_type": p.expect_type,
            "status": self.status,
            "error_type": self.error_type,
            "envelope": self.envelope,
            "loose_envelope": self.loose_envelope,
            "request_id": self.request_id,
            "echoed": self.echoed,
            "silently_accepted": self.silently_accepted,
            "failed_checks": self.failed_checks,
            "transport_error": self.transport_error,
            "elapsed_ms": round(self.elapsed_ms, 2),
            "size": self.size,
            "passed_strict": self.passed(True),
            "passed_loose": self.passed(False),
        }


def _grade(result: Result, resp: httpx.Response, data: bytes) -> None:
    p = result.probe
    rid = resp.headers.get("x-request-id")
    result.request_id = bool(rid)
    result.echoed = p.marker and MARKER.encode() in data
    if p.body is not None and not isinstance(p.body, bytes):
        result.echoed = result.echoed or result.size >= READ_CAP  # a huge body must not come back
    try:
        doc = json.loads(data) if data else None
    except ValueError:
        doc = None
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict) and isinstance(doc, dict) and doc.get("type") == "error" and "request_id" not in err:
        err = {**err, "request_id": doc.get("request_id")}  # Anthropic's shape: the id beside `error`
    if isinstance(err, dict):
        result.error_type = err.get("type") if isinstance(err.get("type"), str) else None
        result.loose_envelope = isinstance(err.get("message"), str) and bool(err["message"])
        result.envelope = (
            result.loose_envelope
            and all(k in err for k in _ENVELOPE_KEYS)
            and isinstance(err["type"], str)
            and isinstance(err["request_id"], str)
            and err["request_id"] == rid
            and all(err[k] is None or isinstance(err[k], str) for k in ("code", "param"))
        )
    elif isinstance(err, str) and err:  # `{"error": "text"}`: loose only
        result.loose_envelope = True
    if isinstance(doc, dict) and isinstance(doc.get("warnings"), list):
        result.warnings = [w for w in doc["warnings"] if isinstance(w, str)]
    for check in p.checks:
        if not _check(check, p, resp, result):
            result.failed_checks.append(check)


def _check(check: str, p: Probe, resp: httpx.Response, result: Result) -> bool:
    sent = dict(p.headers).get("x-request-id")
    got: str | None = resp.headers.get("x-request-id")
    if check == "warning":
        return bool(result.warnings)
    if check == "echo_request_id":
        return got == sent
    if check == "new_request_id":
        return bool(got) and got != sent
    if check == "retry_after":
        return str(resp.headers.get("retry-after", "")).isdigit()
    raise ValueError(f"unknown probe check {check!r} in {p.name}")


def run_probe(client: httpx.Client, probe: Probe, *, timeout: float | None = None) -> Result:
    """Send one probe; `timeout` (seconds) overrides the client's own."""
    headers = dict(probe.headers)
    content: Any = probe.body() if callable(probe.body) else probe.body
    if probe.content_length is not None:
        headers["content-length"] = str(probe.content_length)
    start = time.perf_counter()
    try:
        # no timeout argument at all for the client's own: a test client may be an httpx2 one, whose
        # use-the-default marker is not httpx's
        limit: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        with client.stream(probe.method, probe.path, content=content, headers=headers, **limit) as resp:
            data = bytearray()
            for chunk in resp.iter_bytes():
                data += chunk[: READ_CAP - len(data)]
                if len(data) >= READ_CAP:
                    break
            result = Result(probe, resp.status_code, (time.perf_counter() - start) * 1e3, size=len(data))
            _grade(result, resp, bytes(data))
            return result
    except httpx.HTTPError as exc:
        return Result(probe, None, (time.perf_counter() - start) * 1e3, transport_error=type(exc).__name__)


def run_probes(
    client: httpx.Client,
    probes: Iterable[Probe],
    *,
    timeout: float | None = None,
) -> list[Result]:
    return [run_probe(client, p, timeout=timeout) for p in probes]


@dataclass(frozen=True, slots=True)
class Totals:
    probes: int
    by_class: dict[str, int]  # "2xx", "4xx", "5xx", "none", ...
    status_exact: int
    errors: int  # answers with status >= 400
    envelope: int  # of those, in our full envelope
    loose_envelope: int  # of those, with an error object and a message
    request_id: int  # answers carrying X-Request-Id
    silently_accepted: int
    echoed: int
    failed_checks: int
    passed_strict: int
    passed_loose: int

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def totals(results: Sequence[Result]) -> Totals:
    by_class: dict[str, int] = {}
    for r in results:
        key = "none" if r.status is None else f"{r.status // 100}xx"
        by_class[key] = by_class.get(key, 0) + 1
    errors = [r for r in results if r.is_error]
    return Totals(
        probes=len(results),
        by_class=dict(sorted(by_class.items())),
        status_exact=sum(r.status_ok for r in results),
        errors=len(errors),
        envelope=sum(r.envelope for r in errors),
        loose_envelope=sum(r.loose_envelope for r in errors),
        request_id=sum(r.request_id for r in results),
        silently_accepted=sum(r.silently_accepted for r in results),
        echoed=sum(r.echoed for r in results),
        failed_checks=sum(bool(r.failed_checks) for r in results),
        passed_strict=sum(r.passed(True) for r in results),
        passed_loose=sum(r.passed(False) for r in results),
    )
