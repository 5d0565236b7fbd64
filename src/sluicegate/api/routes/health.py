"""Operations: liveness and readiness. Neither waits on the engine."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from sluicegate.api.dialects import render_error
from sluicegate.api.drain import shutting_down
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.services import DrainDep, Runtime
from sluicegate.serving.errors import ApiError

router = APIRouter(tags=["operations"])


@router.get("/healthz", summary="The process is up")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="The model is loaded and the engine takes requests")
async def readyz(request: Request, drain: DrainDep, runtime: Runtime) -> Response:
    if drain.draining:  # first, so that a load balancer stops sending before anything is refused
        return render_error(request.scope, shutting_down(), context_of(request.scope).request_id)
    try:
        model = runtime.served()
    except ApiError as exc:
        refusal = exc
        if runtime.fatal is not None:  # which upstream, and why (the operator's message, no credentials)
            refusal = ApiError("not_ready", f"this configuration cannot serve: {runtime.fatal}", code="load_failed",
                           retry_after=60)
        elif runtime.upstream_wait is not None:
            why, delay = runtime.upstream_wait
            refusal = ApiError("not_ready", f"waiting for an upstream: {why}", code="upstream_starting",
                           retry_after=max(1, round(delay)))
        return render_error(request.scope, refusal, context_of(request.scope).request_id)
    ident = model.identity
    return JSONResponse(
        {"status": "ready", "model": {"name": ident.name, "version": ident.version, "digest": ident.digest}}
    )
