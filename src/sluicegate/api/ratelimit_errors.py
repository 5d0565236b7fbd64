"""The rate limiter's refusals as the serving layer's errors: tenancy's refusal (no HTTP in it) sent with the
bucket's headers (tenancy/ratelimit/headers.py)."""

from __future__ import annotations

from sluicegate.serving.errors import ApiError
from sluicegate.tenancy.ratelimit import Decision, refusal_headers, refused, unavailable


def refusal_error(decision: Decision, param: str | None = None) -> ApiError:
    """429 `rate_limit_exceeded` or 413 `request_exceeds_capacity`, with the bucket's headers; ValueError for an
    admitted decision."""
    return ApiError.of(refused(decision, param), refusal_headers(decision))


def unavailable_error(retry_after_s: int = 1) -> ApiError:
    """503 `rate_limiter_unavailable`: the shared limiter did not answer and the server fails closed."""
    return ApiError.of(unavailable(retry_after_s))
