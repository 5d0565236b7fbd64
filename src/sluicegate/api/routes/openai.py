"""The OpenAI-compatible surface: chat and text completions, and the model list.

Thin: read and refuse (every field is either supported or refused by name), call the serving layer, render.
Errors raised here render with OpenAI's statuses (api/openai_errors.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, Protocol, TypeVar

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ValidationError

from sluicegate.api.detached import Render
from sluicegate.api.disconnect import ClientDisconnected, unless_disconnected
from sluicegate.api.idempotency import Held, begin, idempotency_key
from sluicegate.api.jsonbody import parse_json
from sluicegate.api.metering import from_runs
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.openai_errors import openai_envelope, openai_error_response
from sluicegate.api.routes.common import json_reply, refuse_query, require_json, work_doc
from sluicegate.api.sse import OPENAI_FRAMING, Framing, sse_response
from sluicegate.api.state import app_state
from sluicegate.api.validation import openai_validation_error as validation_error
from sluicegate.protocol import openai_chat, openai_completions
from sluicegate.protocol.common import ErrorEnvelope
from sluicegate.protocol.openai_chat import ChatCompletion, ChatCompletionRequest
from sluicegate.protocol.openai_common import Refusal
from sluicegate.protocol.openai_completions import Completion, CompletionRequest
from sluicegate.protocol.openai_models import ModelDetails, ModelList, OpenAIModel
from sluicegate.serving import openai_chat as chat
from sluicegate.serving import openai_completions as completions
from sluicegate.serving.errors import ApiError
from sluicegate.serving.model_card import describe
from sluicegate.serving.models import ServedModel

router = APIRouter(tags=["openai"])
M = TypeVar("M", bound=BaseModel)
STARTED = int(time.time())


async def read_openai(
    request: Request,
    model: type[M],
    refuse: Callable[[Mapping[str, Any]], Refusal | None],
) -> M:
    require_json(request)
    refuse_query(request)
    t = time.perf_counter()
    data = parse_json(await request.body())
    if not isinstance(data, dict):
        raise ApiError("invalid_request", "the body must be a JSON object", code="wrong_type")
    refused = refuse(data)
    if refused is not None:
        raise ApiError("invalid_request", refused.message, param=refused.param, code=refused.code)
    try:
        parsed = model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, data) from None
    context_of(request.scope).stage("parse", t)
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


class Surface(Protocol):
    """A serving adapter (serving.openai_chat, serving.openai_completions, a Responses surface): `prepare`
    starts the runs and returns a plan with `.runs`; `stream` yields its items; `complete` its one answer."""

    async def prepare(self, model: ServedModel, req: Any, ctx: Any) -> Any: ...
    def stream(self, model: ServedModel, plan: Any, ctx: Any) -> Any: ...
    async def complete(self, model: ServedModel, plan: Any, ctx: Any) -> BaseModel: ...


async def serve(
    request: Request,
    schema: type[M],
    refuse: Callable[[Mapping[str, Any]], Refusal | None],
    surface: Surface | ModuleType,  # serving.openai_chat, serving.openai_completions, an adapter object
    *,
    render: Render = openai_error_response,
    render_event: Callable[[ApiError, str], dict[str, Any]] = openai_envelope,
    framing: Framing = OPENAI_FRAMING,
) -> Response:
    """Read, plan and start the runs, then stream them as SSE or answer once (chat and completions alike, and
    the surfaces that adapt chat: Anthropic's Messages, with its own error rendering and stream framing).
    The runs end with the response whatever happens: `close` aborts what a gone client left running. With an
    Idempotency-Key the work runs to its end whatever the client does, and its answer is stored
    (api/idempotency.py)."""
    ctx = context_of(request.scope)
    held: Held | None = None
    try:
        key = idempotency_key(request)
        req = await read_openai(request, schema, refuse)
        model = app_state(request).served(getattr(req, "model", None))
        if key is not None:
            held = begin(request, key, req)
            started = await held.start(lambda: surface.prepare(model, req, ctx))
            if isinstance(started, Response):  # the key's stored answer
                return started
            plan = started
        else:
            plan = await surface.prepare(model, req, ctx)  # started: the runs are in the engine
        ctx.meter = lambda: from_runs(plan.runs)  # read when the response has ended: streams and disconnects too
    except ApiError as exc:
        return render(exc, ctx.request_id)
    if getattr(req, "stream", False):
        stream = surface.stream(model, plan, ctx)
        if held is not None:
            return held.stream(stream, render_event, framing)
        return sse_response(
            stream, request_id=ctx.request_id, render_error=render_event, on_close=plan.runs.close,
            framing=framing,
        )

    async def finish() -> Response:
        try:
            return json_reply(await surface.complete(model, plan, ctx), ctx)
        finally:
            plan.runs.close()

    if held is not None:
        return await held.answer(request.receive, finish(), render)
    try:
        return await unless_disconnected(request.receive, finish())
    except ClientDisconnected:
        return Response(status_code=499)
    except ApiError as exc:
        return render(exc, ctx.request_id)
    finally:
        plan.runs.close()


def _model_object(served: ServedModel) -> OpenAIModel:
    return OpenAIModel(id=served.identity.name, created=STARTED)


@router.get(
    "/v1/models", response_model=ModelList, summary="The served models, OpenAI-shaped", responses=errors_doc()
)
async def list_models(request: Request) -> Response:
    ctx = context_of(request.scope)
    try:
        return json_reply(ModelList(data=[_model_object(m) for m in app_state(request).all_served()]), ctx)
    except ApiError as exc:
        return openai_error_response(exc, ctx.request_id)


@router.get(
    "/v1/models/{model_id}",
    response_model=ModelDetails,
    summary="One model: OpenAI's fields, then versions, digest, window, every limit, schemas, defaults",
    responses=errors_doc(),
)
async def get_model(request: Request, model_id: str) -> Response:
    ctx = context_of(request.scope)
    try:
        state = app_state(request)
        return json_reply(describe(state.served(model_id), state.config, model_id), ctx)
    except ApiError as exc:
        return openai_error_response(exc, ctx.request_id)
