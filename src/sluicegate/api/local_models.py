"""Local models loaded when asked for: a memory budget, least-recently-used unloading and `keep_alive`.

Every local model (`--model`, repeated) is a `LocalModel` here. Without `--models-memory-bytes` and without a
`--keep-alive` for it, a model loads at start and stays, as before. Otherwise (docs/models.md, "Loaded when asked
for"):

- The default model loads at start (readiness waits for it); another loads on its first request. The request
  waits for the load within its deadline; one whose deadline cannot hold the load's forecast (the last load's
  seconds; 10 s before the first) is refused at once with 503 `loading` and that forecast as Retry-After, and
  the load goes on, so the retry finds the model loaded.
- A model's cost is its weights file plus its slots' KV cache (`RunnerLimits`), known before it loads from its
  tokenizer-only card. A load that would take the loaded models over the budget first unloads the least
  recently used idle ones; a model is idle when no request holds it (a lease, from the request's first look at
  the model to the end of its answer, `leases`) and its engine has nothing in flight. With none idle the load
  waits for one.
- `keep_alive` (Ollama's name and meaning): seconds an idle model stays loaded after its last request; 0 unloads
  it as soon as it is idle; None: as long as the budget allows.
- Loads run one at a time, off the event loop: other models' requests go on meanwhile. A load that fails leaves
  the model unloaded; its waiting requests get 503 `load_failed`, and the next request tries again.
- An unloaded model keeps its card: `/v1/models` lists it (`state`), `/v1/models/{id}` describes it, and
  counting tokens needs no load.

Loads, unloads and their reasons are logged and counted (`sluicegate_model_loaded`, `sluicegate_model_load_seconds`,
`sluicegate_model_unloads`, `sluicegate_models_memory_bytes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Receive, Scope, Send

from sluicegate.engine import Engine
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel

log = logging.getLogger("sluicegate")

FIRST_LOAD_FORECAST_S = 10.0  # a model's load forecast before it has loaded once
KEEP_ALIVE_CHECK_MAX_S = 60.0  # the keep_alive watcher looks again at least this often
LOAD_BUCKETS = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)


class State(enum.StrEnum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"


Loader = Callable[["LocalModel"], Awaitable[tuple[ServedModel, Engine]]]


@dataclass(eq=False, slots=True)
class LocalModel:
    name: str
    card: ServedModel  # what is known without loading: identity, window, template, tokenizer
    cost: int  # bytes: its weights file and its slots' KV cache
    keep_alive_s: float | None = None  # idle seconds before it is unloaded; None: as long as the budget allows
    state: State = State.UNLOADED
    served: ServedModel | None = None  # while loaded
    engine: Engine | None = None
    users: int = 0  # requests holding it (leases)
    last_used: float = 0.0  # monotonic: when its last lease ended, or it loaded
    load_s: float | None = None  # the last load's seconds
    load_began: float = 0.0
    failure: str | None = None  # why the last load failed
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # set when a load ends, either way

    def forecast_s(self) -> float:
        """Seconds until a load begun now (or under way) is done."""
        total = self.load_s if self.load_s is not None else FIRST_LOAD_FORECAST_S
        if self.state is State.LOADING:
            return max(0.5, total - (time.monotonic() - self.load_began))
        return total

    @property
    def idle(self) -> bool:
        return self.state is State.LOADED and self.users == 0 and (self.engine is None or self.engine.idle)


_HELD: ContextVar[list[LocalModel] | None] = ContextVar("sluicegate_model_leases", default=None)


class ModelLeases:
    """Pure ASGI: the models a request acquires are held until its answer has gone (a stream's last event
    included), so none is unloaded under it."""

    def __init__(self, app: ASGIApp, pool: Callable[[], LocalPool | None]) -> None:
        self.app, self.pool = app, pool

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pool = self.pool() if scope["type"] == "http" else None
        if pool is None:
            await self.app(scope, receive, send)
            return
        async with pool.leases():
            await self.app(scope, receive, send)


class LocalPool:
    """The local models, their loading and unloading (module docstring)."""

    def __init__(self, models: list[LocalModel], loader: Loader, registry: CollectorRegistry, *,
                 budget_bytes: int | None = None) -> None:
        self.models = {m.name: m for m in models}
        self.budget = budget_bytes
        self._loader = loader
        self._room = asyncio.Lock()  # one load or unload at a time: the budget is checked and spent under it
        self._tick = asyncio.Event()  # set (and replaced) whenever a model may have become idle
        self._watcher: asyncio.Task[None] | None = None
        self._closing = False
        self._loaded = Gauge("sluicegate_model_loaded", "1 while the model is loaded, 0 while not (docs/models.md)",
                             ["model_name"], registry=registry)
        self._load_seconds = Histogram("sluicegate_model_load_seconds", "one load of a local model: weights, "
                                       "engine, calibration", ["model_name"], buckets=LOAD_BUCKETS, registry=registry)
        self._unloads = Counter("sluicegate_model_unloads", "local models unloaded, by reason (budget: to make room "
                                "for another; keep_alive: idle past it)", ["model_name", "reason"], registry=registry)
        Gauge("sluicegate_models_memory_bytes", "the loaded local models' cost: weights files and KV caches",
              registry=registry).set_function(lambda: float(self.used_bytes()))
        for m in models:
            self._loaded.labels(m.name).set(0)
            for reason in ("budget", "keep_alive"):
                self._unloads.labels(m.name, reason)

    @property
    def managed(self) -> bool:
        """Models come and go here (a budget or a keep_alive); else every one loads at start and stays."""
        return self.budget is not None or any(m.keep_alive_s is not None for m in self.models.values())

    def used_bytes(self, but: LocalModel | None = None) -> int:
        """The loaded models' cost (one being loaded counts once it has: loads take turns, `_room`)."""
        return sum(m.cost for m in self.models.values() if m.state is State.LOADED and m is not but)

    def engines(self) -> list[Engine]:
        return [m.engine for m in self.models.values() if m.engine is not None]

    # -- requests ----------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def leases(self) -> AsyncIterator[None]:
        """Holds what `acquire` hands out within it until it ends (api: the whole request; batch items: each)."""
        held: list[LocalModel] = []
        token = _HELD.set(held)
        try:
            yield
        finally:
            _HELD.reset(token)
            now = time.monotonic()
            for m in held:
                m.users -= 1
                m.last_used = now
            if held:
                self._notify()

    async def acquire(self, m: LocalModel, deadline: float | None) -> ServedModel:
        """The loaded model, loading it first if need be (within `deadline`, monotonic), held for the caller's
        `leases` scope; 503 `loading` when the deadline cannot hold the load, `load_failed` when it failed."""
        held = _HELD.get()
        if held is not None:
            m.users += 1
            held.append(m)
        while True:
            if m.state is State.LOADED and m.served is not None:
                m.last_used = time.monotonic()
                return m.served
            if m.state is State.UNLOADED:
                self._begin_load(m)
            event = m.ready
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining < m.forecast_s():
                raise self._loading(m)
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except TimeoutError:
                raise self._loading(m) from None
            if m.state is State.UNLOADED and m.failure is not None:
                raise ApiError("not_ready", f"model {m.name} failed to load; the operator must fix it", param="model",
                               code="load_failed", retry_after=60)

    def _loading(self, m: LocalModel) -> ApiError:
        s = m.forecast_s()
        return ApiError("not_ready", f"model {m.name} is loading; it should be ready in about {s:.0f} s, past this "
                        "request's deadline", param="model", code="loading", retry_after=max(1, math.ceil(s)))

    # -- loading and unloading ---------------------------------------------------------------------------
    def start(self) -> None:
        """The keep_alive watcher (on the serving event loop)."""
        if self._watcher is None and any(m.keep_alive_s is not None for m in self.models.values()):
            self._watcher = asyncio.create_task(self._watch())

    def _begin_load(self, m: LocalModel) -> asyncio.Task[None]:
        m.state, m.ready, m.load_began, m.failure = State.LOADING, asyncio.Event(), time.monotonic(), None
        return asyncio.create_task(self._load(m))

    async def load_now(self, m: LocalModel) -> bool:
        """Loads `m` (at start: the default model); True when it loaded."""
        if m.state is State.UNLOADED:
            await self._begin_load(m)
        else:
            await m.ready.wait()
        return m.state is State.LOADED

    async def _load(self, m: LocalModel) -> None:
        try:
            async with self._room:
                while self.budget is not None and self.used_bytes(but=m) + m.cost > self.budget:
                    victim = self._least_recent_idle(but=m)
                    if victim is None:  # every other is busy: wait for one to be idle
                        await self._tick.wait()
                        continue
                    await self._unload(victim, "budget")
                m.load_began = time.monotonic()
                served, engine = await self._loader(m)
                m.served, m.engine, m.state = served, engine, State.LOADED
                m.load_s = time.monotonic() - m.load_began
                m.last_used = time.monotonic()
                m.failure = None
            self._loaded.labels(m.name).set(1)
            self._load_seconds.labels(m.name).observe(m.load_s)
            log.info("model %s loaded in %.1f s (%.0f MB; local models now hold %.0f MB%s)", m.name, m.load_s,
                     m.cost / 1e6, self.used_bytes() / 1e6,
                     "" if self.budget is None else f" of the {self.budget / 1e6:.0f} MB budget")
        except Exception as exc:  # the request that asked hears load_failed; the next one tries again
            log.error("model %s failed to load: %s", m.name, type(exc).__name__)
            m.failure, m.state, m.served, m.engine = type(exc).__name__, State.UNLOADED, None, None
        finally:
            m.ready.set()
            self._notify()

    def _least_recent_idle(self, but: LocalModel) -> LocalModel | None:
        idle = [m for m in self.models.values() if m is not but and m.idle]
        return min(idle, key=lambda m: m.last_used) if idle else None

    async def _unload(self, m: LocalModel, reason: str) -> None:
        engine = m.engine
        m.state, m.served, m.engine = State.UNLOADED, None, None
        m.ready = asyncio.Event()
        if engine is not None:
            await asyncio.to_thread(engine.stop)
            engine.close()
        self._loaded.labels(m.name).set(0)
        self._unloads.labels(m.name, reason).inc()
        log.info("model %s unloaded (%s); local models now hold %.0f MB", m.name,
                 "to make room for another" if reason == "budget" else f"idle past its keep_alive of "
                 f"{m.keep_alive_s:g} s", self.used_bytes() / 1e6)

    def _notify(self) -> None:
        self._tick.set()
        self._tick = asyncio.Event()

    async def _watch(self) -> None:
        """Unloads a model idle past its keep_alive; wakes when a lease ends, or at the next expiry."""
        while not self._closing:
            tick = self._tick
            now, wait = time.monotonic(), KEEP_ALIVE_CHECK_MAX_S
            for m in list(self.models.values()):
                if m.keep_alive_s is None or not m.idle:
                    continue
                left = m.last_used + m.keep_alive_s - now
                if left <= 0:
                    async with self._room:
                        if m.idle:  # still: nobody took it while the lock was awaited
                            await self._unload(m, "keep_alive")
                else:
                    wait = min(wait, left)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tick.wait(), max(0.05, wait))

    async def close(self) -> None:
        self._closing = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher


__all__ = ["LocalModel", "LocalPool", "ModelLeases", "State"]
