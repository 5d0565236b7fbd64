"""The cost bucket: one key's token allowance, as arithmetic on a single number.

A bucket holds `level` tokens, at most `capacity` (the burst), and refills continuously at `tpm / 60` tokens a
second. A request reserves its cost estimate (prompt tokens + the new tokens it may generate) at admission and
settles to the real count when it ends:

- admitted iff `level >= cost`; then `level -= cost`;
- refused otherwise, with the exact wait `(cost - level) / rate` until the refill makes `cost` fit;
- a cost above `capacity` can never fit, however long the client waits: a distinct outcome (`TOO_LARGE`),
  which the route answers with 413, never a 429 the client would retry forever;
- settling refunds `reserved - actual` (capped at capacity) or, when the request used more than it reserved,
  subtracts the excess: the level goes negative, and that debt is paid by the refill before the key's next
  admission (a negative level is below any cost, and the wait counts the debt).

An absent bucket is a full one, so a store may drop any bucket the refill has filled (Redis keys expire then).
The same arithmetic runs in Lua for Redis (`redis_backend.py`); the behavioural tests run over both.

Admission compares with a tolerance of `EPSILON` tokens, so a client that waits exactly `retry_after_s` is
admitted despite floating-point rounding in `level + rate * elapsed`.
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

EPSILON = 1e-6  # tokens; far below one token, far above the rounding error of the refill


@dataclass(frozen=True, slots=True)
class TokenLimit:
    """One key's limit: a capacity (`burst`, tokens) and a sustained rate (`tpm`, tokens per minute)."""

    burst: int
    tpm: int

    def __post_init__(self) -> None:
        if self.burst < 1 or self.tpm < 1:
            raise ValueError(f"a token limit needs burst >= 1 and tpm >= 1 (got burst {self.burst}, tpm {self.tpm})")

    @property
    def rate(self) -> float:
        """Tokens per second."""
        return self.tpm / 60.0


class BucketVerdict(enum.Enum):
    """What the limiter made of one reservation (`Decision.outcome`)."""

    ADMITTED = "admitted"  # the cost was reserved; settle it when the request ends
    LIMITED = "limited"  # not now: wait `retry_after_s` (429 rate_limit_exceeded)
    TOO_LARGE = "too_large"  # never: the cost is above the capacity (413 request_exceeds_capacity)
    UNMETERED = "unmetered"  # the limiter was unreachable and fails open: admitted, nothing reserved, no headers


@dataclass(frozen=True, slots=True)
class BucketState:
    """A bucket as of one moment: what the rate-limit headers report."""

    limit: int  # the capacity, tokens
    remaining: int  # whole tokens in the bucket now (0 while it owes a debt)
    debt: int  # tokens owed by requests that used more than they reserved (0 when none), rounded up
    reset_s: float  # seconds until the bucket is full again (0.0 when full)


@dataclass(frozen=True, slots=True)
class Decision:
    """The limiter's answer at admission.

    `remaining` and `reset_s` are the bucket after this reservation (when admitted) or as it stands (when not).
    `retry_after_s` is set only for `LIMITED`: the exact refill time until `cost` fits.
    """

    outcome: BucketVerdict
    cost: int
    limit: int
    remaining: int
    debt: int
    reset_s: float
    retry_after_s: float | None = None

    @property
    def allowed(self) -> bool:
        return self.outcome in (BucketVerdict.ADMITTED, BucketVerdict.UNMETERED)

    @property
    def reserved(self) -> int:
        """What `settle` must be told was reserved: the cost when admitted and metered, else 0."""
        return self.cost if self.outcome is BucketVerdict.ADMITTED else 0

    @property
    def state(self) -> BucketState:
        return BucketState(self.limit, self.remaining, self.debt, self.reset_s)



def check_counts(**counts: int) -> None:
    """Token counts are whole and non-negative: a negative cost would fill the bucket."""
    for name, n in counts.items():
        if n < 0:
            raise ValueError(f"{name} must be a non-negative token count, not {n}")


