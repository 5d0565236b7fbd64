"""Token-priced rate limits per API key (pure ASGI), inside auth (it needs the key), outside the routes.

The serving core knows a request's cost only once it has tokenised it, so admission is split:

1. here, before the route: the key's limit (`resolve_limit`: its `tpm`/`burst`, else the server's defaults;
   None: unlimited, and nothing below happens) becomes the request's reservation (`KeyAdmission`, left in
   the ASGI scope: `reservation_of`), which the work lifecycle (api/work.py) puts in the admission it hands
   to the serving core (serving/admission.py);
2. in the serving core, after the budget checks and before the engine sees anything: `reserve(cost)` with
   the core's one cost estimate (docs/serving.md); a refusal is 429 `rate_limit_exceeded` or 413
   `request_exceeds_capacity` (a request the bucket can never hold: a retry cannot fix it);
3. here, when the response has ended (streams and disconnects included): `settle` to the tokens really
   processed (`RequestContext.used()`, the figure the usage ledger records; prompt + generated:
   `TokenUsage.charged`): unused tokens go back, extra ones become a debt paid before the key's next
   admission.

Every response on a limited key carries the bucket's headers (`X-RateLimit-*`, `x-ratelimit-reset-tokens`),
a stream's at its start; a response refused before reserving shows the bucket as it stands (`peek`).
docs/ratelimits.md has the arithmetic and the Redis failure choice.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluicegate.api.middleware.auth import api_key_of
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.ratelimit_errors import refusal_error, unavailable_error
from sluicegate.serving.admission import Reservation
from sluicegate.serving.context import TokenUsage
from sluicegate.serving.errors import ApiError
from sluicegate.tenancy.budget import BudgetDecision, MonthlyBudgets
from sluicegate.tenancy.ratelimit import (
    BucketState,
    Decision,
    RateLimiter,
    RateLimiterUnavailable,
    TokenLimit,
    rate_limit_headers,
    resolve_limit,
)

if TYPE_CHECKING:
    from sluicegate.api.tenancy import Tenancy

BUDGET = "tokens (prompt plus generated) per calendar month, UTC"


def budget_refusal(verdict: BudgetDecision, cost: int) -> ApiError:
    """429 `budget_exceeded`: the key's monthly budget cannot hold this request; no retry before the month turns
    (`x-should-retry: false`; Retry-After says when it does)."""
    return ApiError("budget_exceeded", f"this request may cost {cost} tokens and the key has used {verdict.used} "
                    f"of its {verdict.budget} {BUDGET}; the budget renews at "
                    f"{verdict.resets_at.strftime('%Y-%m-%dT%H:%M:%SZ')}", code="monthly_tokens",
                    retry_after=verdict.reset_in_s(), headers={"x-should-retry": "false"})

log = logging.getLogger("sluicegate.ratelimit")


class KeyAdmission:
    """One request's reservation against its key's bucket and monthly budget (a serving `Reservation`)."""

    def __init__(self, limiter: RateLimiter, key_id: str, limit: TokenLimit | None,
                 budgets: MonthlyBudgets | None = None, budget: int | None = None) -> None:
        self._limiter = limiter
        self._key = key_id
        self._limit = limit
        self._budgets = budgets if budget is not None else None
        self._budget = budget
        self._budgeted = 0  # tokens reserved against the monthly budget
        self.decision: Decision | None = None
        self.remote = limiter.remote and limit is not None
        self._given_back: BucketState | None = None  # the bucket once a reservation was given back (`cancel`)
        self._limiter_down = False  # the limiter failed this request: no second call to it (a hung Redis costs
        # one bounded wait a request, as docs/ratelimits.md says, not two)

    async def reserve(self, cost: int, param: str | None = None) -> None:
        if self._budgets is not None and self._budget is not None:
            verdict = await self._budgets.reserve(self._key, self._budget, cost)
            if not verdict.allowed:
                raise budget_refusal(verdict, cost)
            self._budgeted = cost
        if self._limit is None:
            return
        try:
            decision = await self._limiter.reserve(self._key, cost, self._limit)
        except RateLimiterUnavailable:
            self._limiter_down = True
            self._give_back_budget(0)
            raise unavailable_error() from None
        self.decision = decision
        if not decision.allowed:
            self._give_back_budget(0)
            raise refusal_error(decision, param=param)

    def _give_back_budget(self, used: int) -> None:
        if self._budgets is not None and self._budgeted:
            self._budgets.settle(self._key, self._budgeted, used)
            self._budgeted = 0

    async def cancel(self) -> None:
        """Give the reservation back now: the request will not run (its Idempotency-Key's stored answer is
        replayed, or the key is another request's), so its response shows the bucket without it."""
        self._give_back_budget(0)
        reserved = self.decision.reserved if self.decision is not None else 0
        if reserved == 0 or self._limit is None:
            return
        try:
            self._given_back = await self._limiter.settle(self._key, reserved, 0, self._limit)
        except RateLimiterUnavailable:
            log.warning("could not give back a reservation of key %s (%d tokens)", self._key, reserved)
            return
        self.decision = None

    async def headers(self) -> dict[str, str]:
        if self._limit is None or self._limiter_down:
            return {}
        if self.decision is not None:
            return rate_limit_headers(self.decision)
        if self._given_back is not None:
            return rate_limit_headers(self._given_back)
        try:
            return rate_limit_headers(await self._limiter.peek(self._key, self._limit))
        except RateLimiterUnavailable:
            return {}

    async def settle(self, used: TokenUsage) -> None:
        actual = used.charged
        self._give_back_budget(actual)
        reserved = self.decision.reserved if self.decision is not None else 0
        if reserved == 0 or self._limit is None:
            return
        try:
            await self._limiter.settle(self._key, reserved, actual, self._limit)
        except RateLimiterUnavailable:
            log.warning("could not settle a reservation of key %s (%d reserved, %d used)", self._key, reserved,
                        actual)


_RESERVATION = "sluicegate.reservation"


def reservation_of(scope: Scope) -> Reservation | None:
    """The request's reservation against its key's limits (None: the key has none, or auth is off)."""
    found = scope.get("state", {}).get(_RESERVATION)
    return found if isinstance(found, KeyAdmission) else None


class RateLimitMiddleware:
    def __init__(self, app: ASGIApp, tenancy: Tenancy) -> None:
        self.app = app
        self.tenancy = tenancy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        key = api_key_of(scope) if scope["type"] == "http" else None
        limit = resolve_limit(key.tpm, key.burst, self.tenancy.config.ratelimit) if key is not None else None
        if key is None or (limit is None and key.monthly_tokens is None):
            await self.app(scope, receive, send)
            return
        ctx = context_of(scope)
        admission = KeyAdmission(self.tenancy.limiter, key.id, limit, self.tenancy.budgets, key.monthly_tokens)
        scope.setdefault("state", {})[_RESERVATION] = admission

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [(k.lower().encode(), v.encode()) for k, v in (await admission.headers()).items()]
                have = {k.lower() for k, _ in message.get("headers", [])}
                message = {**message, "headers": [*message.get("headers", []),
                                                  *[(k, v) for k, v in extra if k not in have]]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            await admission.settle(ctx.used())
