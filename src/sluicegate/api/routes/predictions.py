"""`POST /v1/predictions`, `GET /v1/predictions/{id}`, `GET /v1/predictions`: stored predictions per key.

Thin: the work lifecycle (api/work.py) runs the serving adapter (serving/predictions.py), and this stores the
prediction (store/predictions.py) before answering, so an id a client was given can always be fetched. Another
key's prediction is 404.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import re

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.routes.common import error_responses, idempotency_doc, list_page, read_work
from sluicegate.api.services import store_of
from sluicegate.api.validation import plain_name
from sluicegate.api.work import serve
from sluicegate.protocol.predictions import Prediction, PredictionList, PredictionRequest
from sluicegate.serving import predictions as serving
from sluicegate.serving.context import RequestContext
from sluicegate.serving.errors import ApiError
from sluicegate.store import predictions as stored

router = APIRouter(tags=["predictions"])
log = logging.getLogger("sluicegate.predictions")

ERRORS = ("invalid_json", "unsupported_media_type", "body_too_large", "invalid_request", "model_not_found",
          "idempotency_key_in_use", "overloaded", "store_unavailable", "internal_error")
_ID = re.compile(r"pred_[0-9a-f]{24}")


def _owner(ctx: RequestContext) -> str:
    return ctx.key_id or ""  # auth off: one shared owner


NOT_STORED = "not stored: the store failed after the prediction was made, so GET cannot return it; keep this answer"


async def _save(request: Request, ctx: RequestContext, record: Prediction) -> Prediction:
    """The record as answered: stored, or, when storing failed after the work, delivered all the same with a
    warning (no retryable 503 after work: a retry would compute it again, and be charged again)."""
    store = store_of(request)
    try:
        await asyncio.to_thread(stored.save, store, id=record.id, key_id=_owner(ctx),
                                created_at=dt.datetime.now(dt.UTC), model=record.model.ref,
                                body=record.model_dump_json())
    except Exception:
        log.exception("%s the prediction was made but could not be stored; answered with a warning", ctx.request_id)
        return record.model_copy(update={"warnings": [*record.warnings, NOT_STORED]})
    return record


@router.post(
    "/v1/predictions", response_model=Prediction, summary="Make a prediction and store it",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/PredictionRequest"}}}}, **idempotency_doc()},
    responses=error_responses(*ERRORS),
)
async def create_prediction(request: Request) -> Response:
    ctx = context_of(request.scope)

    async def keep(record: BaseModel) -> BaseModel:  # stored before it is answered: an id given can be fetched
        assert isinstance(record, Prediction)
        return await _save(request, ctx, record)

    return await serve(request, lambda: read_work(request, PredictionRequest), serving, keep=keep)


@router.get(
    "/v1/predictions/{prediction_id}", response_model=Prediction, summary="A stored prediction",
    description="Only the key that made it sees it; any other gets 404.",
    responses=error_responses("not_found", "store_unavailable"),
)
async def get_prediction(request: Request, prediction_id: str) -> Response:
    ctx = context_of(request.scope)
    body = None
    if _ID.fullmatch(prediction_id):
        try:
            body = await asyncio.to_thread(stored.get, store_of(request), _owner(ctx), prediction_id)
        except Exception:
            log.exception("%s predictions cannot be read", ctx.request_id)
            raise ApiError("store_unavailable", "predictions cannot be read right now", retry_after=1) from None
    if body is None:
        raise ApiError("not_found", "no such prediction for this API key", param="prediction_id",
                       code="prediction_not_found")
    return Response(body, media_type="application/json")


@router.get(
    "/v1/predictions", response_model=PredictionList, summary="This key's predictions, newest first",
    description="Cursor pagination as OpenAI's lists: `limit` (1-100, default 20) and `after` (the `last_id` "
                "of the previous page).",
    responses=error_responses("invalid_request", "store_unavailable"),
)
async def list_predictions(
    request: Request,
    limit: int = Query(20, ge=1, le=100),
    after: str | None = Query(None, max_length=64, json_schema_extra={"pattern": "^" + _ID.pattern + "$"},
                              description="the `last_id` of the previous page; one that names no prediction of "
                              "this key is refused (`invalid_cursor`): stored state, not a schema rule"),
) -> Response:
    ctx = context_of(request.scope)
    for name in request.query_params:
        if name not in ("limit", "after"):
            raise ApiError("invalid_request", "the query parameters here are limit and after",
                           param=plain_name(name) or None, code="unknown_field")
    if after is not None and not _ID.fullmatch(after):
        raise ApiError("invalid_request", "after must be a prediction id (pred_...)", param="after",
                       code="invalid_cursor")
    # a store that fails is a 503 `store_unavailable` (api/errors.py), as on every route
    page = await list_page(stored.page, store_of(request), _owner(ctx), limit=limit, after=after)
    return JSONResponse({
        "object": "list", "data": [json.loads(b) for b in page.bodies], "has_more": page.has_more,
        "first_id": page.ids[0] if page.ids else None, "last_id": page.ids[-1] if page.ids else None,
    })
