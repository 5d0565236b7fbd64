"""The FastAPI app factory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from sluicegate import __version__
from sluicegate.api.anthropic_errors import AnthropicErrors
from sluicegate.api.drain import DrainMiddleware
from sluicegate.api.errors import install_error_handlers
from sluicegate.api.local_models import ModelLeases
from sluicegate.api.middleware.auth import AuthMiddleware, document_auth
from sluicegate.api.middleware.body_limit import BodyLimitMiddleware
from sluicegate.api.middleware.cors import Cors
from sluicegate.api.middleware.cross_site import CrossSiteWriteMiddleware
from sluicegate.api.middleware.deadline import DeadlineMiddleware
from sluicegate.api.middleware.key_limits import KeyLimitsMiddleware
from sluicegate.api.middleware.ratelimit import RateLimitMiddleware
from sluicegate.api.middleware.request_context import RequestContextMiddleware
from sluicegate.api.middleware.tracing import TracingMiddleware
from sluicegate.api.middleware.trusted_host import HostRule, TrustedHostMiddleware, document_trusted_host
from sluicegate.api.routes import (
    admin_keys,
    anthropic,
    batch_predictions,
    batches,
    error_docs,
    files,
    generate,
    health,
    metrics,
    openai,
    playground,
    predictions,
    responses,
    tokenize,
    usage,
    webhooks,
)
from sluicegate.api.state import AppState, RunnerFactory
from sluicegate.config import Config
from sluicegate.errorcatalog import set_docs_base
from sluicegate.protocol.admin_keys import KeyCreate, KeyUpdate
from sluicegate.protocol.anthropic_messages import CountTokensRequest, MessagesRequest
from sluicegate.protocol.batches import BatchCreateRequest
from sluicegate.protocol.generate import GenerateRequest
from sluicegate.protocol.openai_chat import ChatCompletionRequest
from sluicegate.protocol.openai_completions import CompletionRequest
from sluicegate.protocol.openai_responses import ResponseCreateRequest
from sluicegate.protocol.predictions import PredictionRequest
from sluicegate.protocol.tokenize import DetokenizeRequest, TokenizeRequest
from sluicegate.protocol.webhooks import WebhookEndpointCreate
from sluicegate.store.db import Store
from sluicegate.upstream import TokenizerFactory

REQUEST_MODELS: list[type[BaseModel]] = [GenerateRequest, ChatCompletionRequest, CompletionRequest,
                                         PredictionRequest, WebhookEndpointCreate, BatchCreateRequest,
                                         TokenizeRequest, DetokenizeRequest, KeyCreate, KeyUpdate, MessagesRequest,
                                         CountTokensRequest, ResponseCreateRequest]


def create_app(config: Config, factory: RunnerFactory, *, store: Store | None = None,
               tokenizers: TokenizerFactory | None = None, more: dict[str, RunnerFactory] | None = None,
               cards: dict[str, RunnerFactory] | None = None) -> FastAPI:
    """The app. `store` holds the API keys and the usage ledger (the caller opens, migrates and closes it);
    None: a private in-memory store with no key, so auth is off (tests, the OpenAPI document). `tokenizers`
    gives an upstream model's own tokenizer by name (None: the local model's, upstream/load.py); `more`: further
    local models by served name, each with its engine (docs/models.md, "Several models"); `cards`: their
    tokenizer-only runners by the same names ("": the default's), read at start for a model loaded when asked for
    (default: the full factory)."""
    set_docs_base(config.error_docs_url)  # every envelope's docs_url, for this process (errorcatalog/)
    state = AppState(config, factory, tokenizers=tokenizers, more=more or {}, cards=cards or {}) if store is None \
        else AppState(config, factory, store, tokenizers, more=more or {}, cards=cards or {})

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.open_tenancy()
        loading = asyncio.create_task(state.load())
        try:
            yield
        finally:
            state.stop_loading()  # an upstream still being waited for is not checked again
            await loading
            await state.close()
            await state.close_tenancy()

    app = FastAPI(title="sluicegate", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.sluicegate = state
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(generate.router)
    app.include_router(openai.router)
    app.include_router(anthropic.router)
    app.include_router(responses.router)
    app.include_router(usage.router)
    app.include_router(predictions.router)
    app.include_router(webhooks.router)
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(batch_predictions.router)
    app.include_router(tokenize.router)
    app.include_router(admin_keys.router)
    app.include_router(playground.router)
    app.include_router(error_docs.router)
    # innermost: a local model a request acquires is held until its answer has gone (api/local_models.py)
    app.add_middleware(ModelLeases, pool=lambda: state.runtime.pool)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.limits.max_body_bytes,
                       upload_bytes=config.jobs.max_file_bytes)
    app.add_middleware(DeadlineMiddleware, config=config.deadlines)  # the caller's budget, before the body
    app.add_middleware(RateLimitMiddleware, tenancy=state.tenancy)  # inside auth: it needs the key
    app.add_middleware(KeyLimitsMiddleware, tenancy=state.tenancy)  # the key's request counts, before the body is read
    app.add_middleware(AuthMiddleware, tenancy=state.tenancy)  # outside the body limit: a keyless caller is refused
    app.add_middleware(DrainMiddleware, drain=state.drain)  # in-flight requests; 503 while shutting down
    # a write a page of another origin sent (a form upload needs no preflight): 403 before auth or any work
    app.add_middleware(CrossSiteWriteMiddleware, allowed_origins=config.cors_origins)
    if config.cors_origins:  # outside auth: a preflight needs no key, and a refusal still carries the CORS headers
        app.add_middleware(Cors, origins=config.cors_origins)
    # Outside everything but the request context: a foreign Host (DNS rebinding) reaches no route, key check or
    # limit, and its refusal still carries the request id.
    app.add_middleware(TrustedHostMiddleware, rule=HostRule.for_bind(config.host, config.allowed_hosts))
    app.add_middleware(TracingMiddleware)  # the server span: inside the request context, so it has the id
    app.add_middleware(AnthropicErrors)  # Anthropic's routes: every refusal in its shape, whoever refused
    app.add_middleware(RequestContextMiddleware,  # added last: outermost, so every answer carries the id
                       on_disconnect=lambda stage: state.disconnects.labels(stage).inc())

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for model in REQUEST_MODELS:
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
            document_auth(doc)
            document_trusted_host(doc)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