def refill(level: float, elapsed_s: float, limit: TokenLimit) -> float:
    """The level after `elapsed_s` seconds of refill; a clock that went backwards refills nothing."""
    return min(float(limit.burst), level + max(0.0, elapsed_s) * limit.rate)


def admit(level: float, cost: int, limit: TokenLimit) -> tuple[BucketVerdict, float]:
    """(outcome, level after) for a reservation of `cost` against a refilled `level`."""
    if cost > limit.burst:
        return BucketVerdict.TOO_LARGE, level
    if level + EPSILON >= cost:
        return BucketVerdict.ADMITTED, level - cost
    return BucketVerdict.LIMITED, level


def settle_level(level: float, reserved: int, actual: int, limit: TokenLimit) -> float:
    """The level after a request that reserved `reserved` tokens turned out to cost `actual`."""
    return min(float(limit.burst), level + (reserved - actual))


def state_of(level: float, limit: TokenLimit) -> BucketState:
    return BucketState(
        limit=limit.burst,
        remaining=max(0, math.floor(level + EPSILON)),
        debt=max(0, math.ceil(-level - EPSILON)),
        reset_s=max(0.0, (limit.burst - level) / limit.rate),
    )


def decision_of(outcome: BucketVerdict, cost: int, level: float, limit: TokenLimit) -> Decision:
    """Build the Decision from the outcome and the level after it (the one formula both stores share)."""
    st = state_of(level, limit)
    retry = (cost - level) / limit.rate if outcome is BucketVerdict.LIMITED else None
    return Decision(outcome, cost, st.limit, st.remaining, st.debt, st.reset_s, retry)


class TokenBuckets:
    """In-process buckets for one replica: thread-safe, on an injectable monotonic clock.

    One lock guards every bucket: each operation is a few float operations, far shorter than a lock hand-off,
    so per-key locks would cost more than they save. Full buckets are dropped by a sweep every
    `SWEEP_EVERY` operations (as Redis expires them), so memory follows the keys in use, not every key ever seen.
    """

    SWEEP_EVERY = 4096

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float, TokenLimit]] = {}  # key -> (level, as of clock time, limit)
        self._ops = 0

    def _level(self, key: str, now: float, limit: TokenLimit) -> float:
        got = self._buckets.get(key)
        return float(limit.burst) if got is None else refill(got[0], now - got[1], limit)

    def _store(self, key: str, level: float, now: float, limit: TokenLimit) -> None:
        if level >= limit.burst:
            self._buckets.pop(key, None)  # absent == full
        else:
            self._buckets[key] = (level, now, limit)
        self._ops += 1
        if self._ops % self.SWEEP_EVERY == 0:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        full = [k for k, (level, t, limit) in self._buckets.items() if refill(level, now - t, limit) >= limit.burst]
        for k in full:
            del self._buckets[k]

    def reserve(self, key: str, cost: int, limit: TokenLimit) -> Decision:
        check_counts(cost=cost)
        with self._lock:
            now = self._clock()
            outcome, level = admit(self._level(key, now, limit), cost, limit)
            if outcome is BucketVerdict.ADMITTED:
                self._store(key, level, now, limit)
        return decision_of(outcome, cost, level, limit)

    def settle(self, key: str, reserved: int, actual: int, limit: TokenLimit) -> BucketState:
        check_counts(reserved=reserved, actual=actual)
        with self._lock:
            now = self._clock()
            level = settle_level(self._level(key, now, limit), reserved, actual, limit)
            self._store(key, level, now, limit)
        return state_of(level, limit)

    def peek(self, key: str, limit: TokenLimit) -> BucketState:
        with self._lock:
            level = self._level(key, self._clock(), limit)
        return state_of(level, limit)

    def __len__(self) -> int:
        with self._lock:
            return len(self._buckets)
