"""The OpenAI-compatible surface: chat and text completions, and the model list.

Thin: read and refuse (every field is either supported or refused by name), call the serving layer, render.
Errors raised here render with OpenAI's statuses (api/openai_errors.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ValidationError

from sluicegate.api.disconnect import ClientDisconnected, unless_disconnected
from sluicegate.api.idempotency import Held, begin, idempotency_key
from sluicegate.api.jsonbody import parse_json
from sluicegate.api.metering import from_runs
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.openai_errors import openai_envelope, openai_error_response
from sluicegate.api.routes.common import idempotency_doc, json_reply, refuse_query, require_json
from sluicegate.api.sse import sse_response
from sluicegate.api.state import app_state
from sluicegate.api.validation import error_from_details
from sluicegate.protocol import openai_chat, openai_completions
from sluicegate.protocol.common import ErrorEnvelope
from sluicegate.protocol.openai_chat import ChatCompletion, ChatCompletionRequest
from sluicegate.protocol.openai_common import Refusal, clean_loc
from sluicegate.protocol.openai_completions import Completion, CompletionRequest
from sluicegate.protocol.openai_models import ModelDetails, ModelList, OpenAIModel
from sluicegate.serving import openai_chat as chat
from sluicegate.serving import openai_completions as completions
from sluicegate.serving.errors import ApiError
from sluicegate.serving.model_card import describe

router = APIRouter(tags=["openai"])
M = TypeVar("M", bound=BaseModel)
STARTED = int(time.time())


def _validation_error(exc: ValidationError, data: Any) -> ApiError:
    """The shared validation message, located by the client's JSON path (without union-member names).

    A union reports one error per member at the same place; the member that took the input's type (and
    failed a bound) explains the problem, so it is kept and the type mismatches of the others are dropped.
    """
    best: dict[tuple[int | str, ...], dict[str, Any]] = {}
    for e in exc.errors(include_url=False):
        loc = clean_loc(tuple(e["loc"]), data, missing=e["type"] == "missing")
        mismatch = e["type"].endswith("_type")
        if loc not in best or (best[loc]["type"].endswith("_type") and not mismatch):
            best[loc] = {**e, "loc": loc}
    return error_from_details(list(best.values()))


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
        raise _validation_error(exc, data) from None
    context_of(request.scope).stage("parse", t)
    return parsed


def _errors() -> dict[int | str, dict[str, Any]]:
    return {
        status: {"model": ErrorEnvelope, "description": text}
        for status, text in (
            (400, "invalid_request_error (our kind in `code`)"),
            (404, "model_not_found"),
            (409, "idempotency_key_in_use: the first request with this Idempotency-Key is still running"),
            (413, "body_too_large"),
            (415, "unsupported_media_type"),
            (500, "internal_error"),
            (503, "overloaded, not_ready, shutting_down"),
        )
    }


def _body(name: str) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
        }
    }


_STREAM_DOC = {
    "200": {
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
        "description": "with stream: true, chunks as server-sent events, then `data: [DONE]`",
    }
}


@router.post(
    "/v1/chat/completions",
    response_model=ChatCompletion,
    summary="OpenAI-compatible chat completion",
    openapi_extra={**_body("ChatCompletionRequest"), "responses": _STREAM_DOC, **idempotency_doc()},
    responses=_errors(),
)
async def chat_completions(request: Request) -> Response:
    return await _serve(request, ChatCompletionRequest, openai_chat.chat_refusal, chat)


@router.post(
    "/v1/completions",
    response_model=Completion,
    summary="OpenAI-compatible text completion",
    openapi_extra={**_body("CompletionRequest"), "responses": _STREAM_DOC, **idempotency_doc()},
    responses=_errors(),
)
async def text_completions(request: Request) -> Response:
    return await _serve(request, CompletionRequest, openai_completions.completion_refusal, completions)


async def _serve(
    request: Request,
    schema: type[M],
    refuse: Callable[[Mapping[str, Any]], Refusal | None],
    surface: ModuleType,  # serving.openai_chat or serving.openai_completions: prepare, stream, complete
) -> Response:
    """Read, plan and start the runs, then stream them as SSE or answer once (chat and completions alike).
    The runs end with the response whatever happens: `close` aborts what a gone client left running. With an
    Idempotency-Key the work runs to its end whatever the client does, and its answer is stored
    (api/idempotency.py)."""
    ctx = context_of(request.scope)
    held: Held | None = None
    try:
        key = idempotency_key(request)
        req = await read_openai(request, schema, refuse)
        model = app_state(request).served()
        if key is not None:
            begun = await begin(request, key, req)
            if isinstance(begun, Response):
                return begun
            held = begun
            plan = await held.start(lambda: surface.prepare(model, req, ctx))
        else:
            plan = await surface.prepare(model, req, ctx)  # started: the runs are in the engine
        ctx.meter = lambda: from_runs(plan.runs)  # read when the response has ended: streams and disconnects too
    except ApiError as exc:
        return openai_error_response(exc, ctx.request_id)
    if getattr(req, "stream", False):
        stream = surface.stream(model, plan, ctx)
        if held is not None:
            return held.stream(stream, openai_envelope)
        return sse_response(
            stream, request_id=ctx.request_id, render_error=openai_envelope, on_close=plan.runs.close
        )

    async def finish() -> Response:
        try:
            return json_reply(await surface.complete(model, plan, ctx), ctx)
        finally:
            plan.runs.close()

    if held is not None:
        return await held.answer(request.receive, finish(), openai_error_response)
    try:
        return await unless_disconnected(request.receive, finish())
    except ClientDisconnected:
        return Response(status_code=499)
    except ApiError as exc:
        return openai_error_response(exc, ctx.request_id)
    finally:
        plan.runs.close()


def _model_object(request: Request, requested: str | None) -> OpenAIModel:
    served = app_state(request).served()
    ident = served.resolve(requested)
    return OpenAIModel(id=ident.name, created=STARTED)


@router.get(
    "/v1/models", response_model=ModelList, summary="The served model, OpenAI-shaped", responses=_errors()
)
async def list_models(request: Request) -> Response:
    ctx = context_of(request.scope)
    try:
        return json_reply(ModelList(data=[_model_object(request, None)]), ctx)
    except ApiError as exc:
        return openai_error_response(exc, ctx.request_id)


@router.get(
    "/v1/models/{model_id}",
    response_model=ModelDetails,
    summary="One model: OpenAI's fields, then versions, digest, window, every limit, schemas, defaults",
    responses=_errors(),
)
async def get_model(request: Request, model_id: str) -> Response:
    ctx = context_of(request.scope)
    try:
        state = app_state(request)
        return json_reply(describe(state.served(), state.config, model_id), ctx)
    except ApiError as exc:
        return openai_error_response(exc, ctx.request_id)
