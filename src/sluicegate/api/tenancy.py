"""Tenancy: the API keys, their limits (rate, requests in flight, monthly budgets), the idempotency claims and
the usage ledger, over the store; the middlewares and the routes that meter or refuse by key use it."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass, field

from sluicegate.config import Config
from sluicegate.store.db import Store
from sluicegate.tenancy.budget import MonthlyBudgets
from sluicegate.tenancy.idempotency import IdempotencyStore, maintain
from sluicegate.tenancy.key_cache import KeyCache
from sluicegate.tenancy.ratelimit import RateLimiter, build_concurrency_limiter, build_rate_limiter
from sluicegate.tenancy.ratelimit.concurrency import ConcurrencyLimiter
from sluicegate.tenancy.usage import UsageLedger


@dataclass(slots=True)
class Tenancy:
    config: Config
    store: Store  # keys and the usage ledger; the app's caller owns it
    keys: KeyCache = field(init=False)
    limiter: RateLimiter = field(init=False)  # token buckets per key: in-process, or Redis (--redis-url)
    concurrency: ConcurrencyLimiter = field(init=False)  # requests in flight per key (api/middleware/key_limits.py)
    budgets: MonthlyBudgets = field(init=False)  # tokens per calendar month per key, from the usage ledger
    instance: str = field(default_factory=lambda: secrets.token_hex(6))  # this process, among replicas
    ledger: UsageLedger = field(init=False)
    idempotency: IdempotencyStore = field(init=False)  # Idempotency-Key claims and stored answers
    _maintenance: asyncio.Task[None] | None = None  # renews this process's claims, prunes expired keys

    def __post_init__(self) -> None:
        self.ledger = UsageLedger(self.store, max_pending=self.config.store.usage_max_pending)
        self.keys = self._key_cache()
        self.limiter = build_rate_limiter(self.config.ratelimit)  # opens no connection until first used
        self.concurrency = build_concurrency_limiter(self.config.ratelimit, self.limiter)
        self.budgets = MonthlyBudgets(self.store)
        idem = self.config.idempotency
        self.idempotency = IdempotencyStore(self.store, ttl_s=idem.ttl_hours * 3600, lease_s=idem.lease_s)

    def _key_cache(self) -> KeyCache:
        a = self.config.auth
        return KeyCache(self.store, ttl_s=a.key_cache_ttl_s, stale_s=a.key_stale_s, max_keys=a.key_cache_size,
                        max_unknown=a.unknown_cache_size, max_queries=a.max_key_queries)

    def open(self) -> None:
        """At start-up, on the serving event loop: a fresh key cache (its locks belong to one loop), the
        ledger's writer thread, the idempotency keys' upkeep."""
        self.keys = self._key_cache()
        self.ledger.start()
        self._maintenance = asyncio.create_task(
            maintain(self.idempotency, prune_every_s=self.config.idempotency.prune_every_s))

    async def close(self) -> None:
        if self._maintenance is not None:
            self._maintenance.cancel()
            self._maintenance = None
        await self.idempotency.aclose()
        await asyncio.to_thread(self.ledger.close)
        await self.concurrency.close()
        await self.limiter.close()
