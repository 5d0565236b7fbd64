"""The model runtime: the served models (the local one and the upstreams'), the engine, the tokenizers, and
their loading at start-up; `served` is the one resolution of a request's model every route shares."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn

import httpx
from prometheus_client import CollectorRegistry, Gauge

from sluicegate import redaction
from sluicegate.api.drain import Drain
from sluicegate.api.local_models import LocalModel, LocalPool, State
from sluicegate.backends.base import LoadedModel, ModelRunner, Tokenizer
from sluicegate.config import Config
from sluicegate.engine import AsyncEngine, Engine
from sluicegate.engine.scheduler import SchedulerConfig
from sluicegate.protocol.openai_models import ModelState
from sluicegate.serving.budget import Budget
from sluicegate.serving.chat_template import ChatFormat, chat_format, read_chat_template
from sluicegate.serving.constraints import build_vocabulary
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel
from sluicegate.upstream import (
    AsyncUpstream,
    Probed,
    TokenizerFactory,
    UpstreamRefused,
    load_upstreams,
    new_http_client,
)

log = logging.getLogger("sluicegate")

RunnerFactory = Callable[[], ModelRunner]
UPSTREAM_RETRY_FIRST_S = 1.0  # an upstream that failed its start-up checks, but may yet come up, is checked
UPSTREAM_RETRY_MAX_S = 30.0  # again after 1 s, then 2, 4, ... and every 30 s at most
UPSTREAM_ENGINE_SLOTS = 16  # an upstream-only server's batch worker runs a quarter of this: 4 items at once


@dataclass(slots=True)
class ModelRuntime:
    config: Config
    factory: RunnerFactory
    registry: CollectorRegistry  # the app's: engine metrics
    drain: Drain  # the shutdown drain: an engine already drained stops at once
    tokenizers: TokenizerFactory | None = None  # an upstream model's tokenizer; None: the local model's runner
    more: dict[str, RunnerFactory] = field(default_factory=dict)  # further local models by name (--model NAME=GGUF)
    model: ServedModel | None = None  # the local model (None with --no-local-model)
    cards: dict[str, RunnerFactory] = field(default_factory=dict)  # a local model's tokenizer-only runner, by its
    # `more` name ("": the default's), for a model loaded when asked for (else its full factory makes its card)
    more_models: dict[str, ServedModel] = field(default_factory=dict)  # the further local models (loaded or card)
    pool: LocalPool | None = None  # every local model, loaded or not (api/local_models.py)
    models: dict[str, ServedModel] = field(default_factory=dict)  # every served model by name, once all loaded
    http: httpx.AsyncClient | None = None  # the pooled client of every upstream
    engine: Engine | None = None
    load_error: str | None = None
    upstream_wait: tuple[str, float] | None = None  # (which upstream failed its checks and why, the next check's
    # delay) while one is being checked again; /readyz says it
    fatal: str | None = None  # a configuration that can never serve: the server exits non-zero with this
    shutdown: Callable[[str], None] | None = None  # ends the server (api/server/run.py sets it)
    _stop_loading: asyncio.Event = field(default_factory=asyncio.Event)
    load_started: float = 0.0
    _compute: threading.Lock | None = None
    _gauged: bool = False  # the compute-threads gauge registered (the first local model's runner)
    _factories: dict[str, tuple[RunnerFactory, str | None, SchedulerConfig]] = field(default_factory=dict)

    async def load(self) -> bool:
        """Load the local model, then probe the upstreams (upstream/load.py); health answers meanwhile and
        readiness says 503 until every model can serve. True once every model serves."""
        self.load_started = time.monotonic()
        if self.config.upstream.local_model:
            await self._load_local()
            if self.model is None:
                return False
        if self.config.upstream.targets:
            self.http = new_http_client(self.config.upstream)
            found = await self._load_upstreams(self.http)
            if found is None:
                return False
            ups = found
        else:
            ups = {}
        models = {} if self.model is None else {self.model.identity.name: self.model, **self.more_models}
        if clash := models.keys() & ups.keys():
            log.error("refusing to serve: model %s is both the local model and an upstream's; name the upstream "
                      "(--upstream NAME=URL) or serve no local model (--no-local-model)", ", ".join(clash))
            self.load_error = "upstream_refused"
            return False
        models.update(ups)
        self.models = models
        self.upstream_wait = None
        return True

    def engine_slots(self) -> int:
        """The slots batch work is sized by: the local model's, or an upstream-only server's assumed
        `UPSTREAM_ENGINE_SLOTS` (an upstream engine's own slots are not known here: 4 items at once unless
        --batch-worker-slots says)."""
        return self.model.runner.limits.n_slots if self.model is not None else UPSTREAM_ENGINE_SLOTS

    async def _load_upstreams(self, http: httpx.AsyncClient) -> dict[str, ServedModel] | None:
        """Probe the upstreams until they pass (upstream/load.py). One that may yet come up (not reachable, 5xx)
        is checked again after 1 s, doubling to `UPSTREAM_RETRY_MAX_S`, with /readyz saying which and why
        (`upstream_wait`); one that answered what can never work (it does not serve the model, refuses the key,
        disagrees on the tokenizer) ends the server: None, `fatal` set and `shutdown` called."""
        delay = UPSTREAM_RETRY_FIRST_S
        while True:
            try:
                found = await load_upstreams(self.config.upstream, http, self.tokenizers or self._local_tokenizer)
                return {name: await self._served_upstream(p) for name, p in found.items()}
            except (UpstreamRefused, OSError, ValueError) as exc:
                why = redaction.urls_in(str(exc))  # the operator's message (URLs without credentials): never a client's
                if getattr(exc, "permanent", True):
                    log.error("refusing to serve: %s", why)
                    self.load_error = "upstream_refused"
                    self.fatal = why
                    self.upstream_wait = None
                    if self.shutdown is not None:
                        self.shutdown(why)
                    return None
                self.upstream_wait = (f"{why}; checked again in {delay:g} s", delay)
                log.warning("upstream not ready: %s; checking again in %g s", why, delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_loading.wait(), delay)
                return None  # shutting down
            delay = min(delay * 2, UPSTREAM_RETRY_MAX_S)

    async def _served_upstream(self, p: Probed) -> ServedModel:
        """An upstream model served as the local one is: its budget from the tokenizer, its window the upstream's."""
        budget = await asyncio.to_thread(Budget.for_runner, p.runner, self.config.limits)
        return ServedModel(p.runner, p.client, dataclasses.replace(budget, n_ctx=p.n_ctx),
                           identity_override=p.identity, token_ids=p.token_ids,
                           limits_override=dataclasses.replace(p.runner.limits, n_ctx=p.n_ctx))

    def stop_loading(self) -> None:
        """Shutting down: an upstream still being waited for is not checked again."""
        self._stop_loading.set()

    def _local_tokenizer(self, name: str) -> Tokenizer:
        return self.model.runner if self.model is not None else self.factory()

    async def _load_local(self) -> None:
        """The default model, then the others (`--model NAME=GGUF`), each with its engine, their forward passes
        taking turns through one lock (`Engine` `compute`). Under a memory budget or a keep_alive a model is the
        pool's to load and unload (api/local_models.py): the default loads now, the others on first use, each
        known meanwhile by its tokenizer-only card."""
        self._compute = threading.Lock() if self.more else None
        m = self.config.model
        sources: dict[str, str | None] = {}
        for key in ("", *self.more):
            file = m.options_for(key or m.name).chat_template_file or (m.chat_template_file if not key else None)
            try:
                sources[key] = None if file is None else read_chat_template(file)
            except (OSError, ValueError) as exc:  # checked at start-up: changed since
                log.error("the chat template file cannot be read: %s", exc)
                self.load_error = "chat_template"
                return
        entries: list[LocalModel] = []
        for key, factory in {"": self.factory, **self.more}.items():
            entry = await self._entry(key, factory, sources[key])
            if entry is None:
                return
            if any(e.name == entry.name for e in entries):
                log.error("refusing to serve: two local models are named %s", entry.name)
                self.load_error = "duplicate_model"
                return
            entries.append(entry)
        if unknown := {n for n, _ in m.keep_alive if n} - {e.name for e in entries}:
            log.error("refusing to serve: --keep-alive names %s, which is no local model (%s)",
                      ", ".join(sorted(unknown)), ", ".join(e.name for e in entries))
            self.load_error = "keep_alive"
            return
        pool = self.pool = LocalPool(entries, self._load_entry, self.registry, budget_bytes=m.memory_bytes)
        if m.memory_bytes is not None and (big := [e for e in entries if e.cost > m.memory_bytes]):
            log.error("refusing to serve: model %s needs %.0f MB (weights and KV), over --models-memory-bytes "
                      "(%.0f MB)", big[0].name, big[0].cost / 1e6, m.memory_bytes / 1e6)
            self.load_error = "models_memory_bytes"
            return
        default = entries[0]
        if default.state is not State.LOADED and not await pool.load_now(default):
            self.load_error = default.failure or "load_failed"
            return
        self.model, self.engine = default.card, default.engine  # a card is the loaded model when it stays
        self.more_models = {e.name: e.card for e in entries[1:]}
        pool.start()

    async def _entry(self, key: str, factory: RunnerFactory, template: str | None) -> LocalModel | None:
        """One local model: loaded now when every one stays (no budget, no keep_alive: its card is the loaded
        model), else its card alone (its tokenizer, identity and limits; the default loads right after)."""
        cfg = self.config.model
        if cfg.memory_bytes is None and not cfg.keep_alive:
            loaded = await self._load_one(factory, template, self._engine_config(key))
            if loaded is None:
                return None
            served, engine = loaded
            entry = LocalModel(served.identity.name, served, _cost(served), None, State.LOADED, served, engine,
                               last_used=time.monotonic())
            entry.ready.set()
        else:
            try:
                runner = await asyncio.to_thread(self.cards.get(key, factory))
            except Exception as exc:
                log.exception("the model %s could not be read", key or "(default)")
                self.load_error = type(exc).__name__
                return None
            budget = await asyncio.to_thread(Budget.for_runner, runner, self.config.limits)
            card = ServedModel(runner, _NOT_LOADED, budget, chat_template_source=template,
                               reasoning_format=cfg.reasoning_format)
            await asyncio.to_thread(chat_format, card)
            name = card.identity.name
            entry = LocalModel(name, card, _cost(card), cfg.keep_alive_s(key or name))
        self._factories[entry.name] = (factory, template, self._engine_config(key))
        return entry

    def _engine_config(self, key: str) -> SchedulerConfig:
        """The engine's settings for the model `key` names ("": the default): the server's, with its own KV tier
        budget when it has one (`--model-option NAME:kv_cache_bytes=N`)."""
        cfg = self.config.model
        own = cfg.options_for(key or cfg.name).kv_cache_bytes
        return self.config.engine if own is None else dataclasses.replace(self.config.engine, kv_cache_bytes=own)

    async def _load_entry(self, entry: LocalModel) -> tuple[ServedModel, Engine]:
        """The pool's loader: the model's weights and engine (api/local_models.py)."""
        factory, template, engine_cfg = self._factories[entry.name]
        loaded = await self._load_one(factory, template, engine_cfg)
        if loaded is None:
            raise RuntimeError(self.load_error or "load_failed")
        if loaded[0].identity != entry.card.identity:  # the file changed since the card was read
            await asyncio.to_thread(loaded[1].stop)
            loaded[1].close()
            raise RuntimeError("the model file changed since start")
        found, card = getattr(loaded[0].runner, "invariance", None), entry.card.runner
        if found is not None and isinstance(card, LoadedModel) and card.invariance is None:
            card.adopt(found)  # the card says what the loaded model measured, also once it is unloaded
        return loaded

    def state_of(self, model: ServedModel) -> ModelState:
        """loaded, loading or unloaded (api/local_models.py); an upstream's: loaded."""
        entry = None if self.pool is None or model.upstream else self.pool.models.get(model.identity.name)
        return "loaded" if entry is None else _STATES[entry.state]

    def leases(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The scope that holds what `acquire` hands out (a batch item's; a request's is the ModelLeases
        middleware's)."""
        return self.pool.leases() if self.pool is not None else contextlib.nullcontext()

    async def acquire(self, requested: str | None, deadline: float | None) -> ServedModel:
        """`served`, then, for a local model, loaded (within `deadline`) and held for the request
        (api/local_models.py); what every route that runs the model calls."""
        found = self.served(requested)
        entry = None if self.pool is None or found.upstream else self.pool.models.get(found.identity.name)
        return found if entry is None else await self.pool.acquire(entry, deadline)  # type: ignore[union-attr]

    async def _load_one(self, factory: RunnerFactory, template: str | None,
                        engine_cfg: SchedulerConfig) -> tuple[ServedModel, Engine] | None:
        try:
            runner = await asyncio.to_thread(factory)
        except Exception as exc:
            log.exception("the model failed to load")
            self.load_error = type(exc).__name__
            return None
        budget = await asyncio.to_thread(Budget.for_runner, runner, self.config.limits)
        await asyncio.to_thread(build_vocabulary, runner)  # ~0.3 s for 49k tokens: not on a request's path
        engine = Engine(runner, engine_cfg, registry=self.registry, compute=self._compute)
        # the forecast's step model, measured on the engine thread before /readyz says ready (`Engine.start`)
        await asyncio.to_thread(engine.start, calibrate=self.config.engine.deadline_admission)
        if isinstance(getattr(runner, "compute_threads", None), int) and not self._gauged:  # llama.cpp's
            self._gauged = True
            Gauge("sluicegate_compute_threads", "llama.cpp compute threads the last step used (fewer while other "
                  "processes hold cores; docs/engine.md)", registry=self.registry).set_function(
                lambda: float(getattr(runner, "compute_threads", 0)))
        model = ServedModel(runner, AsyncEngine(engine), budget, chat_template_source=template,
                            reasoning_format=self.config.model.reasoning_format)
        chat = await asyncio.to_thread(chat_format, model)  # compiled and probed now, not on a request's path
        self._log_loaded(model, engine, chat)
        return model, engine

    def _log_loaded(self, model: ServedModel, engine: Engine, chat: ChatFormat) -> None:
        runner, ident = model.runner, model.identity
        log.info(
            "ready: serving %s (%s) on http://%s:%d, loaded in %.1fs", ident.ref, ident.digest, self.config.host,
            self.config.port, time.monotonic() - self.load_started,
        )
        if chat.template is None:
            log.warning("%s ships no chat template, so it cannot take messages (chat completions, Responses, "
                        "Messages answer 400 no_chat_template): give it one with --chat-template-file; completions "
                        "and generate serve it", ident.name)
        else:
            log.info("chat template: %s; tool calls: %s syntax%s", "--chat-template-file" if chat.source == "file"
                     else "the model's own", chat.tools.name,
                     f"; reasoning between {chat.reasoning.start} and {chat.reasoning.end}" if chat.reasoning else "")
        lim = runner.limits
        if lim.kv_bytes_per_slot:
            window = (f"; its sliding-window layers keep the whole window ({lim.sliding_window} is theirs): exact when "
                      "a cached prefix is cut back" if lim.sliding_window else "")
            log.info("KV cache: %d slots x %.1f MB = %.0f MB%s", lim.n_slots, lim.kv_bytes_per_slot / 1e6,
                     lim.n_slots * lim.kv_bytes_per_slot / 1e6, window)
        found, withdrawn = getattr(runner, "invariance", None), getattr(runner, "withdrawn", ())
        if found is not None and withdrawn:  # measured at load (backends/invariance.py)
            log.warning("%s: its numerics were measured at load and are not exact across %s (%s); a request's tokens "
                        "may depend on what is batched with it, and what is not exact is not reused (docs/engine.md, "
                        "\"Earned per model\")", ident.name, ", ".join(withdrawn), found.why)
        elif not lim.batch_invariant:
            log.warning("this runner's numerics depend on batching: a request's tokens may depend on what is "
                        "batched with it")
        if engine.scheduler.drafting is not None:
            log.info("speculative decoding: adaptive (drafts where they pay, verified with the numerics of "
                     "one-token decoding)")
        elif self.config.engine.speculative_ngram and lim.drafts_exact:
            log.info("speculative decoding is on; drafts are verified with the numerics of one-token decoding")
        elif self.config.engine.speculative_ngram:
            log.warning("speculative decoding is on: a greedy request's tokens may differ from one-token-at-a-time "
                        "decoding (multi-token verification rounds differently)")

    @property
    def engines(self) -> list[Engine]:
        """Every loaded local model's engine, the default's first."""
        return [] if self.pool is None else self.pool.engines()

    async def close(self) -> None:
        """The upstream clients, then the engine (the owner stops batch work first: api/state.py)."""
        for m in self.models.values():
            if isinstance(m.engine, AsyncUpstream):
                await m.engine.close()
        if self.http is not None:
            await self.http.aclose()
        drain_s = 0.0 if self.drain.draining else self.config.limits.drain_s  # else drained already
        if self.pool is not None:
            await self.pool.close()
        engines = self.engines
        await asyncio.gather(*(asyncio.to_thread(e.stop, drain_s=drain_s) for e in engines))
        for e in engines:
            e.close()  # frees the model only if no step can still be running
        self.engine = None

    def served(self, requested: str | None = None) -> ServedModel:
        """The model a request names (`name` or `name@version`; None: the local model, else the first
        upstream). An unknown name is 404 model_not_found listing what is served; a served name with a
        version it lacks is the model's own answer (`ServedModel.resolve`: model_version_not_found, listing
        its versions), the one resolution every route shares."""
        if self.models:
            if requested is None:
                return self.model or next(iter(self.models.values()))
            found = self.models.get(requested.split("@", 1)[0])
            if found is not None:
                found.resolve(requested)
                return found
            refs = ", ".join(sorted(m.identity.ref for m in self.models.values()))
            raise ApiError("model_not_found", f"no such model; this server serves {refs}", param="model",
                           code="model_not_found")
        if self.load_error is not None:
            raise ApiError("not_ready", "the model failed to load; the operator must fix the server",
                           code="load_failed", retry_after=60)
        raise ApiError("not_ready", "the model is still loading", code="loading", retry_after=2)

    def all_served(self) -> list[ServedModel]:
        """Every served model, the default first; refuses (503) while loading, as `served` does."""
        first = self.served()
        return [first] + [m for m in self.models.values() if m is not first]


def _cost(model: ServedModel) -> int:
    """What a local model holds loaded: its weights file and its slots' KV cache."""
    lim = model.limits
    return lim.weights_bytes + lim.n_slots * lim.kv_bytes_per_slot


class _NotLoaded:
    """A card's engine: never reached (a request runs on the loaded model, `ModelRuntime.acquire`)."""

    def submit(self, requests: object) -> NoReturn:
        raise ApiError("not_ready", "the model is not loaded", code="loading", retry_after=2)

    def abort(self, request_id: str) -> None:
        return None


_NOT_LOADED = _NotLoaded()
_STATES: dict[State, ModelState] = {State.LOADED: "loaded", State.LOADING: "loading", State.UNLOADED: "unloaded"}
