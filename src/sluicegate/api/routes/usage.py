"""`GET /v1/usage`: the calling key's usage by day; an `admin` key sees every key's (or one: `?key_id=`)."""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Request, Response

from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.routes.common import error_responses, json_reply
from sluicegate.api.services import TenancyDep
from sluicegate.api.validation import plain_name
from sluicegate.protocol.usage import UsageDay, UsageList
from sluicegate.serving.errors import ApiError
from sluicegate.tenancy.keys import Scope

router = APIRouter(tags=["usage"])
log = logging.getLogger("sluicegate.usage")

FLUSH_WAIT_S = 1.0  # the longest this answer waits for this process's finished requests to be written
ERRORS = ("invalid_request", "authentication_required", "permission_denied", "store_unavailable")


@router.get(
    "/v1/usage", response_model=UsageList, summary="Tokens used, by day and API key",
    description="The calling key's totals by UTC day. A key with the `admin` scope sees every key, or one "
                "with `?key_id=`; another key's id without `admin` is refused (403).",
    responses=error_responses(*ERRORS),
)
async def usage(request: Request, tenancy: TenancyDep, key_id: str | None = None) -> Response:
    ctx = context_of(request.scope)
    for name in request.query_params:
        if name != "key_id":
            raise ApiError("invalid_request", "the only query parameter here is key_id", code="unknown_field",
                           param=plain_name(name) or None)
    if key_id is not None and len(key_id) > 64:
        raise ApiError("invalid_request", "key_id is at most 64 characters", param="key_id", code="too_long")
    admin = Scope.ADMIN in ctx.scopes
    if key_id is not None and key_id != ctx.key_id and not admin:
        raise ApiError("permission_denied", "another key's usage needs the 'admin' scope", param="key_id",
                       code="missing_scope")
    ledger = tenancy.ledger
    whose = ctx.key_id if key_id is None else key_id
    try:
        # this process's finished requests are in the answer; while the store takes no writes, the wait is
        # short and the answer says how many are not in it yet
        flushed = await asyncio.to_thread(ledger.flush, FLUSH_WAIT_S)
        if admin and key_id is None:
            days = await asyncio.to_thread(ledger.totals, all_keys=True)
        else:
            days = await asyncio.to_thread(ledger.totals, whose)
    except Exception:
        log.exception("%s the usage ledger could not be read", ctx.request_id)
        raise ApiError("store_unavailable", "usage cannot be read right now", retry_after=1) from None
    unwritten = 0 if flushed else ledger.unwritten(whose, all_keys=admin and key_id is None)
    return json_reply(UsageList(data=[
        UsageDay(key_id=d.key_id, day=d.day, requests=d.requests, failed_requests=d.failed_requests,
                 prompt_tokens=d.prompt_tokens, cached_tokens=d.cached_tokens, generated_tokens=d.generated_tokens,
                 total_tokens=d.prompt_tokens + d.generated_tokens)
        for d in days
    ], unwritten_requests=unwritten), ctx)
