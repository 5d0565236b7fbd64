"""Helpers every JSON route shares: content type, body parsing, the served model, the JSON reply."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request, Response
from pydantic import BaseModel

from sluicegate.api.envelope import envelope
from sluicegate.api.jsonbody import parse_json, validate
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.services import runtime_of
from sluicegate.api.validation import plain_name
from sluicegate.jobs.runtime import JobsRuntime
from sluicegate.jobs.store import JobView
from sluicegate.serving import deadline
from sluicegate.serving.context import RequestContext
from sluicegate.serving.errors import STATUS, ApiError
from sluicegate.serving.models import ServedModel
from sluicegate.store.db import UnknownCursor

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


async def list_page(call: Callable[..., T], *args: Any, **kw: Any) -> T:
    """One page of a list, read in a thread; a cursor (`after`) that names nothing of the calling key is a
    refusal naming it (`invalid_cursor`), the same for an unknown id and another key's, so a cursor never tells
    whether another key's object exists (store/db.py)."""
    try:
        return await asyncio.to_thread(call, *args, **kw)
    except UnknownCursor:
        raise ApiError("invalid_request", "after names nothing of this API key in this list; use an id from it",
                       param="after", code="invalid_cursor") from None


def require_json(request: Request) -> None:
    ctype, _, params = request.headers.get("content-type", "").partition(";")
    if ctype.strip().lower() != "application/json":
        raise ApiError("unsupported_media_type", "the body must be sent as Content-Type: application/json",
                       code="wrong_content_type")
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            raise ApiError("unsupported_media_type", "the body must be UTF-8 (charset=utf-8, or no charset)",
                           code="wrong_charset")


def refuse_query(request: Request) -> None:
    """JSON routes take every parameter in the body: one in the query string must not be silently ignored."""
    if request.scope.get("query_string"):
        name = next(iter(request.query_params.keys()), "")
        raise ApiError("invalid_request", "this route takes its parameters in the JSON body, not the query "
                       "string", param=plain_name(name) if name else None, code="unknown_field")


async def read_request(request: Request, model: type[M]) -> tuple[M, RequestContext, ServedModel]:
    """Content type, body, schema, then readiness: a client learns of its own mistakes even while loading."""
    ctx = context_of(request.scope)
    require_json(request)
    refuse_query(request)
    t = time.perf_counter()
    raw = await request.body()
    t = ctx.record.stage("read", t)
    data = parse_json(raw)
    t = ctx.record.stage("parse", t)
    parsed = validate(data, model)
    ctx.record.stage("validate", t)
    requested = getattr(parsed, "model", None)
    return parsed, ctx, await runtime_of(request).acquire(requested if isinstance(requested, str) else None,
                                                          ctx.deadline)


async def read_work(request: Request, model: type[M]) -> tuple[M, ServedModel]:
    """`read_request` for the work lifecycle (api/work.py): the parsed request and the served model."""
    parsed, _, served = await read_request(request, model)
    return parsed, served


def json_reply(payload: BaseModel, ctx: RequestContext) -> Response:
    t = time.perf_counter()
    body = payload.model_dump_json()
    ctx.record.stage("serialize", t)
    return Response(body, media_type="application/json")


async def cancel_and_view(jobs: JobsRuntime, job_id: str, key_id: str | None,
                          view: Callable[[JobsRuntime, str, str | None], Awaitable[JobView]]) -> JobView:
    """Cancel one of the caller's batch jobs and return it as it stands after; `view` refuses a job that is not
    the caller's (or none), before anything is cancelled."""
    await view(jobs, job_id, key_id)
    if await asyncio.to_thread(jobs.jobs.cancel, job_id):
        jobs.cancelled(job_id)
    return await view(jobs, job_id, key_id)


def idempotency_doc() -> dict[str, Any]:
    """OpenAPI `parameters` for the optional Idempotency-Key header of a route that creates work."""
    return {"parameters": [{
        "name": "Idempotency-Key", "in": "header", "required": False,
        "schema": {"type": "string", "minLength": 1, "maxLength": 255},
        "description": "replays the first answer to a retry with the same key (24 h); docs/idempotency.md",
    }]}


def work_doc() -> dict[str, Any]:
    """OpenAPI `parameters` of a route that creates work: Idempotency-Key and the caller's time budget."""
    timeout = {
        "name": "X-Request-Timeout", "in": "header", "required": False,
        "schema": {"type": "string", "pattern": deadline.PATTERN},
        "description": "the caller's time budget in seconds, for the whole answer (streams too); the official "
                       "SDKs' x-stainless-read-timeout / x-stainless-timeout are read when it is absent "
                       "(docs/timeouts.md)",
    }
    return {"parameters": [*idempotency_doc()["parameters"], timeout]}


def error_responses(*types: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the envelope under each status these error types use."""
    from sluicegate.protocol.common import ErrorEnvelope

    out: dict[int | str, dict[str, Any]] = {}
    for t in types:
        out.setdefault(STATUS[t], {"model": ErrorEnvelope, "description": ", ".join(
            x for x in types if STATUS[x] == STATUS[t])})
    return out


__all__ = ["cancel_and_view", "envelope", "error_responses", "idempotency_doc", "json_reply", "read_request",
           "read_work", "require_json", "work_doc"]
