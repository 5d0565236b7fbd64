"""Key lookups for the request path: cached in the process, so a request costs a hash and a dict lookup.

- Found keys and unknown keys are both remembered for `ttl_s` (default 0.5 s). A revocation made anywhere
  (another process, the CLI) is therefore seen here within `ttl_s` plus one query, inside the 1 s promise;
  expiry is checked at every use against the clock, so it is exact.
- Bounded: at most `max_keys` found keys and `max_unknown` unknown ones, each least-recently-used out, in
  separate tables so a flood of made-up keys cannot push out the real ones.
- A malformed key (wrong prefix, length, alphabet or checksum) never reaches the store. Lookups of one key
  made at once share one query; at most `max_queries` queries run at a time, so a flood of well-formed
  unknown keys queues behind them instead of taking every connection of the pool.
- The store is synchronous: queries run in a worker thread, never on the event loop.
- `enforced()`: whether auth is on, i.e. whether the store holds any key (revoked ones count, so revoking
  the last key does not open the server). Re-checked every `ttl_s` until the answer is yes; then it stays.
- Through a store outage a key this process verified within `stale_s` (default 300 s) is still accepted: when
  the query for a cached key fails, its last good answer stands (a revocation made during the outage cannot
  be seen, and is seen within `ttl_s` once the store answers again). A key not verified within that window,
  or never seen, is refused as the store's failure (503): the cache fails closed for what it does not know.
  Generation needs no store, so with this it goes on through a database blip (docs/keys.md, "When the store
  is down").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sluicegate.store.db import Store
from sluicegate.tenancy.keys import KeyRecord, acceptable, any_keys, find_key, secret_hash

V = TypeVar("V")
log = logging.getLogger("sluicegate.auth")


@dataclass(frozen=True, slots=True)
class CacheStats:
    hits: int
    misses: int
    queries: int


class KeyCache:
    def __init__(
        self,
        store: Store,
        *,
        ttl_s: float = 0.5,
        stale_s: float = 300.0,
        max_keys: int = 10_000,
        max_unknown: int = 4096,
        max_queries: int = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.stale_s = stale_s
        self.stale_answers = 0  # lookups answered from a stale entry because the store failed
        self.max_keys = max_keys
        self.max_unknown = max_unknown
        self._clock = clock
        self._found: OrderedDict[str, tuple[float, KeyRecord]] = OrderedDict()
        self._unknown: OrderedDict[str, float] = OrderedDict()
        self._inflight: dict[str, asyncio.Task[KeyRecord | None]] = {}
        self._queries = asyncio.Semaphore(max_queries)
        self._has_keys = False
        self._keys_checked = -float("inf")
        self._keys_check: asyncio.Task[bool] | None = None
        self.hits = self.misses = self.query_count = 0

    def stats(self) -> CacheStats:
        return CacheStats(self.hits, self.misses, self.query_count)

    async def lookup(self, secret: str) -> KeyRecord | None:
        """The key's record (revoked or expired ones too: the caller checks `usable`), or None if unknown."""
        if not acceptable(secret):
            return None
        digest = secret_hash(secret)
        now = self._clock()
        hit = self._found.get(digest)
        if hit is not None and now - hit[0] < self.ttl_s:
            self._found.move_to_end(digest)
            self.hits += 1
            return hit[1]
        seen = self._unknown.get(digest)
        if seen is not None and now - seen < self.ttl_s:
            self._unknown.move_to_end(digest)
            self.hits += 1
            return None
        self.misses += 1
        task = self._inflight.get(digest)
        if task is None:
            task = self._inflight[digest] = asyncio.ensure_future(self._fetch(digest, secret))
        # shield: a caller that goes away (client disconnect) must not cancel the query others wait on
        return await asyncio.shield(task)

    async def _fetch(self, digest: str, secret: str) -> KeyRecord | None:
        try:
            try:
                async with self._queries:
                    self.query_count += 1
                    record = await asyncio.to_thread(find_key, self.store, secret)
            except Exception:
                hit = self._found.get(digest)
                if hit is None or self._clock() - hit[0] >= self.stale_s:
                    raise  # not verified within the window: the store's failure decides (fail closed)
                self.stale_answers += 1
                if self.stale_answers == 1 or self.stale_answers % 1000 == 0:
                    log.warning("the key store cannot be read; keys verified within the last %gs are accepted "
                                "from the cache (%d such answers so far)", self.stale_s, self.stale_answers)
                return hit[1]
            at = self._clock()
            if record is None:
                self._found.pop(digest, None)
                _put(self._unknown, digest, at, self.max_unknown)
            else:
                self._unknown.pop(digest, None)
                _put(self._found, digest, (at, record), self.max_keys)
            return record
        finally:
            del self._inflight[digest]

    async def enforced(self) -> bool:
        """Whether the store holds a key (so every guarded route needs one)."""
        if self._has_keys:
            return True
        if self._clock() - self._keys_checked < self.ttl_s:
            return False
        if self._keys_check is None:
            self._keys_check = asyncio.ensure_future(self._check_keys())
        return await asyncio.shield(self._keys_check)

    async def _check_keys(self) -> bool:
        try:
            self._has_keys = await asyncio.to_thread(any_keys, self.store)
            self._keys_checked = self._clock()
            return self._has_keys
        finally:
            self._keys_check = None

    def forget(self) -> None:
        """Drop every cached answer (tests; an operator tool that must see its own change at once)."""
        self._found.clear()
        self._unknown.clear()
        self._keys_checked = -float("inf")


def _put(table: OrderedDict[str, V], key: str, value: V, limit: int) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > limit:
        table.popitem(last=False)


__all__ = ["CacheStats", "KeyCache"]
