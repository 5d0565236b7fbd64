"""The app's services, one accessor each, for routes to name what they use: as a FastAPI dependency
(`Annotated[ModelRuntime, Depends(runtime_of)]`, the aliases below) or called with the request from a helper
that has it. The owner that builds, starts and stops them is api/state.py; routes do not reach through it."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from prometheus_client import CollectorRegistry
from starlette.requests import HTTPConnection

from sluicegate.api.drain import Drain
from sluicegate.api.model_runtime import ModelRuntime
from sluicegate.api.state import app_state
from sluicegate.api.tenancy import Tenancy
from sluicegate.config import Config
from sluicegate.jobs.runtime import JobsRuntime
from sluicegate.store.db import Store
from sluicegate.webhooks import Webhooks


def config_of(conn: HTTPConnection) -> Config:
    return app_state(conn).config


def runtime_of(conn: HTTPConnection) -> ModelRuntime:
    """The served models and the engine (api/model_runtime.py)."""
    return app_state(conn).runtime


def tenancy_of(conn: HTTPConnection) -> Tenancy:
    """Keys, limits, idempotency, the usage ledger (api/tenancy.py)."""
    return app_state(conn).tenancy


def jobs_of(conn: HTTPConnection) -> JobsRuntime:
    """Batch jobs and files, and their worker (jobs/runtime.py)."""
    return app_state(conn).batch


def store_of(conn: HTTPConnection) -> Store:
    """The database: keys, stored predictions and responses, webhook endpoints."""
    return app_state(conn).store


def webhooks_of(conn: HTTPConnection) -> Webhooks:
    return app_state(conn).webhooks


def registry_of(conn: HTTPConnection) -> CollectorRegistry:
    """This app's metrics (engine, readiness, disconnects)."""
    return app_state(conn).registry


def drain_of(conn: HTTPConnection) -> Drain:
    return app_state(conn).drain


Settings = Annotated[Config, Depends(config_of)]
Runtime = Annotated[ModelRuntime, Depends(runtime_of)]
TenancyDep = Annotated[Tenancy, Depends(tenancy_of)]
Jobs = Annotated[JobsRuntime, Depends(jobs_of)]
StoreDep = Annotated[Store, Depends(store_of)]
WebhooksDep = Annotated[Webhooks, Depends(webhooks_of)]
Registry = Annotated[CollectorRegistry, Depends(registry_of)]
DrainDep = Annotated[Drain, Depends(drain_of)]
