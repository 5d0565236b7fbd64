"""A key's count limits on the requests that create work (pure ASGI), inside auth, before the body is read.

Beside, never instead of, the token bucket (api/middleware/ratelimit.py):

- **requests in flight** (`max_concurrent`, else `--default-max-concurrent`): a slot is taken before the body
  is read and given back when the response has ended (a stream at its end, a client that left when it left);
  none free: 429 `rate_limit_exceeded`, `code: concurrent_requests`, `Retry-After: 1` (a slot frees when
  another request of the key ends, which no clock can say);
- **requests per minute** (`rpm`, else `--default-rpm`): a bucket of `rpm` requests refilled at `rpm/60` a
  second, in the same limiter as the tokens (in process or Redis, `<key id>:requests`); empty: 429
  `rate_limit_exceeded`, `code: requests`, with the exact `Retry-After` and `retry-after-ms`. Every response
  of such a key carries OpenAI's `X-RateLimit-Limit-Requests`, `X-RateLimit-Remaining-Requests` and
  `x-ratelimit-reset-requests`.

"Requests that create work" are the POSTs of the metered routes (the route registry's `work`: the ones the
usage ledger counts); reading a stored result, listing models or batch jobs (which run at batch priority,
apart) count for neither. A refused request reserved nothing: a refusal by the request count gives its
concurrency slot back.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluicegate.api.envelope import send_error
from sluicegate.api.middleware.auth import api_key_of
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.ratelimit_errors import unavailable_error
from sluicegate.registry import route_for
from sluicegate.serving.errors import ApiError
from sluicegate.tenancy.ratelimit import BucketVerdict, Decision, RateLimiterUnavailable, TokenLimit
from sluicegate.tenancy.ratelimit.headers import ceil_ms, ceil_seconds, go_duration

if TYPE_CHECKING:
    from sluicegate.api.tenancy import Tenancy

log = logging.getLogger("sluicegate.ratelimit")


def request_headers(d: Decision) -> dict[str, str]:
    """OpenAI's request-count headers for a decision of the requests bucket."""
    if d.outcome is BucketVerdict.UNMETERED:
        return {}
    return {"X-RateLimit-Limit-Requests": str(d.limit), "X-RateLimit-Remaining-Requests": str(d.remaining),
            "x-ratelimit-reset-requests": go_duration(d.reset_s)}


def requests_refusal(d: Decision) -> ApiError:
    assert d.retry_after_s is not None
    wait = d.retry_after_s
    return ApiError("rate_limit_exceeded", f"this API key may make {d.limit} requests a minute and has none left; "
                    f"the next fits in {wait:.3f}".rstrip("0").rstrip(".") + " s", code="requests",
                    retry_after=max(1, ceil_seconds(wait)),
                    headers={**request_headers(d), "retry-after-ms": str(max(1, ceil_ms(wait)))})


def concurrency_refusal(limit: int) -> ApiError:
    return ApiError("rate_limit_exceeded", f"this API key may have {limit} requests in flight at once and has "
                    f"{limit}; retry when one of them has ended", code="concurrent_requests", retry_after=1)


class KeyLimitsMiddleware:
    def __init__(self, app: ASGIApp, tenancy: Tenancy) -> None:
        self.app = app
        self.tenancy = tenancy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = api_key_of(scope) if scope["type"] == "http" else None
        if key is None or scope.get("method") != "POST" or not route_for(scope["path"]).work:
            await self.app(scope, receive, send)
            return
        rl = self.tenancy.config.ratelimit
        rpm = key.rpm if key.rpm is not None else rl.default_rpm
        most = key.max_concurrent if key.max_concurrent is not None else rl.default_max_concurrent
        if rpm is None and most is None:
            await self.app(scope, receive, send)
            return
        ctx = context_of(scope)
        holder = f"{self.tenancy.instance}:{ctx.engine_id}"
        held = False
        try:
            headers: dict[str, str] = {}
            try:
                if most is not None:
                    slot = await self.tenancy.concurrency.acquire(key.id, holder, most)
                    if not slot.granted:
                        await send_error(send, concurrency_refusal(most), ctx.request_id)
                        return
                    held = True
                if rpm is not None:
                    d = await self.tenancy.limiter.reserve(f"{key.id}:requests", 1, TokenLimit(burst=rpm, tpm=rpm))
                    if d.outcome is BucketVerdict.LIMITED:
                        await send_error(send, requests_refusal(d), ctx.request_id)
                        return
                    headers = request_headers(d)
            except RateLimiterUnavailable:
                await send_error(send, unavailable_error(), ctx.request_id)
                return

            async def send_with_headers(message: Message) -> None:
                if message["type"] == "http.response.start" and headers:
                    have = {k.lower() for k, _ in message.get("headers", [])}
                    extra = [(k.lower().encode(), v.encode()) for k, v in headers.items()
                             if k.lower().encode() not in have]
                    message = {**message, "headers": [*message.get("headers", []), *extra]}
                await send(message)

            await self.app(scope, receive, send_with_headers)
        finally:
            if held:
                await self.tenancy.concurrency.release(key.id, holder)


__all__ = ["KeyLimitsMiddleware", "concurrency_refusal", "request_headers", "requests_refusal"]
