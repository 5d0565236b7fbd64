"""Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens` (docs/anthropic.md).

Thin, like the OpenAI routes (it runs through the same `serve`): read and refuse by name, call the serving
adapter (serving/anthropic_messages.py), render, in the registry's `Dialect.ANTHROPIC` (api/dialects.py).
Errors are rendered in Anthropic's shape and statuses by one middleware (api/anthropic_errors.py), a stream's
error event by `anthropic_envelope`; stream events are named after their type, with `ping` as the heartbeat
and `message_stop` last (api/sse.py `ANTHROPIC_FRAMING`).

Headers: the key as `x-api-key` or `Authorization: Bearer` (api/middleware/auth.py); `anthropic-version` is
accepted whatever its value (this server has one version of the surface); `anthropic-beta` is ignored: every
beta feature is switched on by a body field, and a field this server does not implement is refused by name.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from sluicegate.api.dialects import render_error
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.routes.common import json_reply, work_doc
from sluicegate.api.routes.openai import read_openai, serve
from sluicegate.api.services import Runtime
from sluicegate.protocol.anthropic_messages import (
    CountTokensRequest,
    Message,
    MessagesRequest,
    MessageTokensCount,
    count_tokens_refusal,
    messages_refusal,
)
from sluicegate.refusal import Rejected
from sluicegate.serving import anthropic_messages as messages

router = APIRouter(tags=["anthropic"])

_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {
                "type": {"type": "string"}, "message": {"type": "string"},
                "code": {"type": ["string", "null"], "description": "our specific kind (docs/errors.md)"},
                "param": {"type": ["string", "null"]},
                "docs_url": {"type": "string", "description": "the error catalog's entry for our type and code "
                             "(docs/errors.md)"},
            },
        },
        "request_id": {"type": "string"},
    },
}
_ERROR_CONTENT = {"application/json": {"schema": _ERROR}}


def _errors(*, work: bool) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {
        status: {"content": _ERROR_CONTENT, "description": text}
        for status, text in (
            (400, "invalid_request_error (our kind in `error.code`, the parameter in `error.param`)"),
            (404, "not_found_error: no such model"),
            (413, "request_too_large"),
            (415, "invalid_request_error: the body must be application/json"),
            (500, "api_error"),
            (503, "overloaded_error: not ready, shutting down, a store unavailable"),
        )
    }
    if work:
        out[409] = {"content": _ERROR_CONTENT, "description": "invalid_request_error: the first request with this "
                    "Idempotency-Key is still running"}
        out[429] = {"content": _ERROR_CONTENT, "description": "rate_limit_error"}
        out[504] = {"content": _ERROR_CONTENT, "description": "timeout_error: the request's deadline passed"}
        out[529] = {"content": _ERROR_CONTENT, "description": "overloaded_error: queue full, or the deadline "
                    "cannot be met at the present load"}
    return out


_STREAM_EVENT = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"enum": ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                           "message_delta", "message_stop", "ping", "error"]},
        "data": {"type": "string", "description": "the event as JSON; its `type` is the event's name"},
    },
}


def _body(name: str) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}}}


@router.post(
    "/v1/messages",
    response_model=Message,
    summary="Anthropic-compatible Messages",
    openapi_extra={
        **_body("MessagesRequest"), **work_doc(),
        "responses": {"200": {"content": {"text/event-stream": {"schema": _STREAM_EVENT}},
                              "description": "with stream: true, Anthropic's typed events"}},
    },
    responses=_errors(work=True),
)
async def create_message(request: Request) -> Response:
    return await serve(request, MessagesRequest, messages_refusal, messages)


@router.post(
    "/v1/messages/count_tokens",
    response_model=MessageTokensCount,
    summary="The prompt tokens a Messages request would run",
    openapi_extra=_body("CountTokensRequest"),
    responses=_errors(work=False),
)
async def count_tokens(request: Request, runtime: Runtime) -> Response:
    ctx = context_of(request.scope)
    try:
        req = await read_openai(request, CountTokensRequest, count_tokens_refusal)
        model = runtime.served(req.model)
        return json_reply(await messages.count_tokens(model, req), ctx)
    except Rejected as exc:
        return render_error(request.scope, exc, ctx.request_id)
