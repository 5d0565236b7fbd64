"""Files of the batch system, kept in the store a chunk at a time (never whole in memory).

An upload is written as it arrives (`Writer`: a buffer of at most `CHUNK` bytes, then a row); its row is
created first with `bytes = -1` (not listed, not readable) and gets its size once the last chunk is in, so a
file is either whole or absent. Content is read back a chunk at a time (`chunks`, `lines`). Keeping the
chunks in the store, not on one replica's disk, lets every replica sharing the store serve every file.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, Select, delete, func, insert, literal, select, tuple_, update

from sluicegate.jobs.states import ACTIVE
from sluicegate.store.db import Store, UnknownCursor
from sluicegate.store.keylock import lock_key
from sluicegate.store.models import BatchFile, BatchFileChunk, BatchJob, UTCDateTime

CHUNK = 256 << 10  # bytes per stored chunk
UPLOADING = -1  # `bytes` of a file still being written
MAX_LINE = 1 << 20  # one input line (one request), in bytes: the JSON routes' own body limit


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


@dataclass(frozen=True, slots=True)
class FileInfo:
    id: str
    key_id: str | None
    purpose: str
    filename: str
    bytes: int
    created_at: dt.datetime
    expires_at: dt.datetime | None

    @classmethod
    def of(cls, row: BatchFile) -> FileInfo:
        return cls(row.id, row.key_id, row.purpose, row.filename, row.bytes, row.created_at, row.expires_at)


class FileStore:
    def __init__(self, store: Store) -> None:
        self.store = store

    def begin(self, key_id: str | None, purpose: str, filename: str, ttl_s: float | None) -> str:
        now = self.store.now()
        file_id = new_id("file-")
        expires = None if ttl_s is None else now + dt.timedelta(seconds=ttl_s)
        with self.store.session() as s, s.begin():
            s.execute(insert(BatchFile).values(id=file_id, key_id=key_id, purpose=purpose,
                                               filename=filename[:255], bytes=UPLOADING, created_at=now,
                                               expires_at=expires))
        return file_id

    def append(self, file_id: str, seq: int, data: bytes) -> None:
        with self.store.session() as s, s.begin():
            s.execute(insert(BatchFileChunk).values(file_id=file_id, seq=seq, data=data))

    def finish(self, file_id: str, size: int, quota: int | None = None) -> bool:
        """Make the file whole (listed, readable). With a `quota`: only if the key's stored bytes with this
        file stay within it (False, and the file still uploading, otherwise). Uploads of one key are finished
        one at a time (on Postgres a transaction lock per key; SQLite runs one writer), so two concurrent
        uploads never pass the quota together."""
        with self.store.session() as s, s.begin():
            q = update(BatchFile).where(BatchFile.id == file_id)
            if quota is not None:
                key_id = s.execute(select(BatchFile.key_id).where(BatchFile.id == file_id)).scalar_one()
                lock_key(s, "files", key_id)
                q = q.where(self._stored_of(key_id).scalar_subquery() + size <= quota)
            return bool(cast(CursorResult[Any], s.execute(q.values(bytes=size))).rowcount)

    def get(self, file_id: str, key_id: str | None) -> FileInfo | None:
        """The file if it is whole, not expired, and the key's (every key's file is another's 404)."""
        with self.store.session() as s:
            row = s.get(BatchFile, file_id)
        if row is None or row.bytes == UPLOADING or row.key_id != key_id:
            return None
        if row.expires_at is not None and row.expires_at <= self.store.now():
            return None
        return FileInfo.of(row)

    def list_files(self, key_id: str | None, *, purpose: str | None, limit: int, after: str | None,
             newest_first: bool) -> list[FileInfo]:
        f = BatchFile
        q = select(f).where(f.key_id.is_(None) if key_id is None else f.key_id == key_id, f.bytes >= 0)
        q = q.where((f.expires_at.is_(None)) | (f.expires_at > self.store.now()))
        if purpose is not None:
            q = q.where(f.purpose == purpose)
        with self.store.session() as s:
            anchor = None if after is None else s.get(f, after)
            if after is not None and (anchor is None or anchor.key_id != key_id):
                raise UnknownCursor(after)
            if anchor is not None:
                pos, at = tuple_(f.created_at, f.id), tuple_(literal(anchor.created_at, UTCDateTime()), anchor.id)
                q = q.where(pos < at if newest_first else pos > at)
            order = (f.created_at.desc(), f.id.desc()) if newest_first else (f.created_at, f.id)
            rows = s.execute(q.order_by(*order).limit(limit)).scalars().all()
        return [FileInfo.of(r) for r in rows]

    def delete(self, file_id: str) -> None:
        with self.store.session() as s, s.begin():
            s.execute(delete(BatchFileChunk).where(BatchFileChunk.file_id == file_id))
            s.execute(delete(BatchFile).where(BatchFile.id == file_id))

    def chunk(self, file_id: str, seq: int) -> bytes | None:
        with self.store.session() as s:
            data = s.execute(select(BatchFileChunk.data).where(
                BatchFileChunk.file_id == file_id, BatchFileChunk.seq == seq)).scalar_one_or_none()
        return None if data is None else bytes(data)

    def chunks(self, file_id: str) -> Iterator[bytes]:
        seq = 0
        while (data := self.chunk(file_id, seq)) is not None:
            yield data
            seq += 1

    def lines(self, file_id: str, max_line: int = MAX_LINE) -> Iterator[bytes | None]:
        """The file's lines, without their line ends (a line may span chunks); None for a line over
        `max_line` bytes (never held)."""
        split = LineSplitter(max_line)
        for data in self.chunks(file_id):
            yield from split.feed(data)
        yield from split.end()

    def _stored_of(self, key_id: str | None) -> Select[int]:
        f = BatchFile
        return select(func.coalesce(func.sum(f.bytes), 0)).where(
            f.key_id.is_(None) if key_id is None else f.key_id == key_id, f.bytes >= 0,
            (f.expires_at.is_(None)) | (f.expires_at > self.store.now()))

    def bytes_of_key(self, key_id: str | None) -> int:
        """Bytes of the key's files (uploads and outputs), expired ones excepted."""
        with self.store.session() as s:
            return int(s.execute(self._stored_of(key_id)).scalar_one())

    def prune(self) -> int:
        """Delete expired files, and uploads abandoned mid-way (over a day old); returns how many."""
        f = BatchFile
        now = self.store.now()
        with self.store.session() as s:
            ids = s.execute(select(f.id).where(
                (f.expires_at <= now) | ((f.bytes == UPLOADING) & (f.created_at < now - dt.timedelta(days=1)))
            ).limit(1000)).scalars().all()
        for file_id in ids:
            self.delete(file_id)
        return len(ids)

    def in_use(self, file_id: str) -> bool:
        """Whether an unfinished job reads this file (it cannot be deleted under it)."""
        with self.store.session() as s:
            return s.execute(select(BatchJob.id).where(
                BatchJob.input_file_id == file_id, BatchJob.status.in_(ACTIVE)).limit(1)).first() is not None


