"""OpenAI's Files API for batch input and output: upload (multipart, streamed), list, retrieve, delete, content.

A file belongs to the key that uploaded it (or, for a job's output and error files, to the job's key);
any other key gets 404. Errors render with OpenAI's statuses (api/openai_errors.py).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from typing import Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from python_multipart.exceptions import FormParserError

from sluicegate.api.dialects import render_error
from sluicegate.api.middleware.request_context import context_of
from sluicegate.api.routes.common import error_responses, json_reply, list_page
from sluicegate.api.services import Jobs, Settings, jobs_of
from sluicegate.api.upload import Quota, multipart_file
from sluicegate.jobs.files import FileInfo
from sluicegate.protocol.batches import FileDeleted, FileList, FileObject
from sluicegate.serving.errors import ApiError

router = APIRouter(tags=["batch"])
ERRORS = error_responses("invalid_request", "not_found", "body_too_large", "unsupported_media_type")


def ts(value: dt.datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


def file_object(f: FileInfo) -> FileObject:
    return FileObject(id=f.id, bytes=f.bytes, created_at=int(f.created_at.timestamp()), expires_at=ts(f.expires_at),
                      filename=f.filename, purpose=f.purpose)


def not_found(what: str, param: str) -> ApiError:
    return ApiError("not_found", f"no such {what} for this API key", param=param, code="not_found")


@router.post("/v1/files", response_model=FileObject, summary="Upload a batch input file (multipart: file, purpose)",
             responses=ERRORS, openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {
                 "schema": {"type": "object", "required": ["file", "purpose"], "properties": {
                     "file": {"type": "string", "format": "binary", "description": "JSONL, one request a line"},
                     "purpose": {"type": "string", "enum": ["batch"]}}}}}}})
async def upload_file(request: Request, batch: Jobs, config: Settings) -> Response:
    ctx = context_of(request.scope)
    cfg = config.jobs
    ttl = None if cfg.file_ttl_hours is None else cfg.file_ttl_hours * 3600
    files = batch.files
    try:
        try:
            quota = Quota(cfg.max_stored_bytes, await asyncio.to_thread(files.bytes_of_key, ctx.key_id))
            fid, _size, fields = await multipart_file(
                request.stream(), request.headers.get("content-type", ""), files, key_id=ctx.key_id,
                limit=cfg.max_file_bytes, ttl_s=ttl, quota=quota)
        except FormParserError:
            raise ApiError("invalid_request", "the multipart body is malformed", code="invalid_multipart") from None
        purpose = fields.get("purpose")
        if purpose != "batch":
            await asyncio.to_thread(files.delete, fid)
            raise ApiError("invalid_request", "purpose must be `batch` (the only purpose this server takes)",
                           param="purpose", code="invalid_value" if purpose else "missing_field")
        info = await asyncio.to_thread(files.get, fid, ctx.key_id)
        assert info is not None
        return json_reply(file_object(info), ctx)
    except ApiError as exc:
        return render_error(request.scope, exc, ctx.request_id)


@router.get("/v1/files", response_model=FileList, summary="List this key's files", responses=ERRORS)
async def list_files(
    request: Request, batch: Jobs, purpose: str | None = None, limit: int = Query(10000, ge=1, le=10000),
    after: str | None = None, order: Literal["asc", "desc"] = "desc",
) -> Response:
    ctx = context_of(request.scope)
    try:
        rows = await list_page(batch.files.list_files, ctx.key_id, purpose=purpose, limit=limit + 1, after=after,
                               newest_first=order == "desc")
    except ApiError as exc:
        return render_error(request.scope, exc, ctx.request_id)
    data = [file_object(f) for f in rows[:limit]]
    return json_reply(FileList(data=data, first_id=data[0].id if data else None,
                               last_id=data[-1].id if data else None, has_more=len(rows) > limit), ctx)


async def _own(request: Request, file_id: str) -> FileInfo:
    ctx = context_of(request.scope)
    info = await asyncio.to_thread(jobs_of(request).files.get, file_id, ctx.key_id)
    if info is None:
        raise not_found("file", "file_id")
    return info


@router.get("/v1/files/{file_id}", response_model=FileObject, summary="One file", responses=ERRORS)
async def get_file(request: Request, file_id: str) -> Response:
    ctx = context_of(request.scope)
    try:
        return json_reply(file_object(await _own(request, file_id)), ctx)
    except ApiError as exc:
        return render_error(request.scope, exc, ctx.request_id)


@router.delete("/v1/files/{file_id}", response_model=FileDeleted, summary="Delete a file", responses=ERRORS)
async def delete_file(request: Request, file_id: str, batch: Jobs) -> Response:
    ctx = context_of(request.scope)
    files = batch.files
    try:
        await _own(request, file_id)
        if await asyncio.to_thread(files.in_use, file_id):
            raise ApiError("invalid_request", "a batch that has not finished reads this file; cancel it first",
                           param="file_id", code="file_in_use")
        await asyncio.to_thread(files.delete, file_id)
        return json_reply(FileDeleted(id=file_id, deleted=True), ctx)
    except ApiError as exc:
        return render_error(request.scope, exc, ctx.request_id)


@router.get("/v1/files/{file_id}/content", summary="A file's content (JSONL), streamed",
            responses={200: {"content": {"application/octet-stream": {"schema": {"type": "string"}}}}, **ERRORS})
async def file_content(request: Request, file_id: str, batch: Jobs) -> Response:
    ctx = context_of(request.scope)
    files = batch.files
    try:
        info = await _own(request, file_id)
    except ApiError as exc:
        return render_error(request.scope, exc, ctx.request_id)

    async def chunks() -> AsyncIterator[bytes]:
        seq = 0
        while (data := await asyncio.to_thread(files.chunk, info.id, seq)) is not None:
            yield data
            seq += 1

    return StreamingResponse(chunks(), media_type="application/octet-stream",
                             headers={"Content-Length": str(info.bytes),
                                      "Content-Disposition": f'attachment; filename="{info.id}.jsonl"'})
