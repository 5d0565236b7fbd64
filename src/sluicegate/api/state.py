"""What the app holds, and the owner that builds, starts and stops it: the model runtime
(api/model_runtime.py), tenancy (api/tenancy.py), the job system (jobs/runtime.py) and webhooks. Routes do not
reach through it: each takes the services it uses (api/services.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge
from starlette.requests import HTTPConnection

from sluicegate.api.batch_items import handlers
from sluicegate.api.drain import Drain
from sluicegate.api.model_runtime import ModelRuntime, RunnerFactory
from sluicegate.api.tenancy import Tenancy
from sluicegate.config import Config
from sluicegate.jobs.runtime import JobsRuntime
from sluicegate.store.db import Store, in_memory
from sluicegate.store.notify import JOBS, WEBHOOKS, Listener
from sluicegate.upstream import TokenizerFactory
from sluicegate.webhooks import Webhooks

__all__ = ["AppState", "RunnerFactory", "app_state"]


@dataclass(slots=True)
class AppState:
    config: Config
    factory: RunnerFactory
    store: Store = field(default_factory=in_memory)  # keys and the usage ledger; the caller owns it
    tokenizers: TokenizerFactory | None = None  # an upstream model's tokenizer; None: the local model's runner
    more: dict[str, RunnerFactory] = field(default_factory=dict)  # further local models, by served name
    cards: dict[str, RunnerFactory] = field(default_factory=dict)  # their tokenizer-only runners ("": the default's)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)  # this app's: engine metrics, readiness
    drain: Drain = field(default_factory=Drain)  # the shutdown drain (api/drain.py, api/server/run.py)
    runtime: ModelRuntime = field(init=False)  # the served models, the engine, their loading
    tenancy: Tenancy = field(init=False)  # keys, limits, idempotency, the usage ledger
    webhooks: Webhooks = field(init=False)  # endpoints, `emit` for the job system, the delivery dispatcher
    batch: JobsRuntime = field(init=False)  # batch jobs and files; its worker starts once the model is loaded
    listener: Listener | None = None  # other replicas' announcements of work (Postgres only: store/notify.py)
    disconnects: Counter = field(init=False)

    def __post_init__(self) -> None:
        self.runtime = ModelRuntime(self.config, self.factory, self.registry, self.drain, self.tokenizers,
                                    more=self.more, cards=self.cards)
        ready = Gauge("sluicegate_ready", "1 once the model has loaded and the engine runs", registry=self.registry)
        ready.set_function(lambda: 1.0 if self.runtime.models and not self.drain.draining else 0.0)
        self.disconnects = Counter(
            "sluicegate_client_disconnects", "requests whose client left before the exchange ended, by stage "
            "(body: while sending the request body; answer: before the response ended)", ["stage"],
            registry=self.registry)
        for stage in ("body", "answer"):  # exported at 0 from the start: a dashboard shows 0, not "no data"
            self.disconnects.labels(stage)
        self.tenancy = Tenancy(self.config, self.store)
        self.webhooks = Webhooks(self.store, self.config.webhooks)
        self.batch = JobsRuntime(self.config.jobs, self.store, self.tenancy.ledger, self.webhooks)

    def open_tenancy(self) -> None:
        """At start-up, on the serving event loop: tenancy (api/tenancy.py), the webhook dispatcher, and with
        Postgres the listener for other replicas' work."""
        self.tenancy.open()
        self.webhooks.start()
        if self.store.engine.dialect.name == "postgresql":
            self.listener = Listener(self.store.url, {JOBS: lambda _payload: self.batch.wake(),
                                                      WEBHOOKS: self.webhooks.notified})
            self.listener.start()

    async def close_tenancy(self) -> None:
        if self.listener is not None:
            await self.listener.close()
            self.listener = None
        await self.webhooks.close()
        await self.tenancy.close()

    async def load(self) -> None:
        """Load the models (api/model_runtime.py); once every one serves, batch work starts, wherever a model
        is served, local or upstream only."""
        if await self.runtime.load():
            self.batch.start(handlers(self.runtime.acquire, self.tenancy, self.runtime.leases),
                             self.runtime.engine_slots())

    def stop_loading(self) -> None:
        """Shutting down: an upstream still being waited for is not checked again."""
        self.runtime.stop_loading()

    async def close(self) -> None:
        await self.batch.stop()  # leases handed back before the engine stops
        await self.runtime.close()


def app_state(conn: HTTPConnection) -> AppState:
    """The owner, for the service accessors (api/services.py) and the server's start and stop; not for routes."""
    state = conn.app.state.sluicegate
    assert isinstance(state, AppState)
    return state
