"""Rendering a limiter's answer over HTTP: the rate-limit headers and the refusals. Pure functions.

Every response of a limited key carries (names are case-insensitive; OpenAI's lowercase forms are the same):

- `X-RateLimit-Limit-Tokens`: the capacity;
- `X-RateLimit-Remaining-Tokens`: whole tokens in the bucket now (after this request's reservation);
- `X-RateLimit-Reset`: seconds until the bucket is full again, an integer delta rounded up;
- `x-ratelimit-reset-tokens`: the same as OpenAI writes it, a Go-style duration (`6ms`, `1.2s`, `6m0s`), to
  the millisecond, rounded up.

A refusal adds `Retry-After` (integer seconds, rounded up, at least 1 for any real wait) and `retry-after-ms`
(the official OpenAI SDKs prefer it). A request above the capacity adds `x-should-retry: false`, which those
SDKs honour before anything else: no wait makes it fit.
"""

from __future__ import annotations

import math

from sluicegate.refusal import Rejected
from sluicegate.tenancy.ratelimit.bucket import BucketState, BucketVerdict, Decision

_TOLERANCE_S = 1e-9  # float noise in a computed wait must not round a whole second (or millisecond) up


def ceil_seconds(seconds: float) -> int:
    """Whole seconds, rounded up; at least 1 for any wait above the tolerance, 0 for none."""
    return max(0, math.ceil(seconds - _TOLERANCE_S))


def ceil_ms(seconds: float) -> int:
    return max(0, math.ceil(seconds * 1000 - _TOLERANCE_S * 1000))


def go_duration(seconds: float) -> str:
    """A wait as OpenAI's `x-ratelimit-reset-*` headers write it: Go's `time.Duration` format, to the ms.

    Under a second: `0s`, `6ms`, `999ms`. From a second: hours, minutes, then seconds with up to three
    decimals and no trailing zeros: `1s`, `1.2s`, `59.999s`, `1m0s`, `1m30s`, `6m0s`, `1h0m0s`, `2h3m4.5s`.
    Go's `time.ParseDuration` (what Go clients use to read it) parses every one of these back.
    """
    ms = ceil_ms(seconds)
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, frac = divmod(rest, 1000)
    secs = f"{whole}.{frac:03d}".rstrip("0") if frac else str(whole)
    out = f"{hours}h" if hours else ""
    if hours or minutes:
        out += f"{minutes}m"
    return f"{out}{secs}s"


def rate_limit_headers(state: Decision | BucketState | None) -> dict[str, str]:
    """The headers for any response of a limited key; empty for an unlimited or unmetered one (None/UNMETERED)."""
    if state is None or (isinstance(state, Decision) and state.outcome is BucketVerdict.UNMETERED):
        return {}
    return {
        "X-RateLimit-Limit-Tokens": str(state.limit),
        "X-RateLimit-Remaining-Tokens": str(state.remaining),
        "X-RateLimit-Reset": str(ceil_seconds(state.reset_s)),
        "x-ratelimit-reset-tokens": go_duration(state.reset_s),
    }


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


def _secs(seconds: float) -> str:
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + " s"


def refused(decision: Decision, param: str | None = None) -> Rejected:
    """The refusal of a refused decision: 429 `rate_limit_exceeded` (with the wait as its retry hint) or 413
    `request_exceeds_capacity`; `refusal_headers` gives the headers it is sent with.

    `param` names the request's new-token field (`max_tokens`, `max_new_tokens`), which is what a client
    lowers to fit the capacity; it is only set on the 413. Raises ValueError for an admitted decision.
    """
    if decision.outcome is BucketVerdict.LIMITED:
        assert decision.retry_after_s is not None
        wait = decision.retry_after_s
        owed = (
            f"the key owes {decision.debt} tokens used beyond earlier reservations (capacity {decision.limit})"
            if decision.debt
            else f"the key has {decision.remaining} of its {decision.limit} tokens left"
        )
        return Rejected(
            "rate_limit_exceeded",
            f"this request may cost {_tokens(decision.cost)} (prompt plus new tokens); {owed}; "
            f"it fits in {_secs(wait)}",
            code="tokens",
            retry_after=max(1, ceil_seconds(wait)),
        )
    if decision.outcome is BucketVerdict.TOO_LARGE:
        return Rejected(
            "request_exceeds_capacity",
            f"this request may cost {_tokens(decision.cost)} (prompt plus new tokens); the key's capacity is "
            f"{decision.limit}, so it can never be admitted: ask for fewer new tokens or send a shorter prompt"
            + ("" if param else " (a request that sets no new-token limit may generate to the end of the "
               "context window, and is priced so: set one)"),
            param=param,
            code="tokens",
        )
    raise ValueError(f"a {decision.outcome.value} decision is not a refusal")


def refusal_headers(decision: Decision) -> dict[str, str]:
    """The headers a refused decision is sent with: the bucket's, and `retry-after-ms` (429) or
    `x-should-retry: false` (413). `Retry-After` is the refusal's own retry hint, rendered with the envelope."""
    headers = rate_limit_headers(decision)
    if decision.outcome is BucketVerdict.LIMITED:
        assert decision.retry_after_s is not None
        headers["retry-after-ms"] = str(max(1, ceil_ms(decision.retry_after_s)))
    elif decision.outcome is BucketVerdict.TOO_LARGE:
        headers["x-should-retry"] = "false"
    return headers


def unavailable(retry_after_s: int = 1) -> Rejected:
    """503 `rate_limiter_unavailable`: the shared limiter did not answer and the server fails closed."""
    return Rejected(
        "rate_limiter_unavailable",
        "the rate limiter is unavailable, so no request can be admitted; retry shortly",
        retry_after=retry_after_s,
    )
