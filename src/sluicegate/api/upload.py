"""Request bodies streamed into the store as they arrive: a multipart file (`/v1/files`) or a raw body.

python-multipart's push parser (the one Starlette's forms use) takes each received chunk; the file part's
bytes go to the store a chunk at a time (`jobs.files.Writer`, in a thread), so neither the whole body nor
the whole file is ever held. Form fields other than the file are few and small (`MAX_FIELDS` of them,
`MAX_FIELD` bytes each, a part's headers `MAX_HEADERS` bytes). The file is counted as it arrives and refused
past `limit` with 413 and the number, or past what the key's stored-bytes quota leaves (checked as it streams,
and again, atomically, when it is made whole); a refused or broken upload leaves no file behind.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from python_multipart.multipart import MultipartParser, parse_options_header

from sluicegate.jobs.files import FileStore, Writer
from sluicegate.serving.errors import ApiError

MAX_FIELD = 1024
MAX_FIELDS = 16  # form fields besides the file (OpenAI's upload has one: `purpose`)
MAX_HEADERS = 8192  # bytes of one part's headers
DRAIN_S = 10.0


def too_large(limit: int) -> ApiError:
    return ApiError("body_too_large", f"the file is over the limit of {limit} bytes", param="file",
                    code="file_too_large")


def over_quota(stored: int, adding: int, quota: int) -> ApiError:
    return ApiError("body_too_large", f"this API key stores {stored} bytes of files; {adding} more bytes of this "
                    f"upload pass its limit of {quota} bytes (--batch-max-stored-bytes): delete files first",
                    param="file", code="storage_quota_exceeded")


@dataclass(frozen=True, slots=True)
class Quota:
    """The key's stored-bytes limit, and what it stored when the upload began."""

    limit: int
    stored: int


@dataclass(slots=True)
class _Parts:
    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    pending: list[bytes] = field(default_factory=list)  # file bytes parsed, not yet stored
    name: str = ""
    is_file: bool = False
    seen_file: bool = False
    n_fields: int = 0
    header_bytes: int = 0
    header_field: bytes = b""
    header_value: bytes = b""
    headers: dict[bytes, bytes] = field(default_factory=dict)
    value: bytearray = field(default_factory=bytearray)


def _parser(boundary: bytes, p: _Parts) -> MultipartParser:
    def on_part_begin() -> None:
        p.headers.clear()
        p.value.clear()
        p.header_bytes = 0

    def count_header(n: int) -> None:
        p.header_bytes += n
        if p.header_bytes > MAX_HEADERS:
            raise ApiError("invalid_request", f"a form part's headers are over {MAX_HEADERS} bytes",
                           code="invalid_multipart")

    def on_header_field(data: bytes, start: int, end: int) -> None:
        count_header(end - start)
        p.header_field += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        count_header(end - start)
        p.header_value += data[start:end]

    def on_header_end() -> None:
        p.headers[p.header_field.lower()] = p.header_value
        p.header_field = p.header_value = b""

    def on_headers_finished() -> None:
        _, opts = parse_options_header(p.headers.get(b"content-disposition", b""))
        p.name = opts.get(b"name", b"").decode("utf-8", "replace")
        p.is_file = p.name == "file"
        if p.is_file:
            if p.seen_file:
                raise ApiError("invalid_request", "send one file", param="file", code="too_many_files")
            p.seen_file = True
            p.filename = opts.get(b"filename", b"upload.jsonl").decode("utf-8", "replace")
        else:
            p.n_fields += 1
            if p.n_fields > MAX_FIELDS:
                raise ApiError("invalid_request", f"a form may carry at most {MAX_FIELDS} fields besides `file`",
                               code="too_many_fields")

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if p.is_file:
            p.pending.append(data[start:end])
            return
        p.value += data[start:end]
        if len(p.value) > MAX_FIELD:
            raise ApiError("invalid_request", f"a form field is over {MAX_FIELD} bytes", code="field_too_large")

    def on_part_end() -> None:
        if not p.is_file:
            p.fields[p.name] = p.value.decode("utf-8", "replace")

    return MultipartParser(boundary, {
        "on_part_begin": on_part_begin, "on_header_field": on_header_field, "on_header_value": on_header_value,
        "on_header_end": on_header_end, "on_headers_finished": on_headers_finished, "on_part_data": on_part_data,
        "on_part_end": on_part_end,
    })


def boundary_of(content_type: str) -> bytes:
    ctype, opts = parse_options_header(content_type)
    if ctype != b"multipart/form-data" or not opts.get(b"boundary"):
        raise ApiError("unsupported_media_type", "upload the file as multipart/form-data (fields `file` and "
                       "`purpose`)", code="wrong_content_type")
    return opts[b"boundary"]


async def _drain(stream: AsyncIterator[bytes]) -> None:
    """Read what the client still sends (discarded) so it receives the 413 instead of a reset connection;
    bounded: the body-limit middleware stops the stream a little past the file limit (UPLOAD_OVERHEAD), and
    this waits at most DRAIN_S for it."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(DRAIN_S):
            async for _ in stream:
                pass


async def multipart_file(stream: AsyncIterator[bytes], content_type: str, files: FileStore, *,
                         key_id: str | None, limit: int, ttl_s: float | None,
                         quota: Quota | None = None) -> tuple[str, int, dict[str, str]]:
    """Store the `file` part; returns (file id, bytes, the other fields). The file row's purpose is set from
    the `purpose` field (`batch` is checked by the caller, who deletes the file if it refuses it)."""
    parts = _Parts()
    parser = _parser(boundary_of(content_type), parts)
    writer: Writer | None = None
    try:
        async for chunk in stream:
            parser.write(chunk)
            if parts.pending:
                data = b"".join(parts.pending)
                parts.pending.clear()
                if writer is None:
                    fid = await asyncio.to_thread(files.begin, key_id, "batch", parts.filename or "upload.jsonl",
                                                  ttl_s)
                    writer = Writer(files, fid)
                if writer.size + len(data) > limit:
                    await _drain(stream)
                    raise too_large(limit)
                if quota is not None and quota.stored + writer.size + len(data) > quota.limit:
                    await _drain(stream)
                    raise over_quota(quota.stored, writer.size + len(data), quota.limit)
                await asyncio.to_thread(writer.write, data)
        parser.finalize()
        if writer is None:
            if not parts.seen_file:
                raise ApiError("invalid_request", "the form has no `file` field", param="file",
                               code="missing_field")
            fid = await asyncio.to_thread(files.begin, key_id, "batch", parts.filename or "upload.jsonl", ttl_s)
            writer = Writer(files, fid)
        size = await asyncio.to_thread(writer.close, None if quota is None else quota.limit)
        if size is None:  # other uploads of the key were made whole meanwhile
            assert quota is not None
            stored = await asyncio.to_thread(files.bytes_of_key, key_id)
            raise over_quota(stored, writer.size, quota.limit)
        return writer.file_id, size, parts.fields
    except BaseException:
        if writer is not None:
            await asyncio.shield(asyncio.to_thread(files.delete, writer.file_id))
        raise
