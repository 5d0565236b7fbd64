"""`/v1/webhook-endpoints` (create, list, delete; the secret shown once) and the delivery log:
`GET /v1/webhook-endpoints/{id}/deliveries` (one endpoint's) and `GET /v1/webhook-deliveries?subject=`
(every delivery about one job). Each key sees only its own."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from collections.abc import Callable
from typing import Literal, TypeVar, cast

from fastapi import APIRouter, Query, Request, Response

from sluicegate.api.jsonbody import parse_json, validate
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.routes.common import error_responses, json_reply, refuse_query, require_json
from sluicegate.api.services import Settings, WebhooksDep, store_of
from sluicegate.api.validation import plain_name
from sluicegate.protocol.webhooks import (
    WebhookDeliveryList,
    WebhookDeliveryOut,
    WebhookEndpointCreate,
    WebhookEndpointDeleted,
    WebhookEndpointList,
    WebhookEndpointOut,
)
from sluicegate.serving.errors import ApiError
from sluicegate.store.models import WebhookDelivery, WebhookEndpoint
from sluicegate.webhooks import UnsafeUrl
from sluicegate.webhooks import store as db

router = APIRouter(tags=["webhooks"])
log = logging.getLogger("sluicegate.webhooks")
T = TypeVar("T")
ERRORS = ("invalid_request", "not_found", "store_unavailable")


def _ts(t: dt.datetime | None) -> str | None:
    return None if t is None else t.isoformat(timespec="seconds").replace("+00:00", "Z")


def _endpoint(ep: WebhookEndpoint, *, secret: bool = False) -> WebhookEndpointOut:
    return WebhookEndpointOut(
        id=ep.id, url=ep.url, event_types=ep.event_types.split(), created_at=_ts(ep.created_at) or "",
        status="disabled" if ep.disabled_at else "enabled", disabled_reason=ep.disabled_reason,
        secret=ep.secret if secret else None,
    )


def _delivery(d: WebhookDelivery) -> WebhookDeliveryOut:
    return WebhookDeliveryOut(
        id=f"whd_{d.id}", event_id=d.event_id, event_type=d.event_type, endpoint_id=d.endpoint_id,
        subject=d.subject, status=cast(Literal["pending", "delivered", "failed"], d.status),
        attempts=d.attempts, last_status_code=d.last_status_code, last_error=d.last_error,
        created_at=_ts(d.created_at) or "", delivered_at=_ts(d.delivered_at),
        next_attempt_at=_ts(d.next_attempt_at) if d.status == "pending" else None, log=json.loads(d.log),
    )


async def _store(request: Request, call: Callable[..., T], *args: object, **kw: object) -> T:
    try:
        return await asyncio.to_thread(call, store_of(request), *args, **kw)
    except db.TooManyEndpoints:
        raise
    except Exception:
        log.exception("%s the webhook store cannot be reached", context_of(request.scope).request_id)
        raise ApiError("store_unavailable", "webhook endpoints cannot be read or changed right now",
                       retry_after=1) from None


def _owner(request: Request) -> str:
    return context_of(request.scope).key_id or ""


@router.post(
    "/v1/webhook-endpoints", response_model=WebhookEndpointOut, status_code=201,
    summary="Register a URL for batch events; the answer shows its signing secret, once",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/WebhookEndpointCreate"}}}}},
    responses=error_responses("invalid_json", "unsupported_media_type", *ERRORS),
)
async def create_endpoint(request: Request, webhooks: WebhooksDep, config: Settings) -> Response:
    ctx = context_of(request.scope)
    require_json(request)
    refuse_query(request)
    req = validate(parse_json(await request.body()), WebhookEndpointCreate)  # no model needed: works while loading
    try:
        await webhooks.guard.target(req.url)
    except UnsafeUrl as exc:
        raise ApiError("invalid_request", str(exc), param="url", code=exc.code) from None
    limit = config.webhooks.max_endpoints_per_key
    try:
        ep = await _store(request, db.create_endpoint, _owner(request), req.url, list(req.event_types), limit)
    except db.TooManyEndpoints:
        raise ApiError("invalid_request", f"this API key has {limit} webhook endpoints, the most allowed; "
                       "delete one first", param="url", code="too_many_endpoints") from None
    reply = json_reply(_endpoint(ep, secret=True), ctx)
    reply.status_code = 201
    return reply


@router.get("/v1/webhook-endpoints", response_model=WebhookEndpointList, summary="This key's webhook endpoints",
            responses=error_responses(*ERRORS))
async def list_endpoints(request: Request) -> Response:
    eps = await _store(request, db.list_endpoints, _owner(request))
    return json_reply(WebhookEndpointList(data=[_endpoint(e) for e in eps]), context_of(request.scope))


@router.delete("/v1/webhook-endpoints/{endpoint_id}", response_model=WebhookEndpointDeleted,
               summary="Delete an endpoint: nothing more is sent to it; its delivery log stays",
               responses=error_responses(*ERRORS))
async def delete_endpoint(request: Request, endpoint_id: str) -> Response:
    if not await _store(request, db.delete_endpoint, _owner(request), endpoint_id[:64]):
        raise ApiError("not_found", "no such webhook endpoint for this API key", param="endpoint_id",
                       code="endpoint_not_found")
    return json_reply(WebhookEndpointDeleted(id=endpoint_id), context_of(request.scope))


def _only(request: Request, *names: str) -> None:
    for name in request.query_params:
        if name not in names:
            raise ApiError("invalid_request", f"the query parameters here are {', '.join(names)}",
                           param=plain_name(name) or None, code="unknown_field")


@router.get("/v1/webhook-endpoints/{endpoint_id}/deliveries", response_model=WebhookDeliveryList,
            summary="One endpoint's delivery log, newest first", responses=error_responses(*ERRORS))
async def endpoint_deliveries(request: Request, endpoint_id: str, limit: int = Query(20, ge=1, le=100)) -> Response:
    _only(request, "limit")
    if await _store(request, db.get_endpoint, _owner(request), endpoint_id[:64]) is None:
        raise ApiError("not_found", "no such webhook endpoint for this API key", param="endpoint_id",
                       code="endpoint_not_found")
    rows = await _store(request, db.deliveries, _owner(request), endpoint_id=endpoint_id, limit=limit)
    return json_reply(WebhookDeliveryList(data=[_delivery(d) for d in rows]), context_of(request.scope))


@router.get("/v1/webhook-deliveries", response_model=WebhookDeliveryList,
            summary="Every delivery about one subject (a batch's id), newest first",
            responses=error_responses(*ERRORS))
async def subject_deliveries(request: Request, subject: str = Query(min_length=1, max_length=64),
                             limit: int = Query(20, ge=1, le=100)) -> Response:
    _only(request, "subject", "limit")
    rows = await _store(request, db.deliveries, _owner(request), subject=subject, limit=limit)
    return json_reply(WebhookDeliveryList(data=[_delivery(d) for d in rows]), context_of(request.scope))
