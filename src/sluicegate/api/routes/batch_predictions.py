"""The seed's batch jobs: `POST /v1/batch-predictions` (a JSON list, or JSONL streamed) -> 202 and a job to
poll; progress, ETA, paginated results and a JSONL download; DELETE cancels. Same job system as /v1/batches;
a bad line is its own failed result and the rest run (docs/jobs.md)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse

from sluicegate.api.dialects import render_error
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.routes.common import cancel_and_view, error_responses, json_reply, list_page, refuse_query
from sluicegate.api.services import Jobs, Settings, jobs_of
from sluicegate.jobs import states as S
from sluicegate.jobs.create import SeedJob, parse_list
from sluicegate.jobs.runtime import JobsRuntime
from sluicegate.jobs.store import JobView
from sluicegate.protocol.batches import (
    BatchPrediction,
    BatchPredictionList,
    BatchPredictionResult,
    BatchPredictionResults,
    Progress,
)
from sluicegate.refusal import Rejected
from sluicegate.serving.context import RequestContext
from sluicegate.serving.errors import ApiError
from sluicegate.store.models import BatchItem

router = APIRouter(tags=["batch"])
ERRORS = error_responses("invalid_request", "invalid_json", "not_found", "rate_limit_exceeded",
                         "unsupported_media_type", "body_too_large")
BASE = "/v1/batch-predictions"
JSONL_TYPES = ("application/jsonl", "application/x-ndjson", "application/jsonlines")


def _rfc3339(value: dt.datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def eta_seconds(v: JobView, now: dt.datetime) -> float | None:
    """Items left over the rate measured since the job started (null until one has finished)."""
    j = v.job
    if j.status not in (S.IN_PROGRESS, S.VALIDATING) or j.in_progress_at is None or not v.finished:
        return None
    elapsed = (now - j.in_progress_at).total_seconds()
    if elapsed <= 0:
        return None
    return round((j.total - v.finished) / (v.finished / elapsed), 1)


def seed_object(v: JobView) -> BatchPrediction:
    j = v.job
    finished_at = j.completed_at or j.failed_at or j.cancelled_at or j.expired_at
    return BatchPrediction(
        id=j.id, status=S.seed_status(j.status, v.done, v.failed, j.total),  # type: ignore[arg-type]
        poll_url=f"{BASE}/{j.id}", results_url=f"{BASE}/{j.id}/results", created_at=_rfc3339(j.created_at) or "",
        finished_at=_rfc3339(finished_at), progress=Progress(done=v.finished, total=j.total, failed=v.failed),
        eta_seconds=eta_seconds(v, dt.datetime.now(dt.UTC)), metadata=json.loads(j.meta) if j.meta else None)


def result_of(item: BatchItem) -> BatchPredictionResult:
    body: dict[str, Any] | None = json.loads(item.result) if item.result else None
    if item.state == S.DONE:
        return BatchPredictionResult(line=item.line, status="succeeded", result=body)
    if item.state == S.ITEM_FAILED:
        error = body.get("error", body) if body is not None else None
        return BatchPredictionResult(line=item.line, status="failed", error=error)
    if item.state in (S.ITEM_CANCELLED, S.ITEM_EXPIRED):
        return BatchPredictionResult(line=item.line, status="cancelled")
    return BatchPredictionResult(line=item.line, status="pending")


async def _view(jobs: JobsRuntime, job_id: str, key_id: str | None) -> JobView:
    view = await asyncio.to_thread(jobs.jobs.view, job_id, key_id, shape="seed")
    if view is None:
        raise ApiError("not_found", "no such batch prediction for this API key", param="id", code="not_found")
    return view


async def _unknown(request: Request, jobs: JobsRuntime, job_id: str, ctx: RequestContext) -> Response | None:
    """The error answer when the caller has no such job; None when it has."""
    try:
        await _view(jobs, job_id, ctx.key_id)
    except ApiError as exc:
        return render_error(request.scope, exc, ctx.request_id)
    return None


async def _cancel(jobs: JobsRuntime, job_id: str, key_id: str | None) -> JobView:
    return await cancel_and_view(jobs, job_id, key_id, _view)


async def _reply(request: Request, job_id: str,
                 view: Callable[[JobsRuntime, str, str | None], Awaitable[JobView]]) -> Response:
    """The job as `view` leaves it, or the error it raised."""
    ctx = context_of(request.scope)
    try:
        return json_reply(seed_object(await view(jobs_of(request), job_id, ctx.key_id)), ctx)
    except ApiError as exc:
        return render_error(request.scope, exc, ctx.request_id)


@router.post(BASE, response_model=BatchPrediction, status_code=202, responses=ERRORS,
             summary="Queue prediction requests: a JSON list, or JSONL (application/jsonl) streamed",
             openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": {
                 "type": "array", "items": {}, "description": "prediction requests (PredictionRequest); an item that "
                 "is not one fails alone, its result naming the error; or the same as JSONL "
                 "(application/jsonl), one a line"}}}}})
async def create(request: Request, batch: Jobs, config: Settings) -> Response:
    ctx = context_of(request.scope)
    ctype = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    job = SeedJob(batch.jobs, config.jobs, config.limits.estimate_new_tokens, ctx.key_id)
    try:
        refuse_query(request)
        if ctype in JSONL_TYPES:
            job_id = await job.from_jsonl(request.stream())
        elif ctype == "application/json":
            job_id = await job.from_list(parse_list(await request.body()))
        else:
            raise ApiError("unsupported_media_type", "send a JSON list (application/json) or JSONL "
                           "(application/jsonl)", code="wrong_content_type")
    except Rejected as exc:  # the serving layer's ApiError, or a job limit's or the body's refusal
        return render_error(request.scope, exc, ctx.request_id)
    batch.wake()
    out = seed_object(await _view(batch, job_id, ctx.key_id)).model_copy(update={"status": "queued"})
    reply = json_reply(out, ctx)
    reply.status_code = 202
    reply.headers["Location"] = out.poll_url
    return reply


@router.get(BASE, response_model=BatchPredictionList, summary="This key's batch predictions, newest first",
            responses=ERRORS)
async def list_jobs(request: Request, batch: Jobs, limit: int = Query(20, ge=1, le=100),
                    after: str | None = None) -> Response:
    ctx = context_of(request.scope)
    views = await list_page(batch.jobs.list_jobs, ctx.key_id, "seed", limit=limit + 1, after=after)
    return json_reply(BatchPredictionList(data=[seed_object(v) for v in views[:limit]],
                                          has_more=len(views) > limit), ctx)


@router.get(BASE + "/{job_id}", response_model=BatchPrediction, summary="Status, progress and ETA",
            responses=ERRORS)
async def get_job(request: Request, job_id: str) -> Response:
    return await _reply(request, job_id, _view)


@router.delete(BASE + "/{job_id}", response_model=BatchPrediction, responses=ERRORS,
               summary="Cancel: running items abort in the engine within a step, the rest never start")
async def cancel_job(request: Request, job_id: str) -> Response:
    return await _reply(request, job_id, _cancel)


@router.get(BASE + "/{job_id}/results", response_model=BatchPredictionResults, responses=ERRORS,
            summary="Results in input order, a page at a time (`after`: the last line seen)")
async def results(request: Request, job_id: str, batch: Jobs, after: int = Query(0, ge=0),
                  limit: int = Query(100, ge=1, le=1000)) -> Response:
    ctx = context_of(request.scope)
    if (refused := await _unknown(request, batch, job_id, ctx)) is not None:
        return refused
    items = await asyncio.to_thread(batch.jobs.items, job_id, after_line=after, limit=limit + 1)
    page = [result_of(i) for i in items[:limit]]
    more = len(items) > limit
    return json_reply(BatchPredictionResults(data=page, has_more=more, next_after=page[-1].line if more else None),
                      ctx)


@router.get(BASE + "/{job_id}/results.jsonl", responses={
    200: {"content": {"application/jsonl": {"schema": {"type": "string"}}}}, **ERRORS},
            summary="Every result as JSONL, streamed")
async def download(request: Request, job_id: str, batch: Jobs) -> Response:
    ctx = context_of(request.scope)
    if (refused := await _unknown(request, batch, job_id, ctx)) is not None:
        return refused
    jobs = batch.jobs

    async def lines() -> AsyncIterator[bytes]:
        after = 0
        while items := await asyncio.to_thread(jobs.items, job_id, after_line=after, limit=500):
            yield b"".join(result_of(i).model_dump_json().encode() + b"\n" for i in items)
            after = items[-1].line

    return StreamingResponse(lines(), media_type="application/jsonl",
                             headers={"Content-Disposition": f'attachment; filename="{job_id}.jsonl"'})