class LineSplitter:
    """Lines out of chunks as they arrive, holding at most `max_line` bytes of an unfinished line: a longer
    line comes out as None (and its bytes are dropped up to its end), so no input can make it hold more."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._rest = bytearray()
        self._skipping = False

    def feed(self, data: bytes) -> list[bytes | None]:
        out: list[bytes | None] = []
        start = 0
        while (nl := data.find(b"\n", start)) >= 0:
            if self._skipping:
                self._skipping = False
            else:
                self._rest += data[start:nl]
                out.append(None if len(self._rest) > self.max_line else bytes(self._rest).rstrip(b"\r"))
            self._rest.clear()
            start = nl + 1
        if not self._skipping:
            self._rest += data[start:]
            if len(self._rest) > self.max_line:
                out.append(None)
                self._rest.clear()
                self._skipping = True
        return out

    def end(self) -> list[bytes | None]:
        rest = bytes(self._rest).rstrip(b"\r")
        self._rest.clear()
        return [rest] if rest.strip() else []


class Writer:
    """Writes one file a chunk at a time (synchronous: call it from a thread)."""

    def __init__(self, files: FileStore, file_id: str) -> None:
        self.files = files
        self.file_id = file_id
        self.size = 0
        self._buf = bytearray()
        self._seq = 0

    def write(self, data: bytes) -> None:
        self._buf += data
        self.size += len(data)
        while len(self._buf) >= CHUNK:
            self._flush(bytes(self._buf[:CHUNK]))
            del self._buf[:CHUNK]

    def _flush(self, data: bytes) -> None:
        self.files.append(self.file_id, self._seq, data)
        self._seq += 1

    def close(self, quota: int | None = None) -> int | None:
        """The file's size once it is whole; None when `quota` refused it (the caller deletes it)."""
        if self._buf:
            self._flush(bytes(self._buf))
            self._buf.clear()
        if not self.files.finish(self.file_id, self.size, quota):
            return None
        return self.size
