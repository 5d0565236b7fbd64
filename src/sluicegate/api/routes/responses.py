"""`/v1/responses`: OpenAI's Responses API on the chat path (serving/openai_responses.py), stored per key.

`POST` reads and refuses like chat (api/routes/openai.py `serve`: idempotency, streaming, disconnects), with the
stored conversation of `previous_response_id` loaded first and the response stored (`store`, default true)
before the client has its last byte. `GET`, `GET .../input_items` and `DELETE` read the store; another key's
response is 404, never 403, so ids do not leak. Errors take OpenAI's shape (api/openai_errors.py).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import re
from typing import Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse

from sluicegate.api.dialects import render_error
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.routes.common import work_doc
from sluicegate.api.routes.openai import STREAM_DOC, body_doc, errors_doc, serve
from sluicegate.api.services import store_of
from sluicegate.api.validation import plain_name
from sluicegate.protocol.openai_responses import (
    ID_PATTERN,
    InputItemList,
    ResponseCreateRequest,
    ResponseDeleted,
    ResponseObject,
    responses_refusal,
)
from sluicegate.serving import openai_responses as surface
from sluicegate.serving.admission import Admission
from sluicegate.serving.context import RequestContext
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel
from sluicegate.store import responses as stored
from sluicegate.store.db import Store

_ID = re.compile(ID_PATTERN)
router = APIRouter(tags=["openai"])
log = logging.getLogger("sluicegate.responses")


def _owner(ctx: RequestContext) -> str:
    return ctx.key_id or ""  # auth off: one shared owner


def _unavailable(ctx: RequestContext, what: str) -> ApiError:
    log.exception("%s responses cannot be %s", ctx.request_id, what)
    return ApiError("store_unavailable", f"stored responses cannot be {what} right now; retry", retry_after=1)


def _not_found(param: str) -> ApiError:
    return ApiError("not_found", f"no stored response with this {param} for this API key", param=param,
                    code="response_not_found")


async def _load(store: Store, ctx: RequestContext, id: str, param: str) -> stored.Stored:
    try:
        found = await asyncio.to_thread(stored.get, store, _owner(ctx), id)
    except Exception:
        raise _unavailable(ctx, "read") from None
    if found is None:
        raise _not_found(param)
    return found


class _Surface:
    """The Responses adapter bound to this request's store and key (a serving/surface.py `StreamingSurface`)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.conversation = surface.Conversation()

    async def prepare(self, model: ServedModel, req: ResponseCreateRequest, ctx: RequestContext,
                      admission: Admission) -> Any:
        if req.previous_response_id is not None:
            prev = await _load(self.store, ctx, req.previous_response_id, "previous_response_id")
            body = json.loads(prev.body)
            self.conversation.history = json.loads(prev.items) + body["output"]
        if req.store:
            self.conversation.save = lambda response, items: self._save(ctx, response, items)
        return await surface.prepare(model, req, ctx, self.conversation, admission)

    async def _save(self, ctx: RequestContext, response: ResponseObject, items: list[dict[str, Any]]) -> bool:
        """Whether the response was stored. A failure comes after the work: the answer goes out all the same,
        `store: false` (no retryable 503 after work: HAProxy and the SDKs would compute it again)."""
        try:
            await asyncio.to_thread(
                stored.save, self.store, id=response.id, key_id=_owner(ctx), created_at=dt.datetime.now(dt.UTC),
                model=response.model, body=response.model_dump_json(), items=json.dumps(items, ensure_ascii=False))
        except Exception:
            log.exception("%s the response was made but could not be stored; answered with store: false",
                          ctx.request_id)
            return False
        return True

    def stream(self, model: ServedModel, plan: surface.ResponsesPlan, ctx: RequestContext) -> Any:
        return surface.stream(model, plan, ctx, self.conversation)

    async def complete(self, model: ServedModel, plan: surface.ResponsesPlan, ctx: RequestContext) -> Any:
        return await surface.complete(model, plan, ctx, self.conversation)


