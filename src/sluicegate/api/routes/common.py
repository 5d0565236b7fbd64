"""Helpers every JSON route shares: content type, body parsing, the served model, the JSON reply."""

from __future__ import annotations

import time
from typing import Any, TypeVar

from fastapi import Request, Response
from pydantic import BaseModel

from sluicegate.api.envelope import envelope
from sluicegate.api.jsonbody import parse_model
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.state import app_state
from sluicegate.serving.context import RequestContext
from sluicegate.serving.errors import STATUS, ApiError
from sluicegate.serving.models import ServedModel

M = TypeVar("M", bound=BaseModel)


def require_json(request: Request) -> None:
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise ApiError("unsupported_media_type", "the body must be sent as Content-Type: application/json",
                       code="wrong_content_type")


async def read_request(request: Request, model: type[M]) -> tuple[M, RequestContext, ServedModel]:
    """Content type, body, schema, then readiness: a client learns of its own mistakes even while loading."""
    ctx = context_of(request.scope)
    require_json(request)
    t = time.perf_counter()
    raw = await request.body()
    parsed = parse_model(raw, model)
    ctx.stage("parse", t)
    return parsed, ctx, app_state(request).served()


def json_reply(payload: BaseModel, ctx: RequestContext) -> Response:
    t = time.perf_counter()
    body = payload.model_dump_json()
    ctx.stage("serialize", t)
    return Response(body, media_type="application/json")


def error_responses(*types: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the envelope under each status these error types use."""
    from sluicegate.protocol.common import ErrorEnvelope

    out: dict[int | str, dict[str, Any]] = {}
    for t in types:
        out.setdefault(STATUS[t], {"model": ErrorEnvelope, "description": ", ".join(
            x for x in types if STATUS[x] == STATUS[t])})
    return out


__all__ = ["envelope", "error_responses", "json_reply", "read_request", "require_json"]
