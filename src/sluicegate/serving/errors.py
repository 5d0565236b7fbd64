"""The one error the serving layer raises; the API layer renders it as the envelope.

`type` values are stable and documented in docs/errors.md with the client's action; `message` may change.
Messages give the parameter and the numbers, never the client's input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# type -> HTTP status
STATUS: Mapping[str, int] = {
    "invalid_json": 400,
    "untrusted_host": 400,
    "cors_refused": 400,
    "malformed_http": 400,
    "request_timeout": 408,
    "headers_too_large": 431,
    "unsupported_transfer_encoding": 501,
    "unsupported_media_type": 415,
    "body_too_large": 413,
    "authentication_required": 401,
    "invalid_api_key": 401,
    "permission_denied": 403,
    "invalid_request": 422,
    "context_length_exceeded": 422,
    "prompt_too_long": 422,
    "idempotency_key_reused": 422,
    "deadline_too_short": 422,
    "not_found": 404,
    "model_not_found": 404,
    "method_not_allowed": 405,
    "idempotency_key_in_use": 409,
    "rate_limit_exceeded": 429,
    "budget_exceeded": 429,
    "request_exceeds_capacity": 413,
    "overloaded": 503,
    "rate_limiter_unavailable": 503,
    "not_ready": 503,
    "shutting_down": 503,
    "store_unavailable": 503,
    "internal_error": 500,
    "upstream_error": 502,
    "upstream_unavailable": 503,
    "deadline_exceeded": 504,
    "upstream_timeout": 504,
}


@dataclass(slots=True)
class ApiError(Exception):
    type: str
    message: str
    param: str | None = None
    code: str | None = None
    retry_after: int | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.type not in STATUS:
            raise ValueError(f"unknown error type {self.type!r}")

    @property
    def status(self) -> int:
        return STATUS[self.type]

    def __str__(self) -> str:
        return f"{self.type}: {self.message}"
