"""Token-priced rate limits per API key: the cost bucket, in-process or in Redis, and its HTTP rendering.

See docs/ratelimits.md for the arithmetic and the failure choice. The Redis implementation is imported lazily
(`build_rate_limiter`, or `sluicegate.tenancy.ratelimit.redis_backend`), so a server without Redis never
imports redis-py.
"""

from sluicegate.tenancy.ratelimit.bucket import BucketState, BucketVerdict, Decision, TokenBuckets, TokenLimit
from sluicegate.tenancy.ratelimit.headers import (
    go_duration,
    rate_limit_headers,
    refusal_headers,
    refused,
    unavailable,
)
from sluicegate.tenancy.ratelimit.limiter import (
    FailOpen,
    InProcessRateLimiter,
    RateLimiter,
    RateLimiterUnavailable,
    build_concurrency_limiter,
    build_rate_limiter,
    resolve_limit,
)

__all__ = [
    "BucketState",
    "BucketVerdict",
    "Decision",
    "FailOpen",
    "InProcessRateLimiter",
    "RateLimiter",
    "RateLimiterUnavailable",
    "TokenBuckets",
    "TokenLimit",
    "build_concurrency_limiter",
    "build_rate_limiter",
    "go_duration",
    "rate_limit_headers",
    "refusal_headers",
    "refused",
    "resolve_limit",
    "unavailable",
]
