"""A finished OpenAI-shaped job's output and error files, written from its items a page at a time.

Each line is OpenAI's request output object: `{"id": "batch_req_...", "custom_id", "response": {"status_code",
"request_id", "body"}, "error"}`. Requests that got a 200 go to the output file; requests answered with an
error status go to the error file with that response; requests that never ran (the job was cancelled or
expired first) go to the error file with `response: null` and `error: {code, message}` (`batch_cancelled`,
`batch_expired`). A file with no line is not created (its id stays null), as OpenAI does.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import select

from sluicegate.jobs import states as S
from sluicegate.jobs.files import FileStore, Writer
from sluicegate.jobs.store import JobStore
from sluicegate.store.models import BatchFile, BatchItem, BatchJob

NOT_RUN = {S.ITEM_CANCELLED: ("batch_cancelled", "This request was not run: the batch was cancelled."),
           S.ITEM_EXPIRED: ("batch_expired", "This request could not be executed before the completion window "
                                             "expired.")}


def item_request_id(item_id: int) -> str:
    return f"req_batch_{item_id:x}"


def output_line(item: BatchItem) -> tuple[bool, dict[str, Any]]:
    """(goes to the output file, the line's object)."""
    line: dict[str, Any] = {"id": f"batch_req_{item.id:x}", "custom_id": item.custom_id, "response": None,
                            "error": None}
    if item.state in NOT_RUN:
        code, message = NOT_RUN[item.state]
        line["error"] = {"code": code, "message": message}
        return False, line
    body = json.loads(item.result) if item.result else None
    line["response"] = {"status_code": item.status_code, "request_id": item_request_id(item.id), "body": body}
    return item.state == S.DONE, line


class _Lazy:
    """A file created on its first line."""

    def __init__(self, files: FileStore, job: BatchJob, name: str, ttl_s: float) -> None:
        self.files, self.job, self.name, self.ttl_s = files, job, name, ttl_s
        self.writer: Writer | None = None

    def write(self, obj: dict[str, Any]) -> None:
        if self.writer is None:
            fid = self.files.begin(self.job.key_id, "batch_output", f"{self.job.id}_{self.name}.jsonl", self.ttl_s)
            self.writer = Writer(self.files, fid)
        self.writer.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    def close(self) -> str | None:
        if self.writer is None:
            return None
        self.writer.close()
        return self.writer.file_id


def render_files(jobs: JobStore, files: FileStore, job: BatchJob, ttl_s: float) -> tuple[str | None, str | None]:
    """The job's output and error files. Files a finalizer that died part-way left for this job are deleted
    first, and this call's own are deleted if it fails: a job never leaves an output file nobody points to."""
    discard_outputs(files, job)
    out, err = _Lazy(files, job, "output", ttl_s), _Lazy(files, job, "error", ttl_s)
    try:
        for item in jobs.iter_items(job.id):
            good, line = output_line(item)
            (out if good else err).write(line)
        return out.close(), err.close()
    except BaseException:
        for lazy in (out, err):
            if lazy.writer is not None:
                files.delete(lazy.writer.file_id)
        raise


def discard_outputs(files: FileStore, job: BatchJob) -> int:
    """Delete the output files rendered for `job` that it does not point to (another finalizer's, which
    lost its claim or died); how many."""
    names = [f"{job.id}_{name}.jsonl" for name in ("output", "error")]
    with files.store.session() as s:
        rows = s.execute(select(BatchFile.id).where(
            BatchFile.purpose == "batch_output", BatchFile.filename.in_(names), _owner(job.key_id))).scalars().all()
        current = s.execute(select(BatchJob.output_file_id, BatchJob.error_file_id)
                            .where(BatchJob.id == job.id)).one_or_none()
    keep = set(current or ())
    gone = [fid for fid in rows if fid not in keep]
    for fid in gone:
        files.delete(fid)
    return len(gone)


def _owner(key_id: str | None) -> Any:
    return BatchFile.key_id.is_(None) if key_id is None else BatchFile.key_id == key_id
