"""The OpenAI-compatible surface: chat and text completions, and the model list.

Thin: read and refuse (every field is either supported or refused by name), call the serving layer, render.
Errors raised here render in the routes' registry dialect, `openai`: OpenAI's statuses (api/dialects.py,
api/openai_errors.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from sluicegate.api import work
from sluicegate.api.batch_items import parse_openai
from sluicegate.api.dialects import render_error
from sluicegate.api.jsonbody import parse_json
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.routes.common import json_reply, refuse_query, require_json, work_doc
from sluicegate.api.services import Runtime, Settings, runtime_of
from sluicegate.protocol import openai_chat, openai_completions
from sluicegate.protocol.common import ErrorEnvelope
from sluicegate.protocol.openai_chat import ChatCompletion, ChatCompletionRequest
from sluicegate.protocol.openai_common import FieldRefusal
from sluicegate.protocol.openai_completions import Completion, CompletionRequest
from sluicegate.protocol.openai_models import ModelDetails, ModelList, ModelState, OpenAIModel
from sluicegate.refusal import Rejected
from sluicegate.serving import openai_chat as chat
from sluicegate.serving import openai_completions as completions
from sluicegate.serving.model_card import describe
from sluicegate.serving.models import ServedModel
from sluicegate.serving.surface import StreamingSurface

router = APIRouter(tags=["openai"])
M = TypeVar("M", bound=BaseModel)
STARTED = int(time.time())


async def read_openai(
    request: Request,
    model: type[M],
    refuse: Callable[[Mapping[str, Any]], FieldRefusal | None],
) -> M:
    require_json(request)
    refuse_query(request)
    t = time.perf_counter()
    parsed = parse_openai(parse_json(await request.body()), model, refuse)
    context_of(request.scope).record.stage("parse", t)
    return parsed


def errors_doc(*, work: bool = False) -> dict[int | str, dict[str, Any]]:
    """The error responses; `work`: a route that creates work, so its deadline can pass (504)."""
    return {
        status: {"model": ErrorEnvelope, "description": text}
        for status, text in (
            (400, "invalid_request_error (our kind in `code`: e.g. deadline_too_short, invalid_header)"),
            (404, "model_not_found"),
            (409, "idempotency_key_in_use: the first request with this Idempotency-Key is still running"),
            (413, "body_too_large"),
            (415, "unsupported_media_type"),
            (500, "internal_error"),
            (503, "overloaded (queue full, or the deadline cannot be met at the present load), not_ready, "
                  "shutting_down"),
            *([(504, "deadline_exceeded: the request's deadline passed (docs/timeouts.md)")] if work else []),
        )
    }


def body_doc(name: str) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
        }
    }


# One server-sent event (OpenAPI before 3.2 describes each event with `schema`, as parsed: its fields).
_SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "event": {"enum": ["message", "error"], "description": "`message` (the default, not sent), or `error` on "
                  "a failure mid-stream: `data` is then the error envelope"},
        "data": {"type": "string", "description": "a chunk as JSON, the error envelope, or `[DONE]` (always last)"},
    },
}
STREAM_DOC = {
    "200": {
        "content": {"text/event-stream": {"schema": _SSE_EVENT}},
        "description": "with stream: true, chunks as server-sent events, then `data: [DONE]`",
    }
}


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletion,
    summary="OpenAI-compatible chat completion",
    openapi_extra={**body_doc("ChatCompletionRequest"), "responses": STREAM_DOC, **work_doc()},
    responses=errors_doc(work=True),
)
async def chat_completions(request: Request) -> Response:
    return await serve(request, ChatCompletionRequest, openai_chat.chat_refusal, chat)


@router.post(
    "/v1/completions",
    response_model=Completion,
    summary="OpenAI-compatible text completion",
    openapi_extra={**body_doc("CompletionRequest"), "responses": STREAM_DOC, **work_doc()},
    responses=errors_doc(work=True),
)
async def text_completions(request: Request) -> Response:
    return await serve(request, CompletionRequest, openai_completions.completion_refusal, completions)


async def serve(
    request: Request,
    schema: type[M],
    refuse: Callable[[Mapping[str, Any]], FieldRefusal | None],
    surface: StreamingSurface,  # serving.openai_chat, serving.openai_completions, an adapter object
) -> Response:
    """The work lifecycle (api/work.py) of an OpenAI-shaped surface (chat, completions, and the surfaces read
    the same way: Responses, Anthropic's Messages, each in its route's error dialect and stream framing): the
    body read and refused by name here, the model it names served."""

    async def read() -> tuple[M, ServedModel]:
        req = await read_openai(request, schema, refuse)
        return req, await runtime_of(request).acquire(getattr(req, "model", None), context_of(request.scope).deadline)

    return await work.serve(request, read, surface)


def _model_object(served: ServedModel, state: ModelState) -> OpenAIModel:
    return OpenAIModel(id=served.identity.name, created=STARTED, state=state)


@router.get(
    "/v1/models", response_model=ModelList, summary="The served models, OpenAI-shaped", responses=errors_doc()
)
async def list_models(request: Request, runtime: Runtime) -> Response:
    ctx = context_of(request.scope)
    try:
        return json_reply(ModelList(data=[_model_object(m, runtime.state_of(m)) for m in runtime.all_served()]), ctx)
    except Rejected as exc:
        return render_error(request.scope, exc, ctx.request_id)


@router.get(
    "/v1/models/{model_id}",
    response_model=ModelDetails,
    summary="One model: OpenAI's fields, then versions, digest, window, every limit, schemas, defaults",
    responses=errors_doc(),
)
async def get_model(request: Request, model_id: str, runtime: Runtime, config: Settings) -> Response:
    ctx = context_of(request.scope)
    try:
        model = runtime.served(model_id)
        return json_reply(describe(model, config, model_id, runtime.state_of(model)), ctx)
    except Rejected as exc:
        return render_error(request.scope, exc, ctx.request_id)