def _store_errors() -> dict[int | str, dict[str, Any]]:
    """The error responses of the stored-response routes."""
    out = errors_doc()
    out[404] = {**out[404], "description": "response_not_found: this key has no stored response with that id"}
    out[503] = {**out[503], "description": "store_unavailable: the store cannot be read right now"}
    return out


_RESPONSES_STREAM_DOC = {"200": {**STREAM_DOC["200"], "description": "with stream: true, the typed events "
                                 "(`response.created` ... `response.completed`) as server-sent events, each "
                                 "with `type` and `sequence_number`, then `data: [DONE]`"}}


@router.post(
    "/v1/responses",
    response_model=ResponseObject,
    summary="OpenAI-compatible Responses API (served as a chat completion)",
    openapi_extra={**body_doc("ResponseCreateRequest"), "responses": _RESPONSES_STREAM_DOC, **work_doc()},
    responses=errors_doc(work=True),
)
async def create_response(request: Request) -> Response:
    return await serve(request, ResponseCreateRequest, responses_refusal, _Surface(store_of(request)))


def _no_query(request: Request, allowed: tuple[str, ...] = ()) -> None:
    for name in request.query_params:
        if name not in allowed:
            takes = ", ".join(allowed) if allowed else "none"
            raise ApiError("invalid_request", f"the query parameters here are: {takes}",
                           param=plain_name(name) or None, code="unknown_field")


def _check_id(response_id: str) -> None:
    if not _ID.fullmatch(response_id):
        raise _not_found("response_id")


@router.get("/v1/responses/{response_id}", response_model=ResponseObject, summary="A stored response",
            description="Only the key that made it sees it; any other gets 404.", responses=_store_errors())
async def get_response(request: Request, response_id: str) -> Response:
    ctx = context_of(request.scope)
    try:
        _no_query(request)
        _check_id(response_id)
        found = await _load(store_of(request), ctx, response_id, "response_id")
    except ApiError as exc:
        return render_error(request.scope, exc, ctx.request_id)
    return Response(found.body, media_type="application/json")


@router.delete("/v1/responses/{response_id}", response_model=ResponseDeleted, summary="Delete a stored response",
               responses=_store_errors())
async def delete_response(request: Request, response_id: str) -> Response:
    ctx = context_of(request.scope)
    try:
        _no_query(request)
        _check_id(response_id)
        try:
            gone = await asyncio.to_thread(stored.remove, store_of(request), _owner(ctx), response_id)
        except Exception:
            raise _unavailable(ctx, "deleted") from None
        if not gone:
            raise _not_found("response_id")
    except ApiError as exc:
        return render_error(request.scope, exc, ctx.request_id)
    return JSONResponse(ResponseDeleted(id=response_id).model_dump(mode="json"))


@router.get(
    "/v1/responses/{response_id}/input_items", response_model=InputItemList,
    summary="The input items a stored response read (a continued conversation's history included)",
    description="Cursor pagination as OpenAI's lists: `limit` (1-100, default 20), `order` (`desc`, the "
                "default: newest first; or `asc`) and `after` (an item id: the page starts after it).",
    responses=_store_errors(),
)
async def list_input_items(
    request: Request,
    response_id: str,
    limit: int = Query(20, ge=1, le=100),
    order: Literal["asc", "desc"] = Query("desc"),
    after: str | None = Query(None, min_length=1, max_length=256),
) -> Response:
    ctx = context_of(request.scope)
    try:
        _no_query(request, ("limit", "order", "after"))
        _check_id(response_id)
        found = await _load(store_of(request), ctx, response_id, "response_id")
        items: list[dict[str, Any]] = json.loads(found.items)
        if order == "desc":
            items.reverse()
        if after is not None:
            ids = [i.get("id") for i in items]
            if after not in ids:
                raise ApiError("invalid_request", "after names no input item of this response", param="after",
                               code="invalid_cursor")
            items = items[ids.index(after) + 1:]
        page = items[:limit]
    except ApiError as exc:
        return render_error(request.scope, exc, ctx.request_id)
    return JSONResponse(InputItemList(
        data=page, first_id=page[0]["id"] if page else None, last_id=page[-1]["id"] if page else None,
        has_more=len(items) > limit).model_dump(mode="json"))
