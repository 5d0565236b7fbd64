"""OpenAI's Batch API: create from an uploaded file, retrieve, list, cancel (docs/jobs.md).

Statuses are the job's internal states as they are (OpenAI's names); `request_counts` counts requests
answered with a 200 (`completed`) and with an error (`failed`). Errors render with OpenAI's statuses.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Query, Request, Response

from sluicegate.api.dialects import render_error
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.routes.common import cancel_and_view, error_responses, json_reply, list_page
from sluicegate.api.routes.files import not_found, ts
from sluicegate.api.routes.openai import read_openai
from sluicegate.api.services import Jobs, Settings
from sluicegate.jobs.create import create_openai
from sluicegate.jobs.runtime import JobsRuntime
from sluicegate.jobs.store import JobView
from sluicegate.protocol.batches import BatchCreateRequest, BatchErrors, BatchList, BatchObject, RequestCounts
from sluicegate.refusal import Rejected
from sluicegate.serving.errors import ApiError

router = APIRouter(tags=["batch"])
ERRORS = error_responses("invalid_request", "not_found", "rate_limit_exceeded", "unsupported_media_type")


def batch_object(v: JobView) -> BatchObject:
    j = v.job
    return BatchObject(
        id=j.id, endpoint=j.endpoint, errors=BatchErrors.model_validate(json.loads(j.errors)) if j.errors else None,
        input_file_id=j.input_file_id or "", completion_window=j.completion_window, status=j.status,  # type: ignore[arg-type]
        output_file_id=j.output_file_id, error_file_id=j.error_file_id, created_at=int(j.created_at.timestamp()),
        in_progress_at=ts(j.in_progress_at), expires_at=ts(j.expires_at), finalizing_at=ts(j.finalizing_at),
        completed_at=ts(j.completed_at), failed_at=ts(j.failed_at), expired_at=ts(j.expired_at),
        cancelling_at=ts(j.cancelling_at), cancelled_at=ts(j.cancelled_at),
        request_counts=RequestCounts(total=j.total, completed=v.done, failed=v.failed),
        metadata=json.loads(j.meta) if j.meta else None,
    )


async def _view(jobs: JobsRuntime, batch_id: str, key_id: str | None) -> JobView:
    view = await asyncio.to_thread(jobs.jobs.view, batch_id, key_id, shape="openai")
    if view is None:
        raise not_found("batch", "batch_id")
    return view


@router.post("/v1/batches", response_model=BatchObject, summary="Create a batch from an uploaded JSONL file",
             responses=ERRORS, openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                 "schema": {"$ref": "#/components/schemas/BatchCreateRequest"}}}}})
async def create_batch(request: Request, batch: Jobs, config: Settings) -> Response:
    ctx = context_of(request.scope)
    try:
        req = await read_openai(request, BatchCreateRequest, lambda _body: None)
        files = batch.files
        if await asyncio.to_thread(files.get, req.input_file_id, ctx.key_id) is None:
            raise not_found("file", "input_file_id")
        job_id = await asyncio.to_thread(
            create_openai, batch.jobs, files, config.jobs, config.limits.estimate_new_tokens,
            key_id=ctx.key_id, input_file_id=req.input_file_id, endpoint=req.endpoint,
            window=req.completion_window, meta=req.metadata)
        view = await _view(batch, job_id, ctx.key_id)
        if view.job.status == "failed":  # validation failed it: announced now, as the finalizer does the others
            await asyncio.to_thread(batch.announce, view.job, "failed")
        batch.wake()
        return json_reply(batch_object(view), ctx)
    except Rejected as exc:  # the serving layer's ApiError, or a job limit's refusal
        return render_error(request.scope, exc, ctx.request_id)


@router.get("/v1/batches", response_model=BatchList, summary="This key's batches, newest first", responses=ERRORS)
async def list_batches(request: Request, batch: Jobs, limit: int = Query(20, ge=1, le=100),
                       after: str | None = None) -> Response:
    ctx = context_of(request.scope)
    try:
        views = await list_page(batch.jobs.list_jobs, ctx.key_id, "openai", limit=limit + 1, after=after)
    except ApiError as exc:
        return render_error(request.scope, exc, ctx.request_id)
    data = [batch_object(v) for v in views[:limit]]
    return json_reply(BatchList(data=data, first_id=data[0].id if data else None,
                                last_id=data[-1].id if data else None, has_more=len(views) > limit), ctx)


@router.get("/v1/batches/{batch_id}", response_model=BatchObject, summary="One batch", responses=ERRORS)
async def get_batch(request: Request, batch_id: str, batch: Jobs) -> Response:
    ctx = context_of(request.scope)
    try:
        return json_reply(batch_object(await _view(batch, batch_id, ctx.key_id)), ctx)
    except ApiError as exc:
        return render_error(request.scope, exc, ctx.request_id)


@router.post("/v1/batches/{batch_id}/cancel", response_model=BatchObject,
             summary="Cancel a batch: requests not started never run, running ones abort", responses=ERRORS)
async def cancel_batch(request: Request, batch_id: str, batch: Jobs) -> Response:
    ctx = context_of(request.scope)
    try:
        view = await cancel_and_view(batch, batch_id, ctx.key_id, _view)
        if view.job.status not in ("cancelling", "cancelled"):
            raise ApiError("invalid_request", f"the batch is {view.job.status}: only a batch that has not finished "
                           "can be cancelled", param="batch_id", code="batch_not_cancellable")
        return json_reply(batch_object(view), ctx)
    except ApiError as exc:
        return render_error(request.scope, exc, ctx.request_id)
