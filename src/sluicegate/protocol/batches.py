"""Schemas of the batch surfaces: OpenAI's Files and Batch objects, and the seed's batch predictions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field

from sluicegate.protocol.common import ResponseModel, StrictModel
from sluicegate.registry import Shape, batch_targets

BatchStatus = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                      "cancelled"]
SeedStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
Metadata = Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)]
if TYPE_CHECKING:  # a Literal built at run time, which a type checker cannot read: a string to it
    BatchEndpoint = str
else:  # the routes an OpenAI batch may run on, from the route registry: the schema's enum, in its order
    BatchEndpoint = Literal[batch_targets(Shape.OPENAI)]


class FileObject(ResponseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None = None
    filename: str
    purpose: str
    status: Literal["processed"] = "processed"  # deprecated by OpenAI; always `processed`
    status_details: None = None


class FileList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(ResponseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


class BatchCreateRequest(StrictModel):
    input_file_id: str = Field(min_length=1, max_length=64)
    endpoint: BatchEndpoint
    completion_window: Literal["24h"]
    metadata: Metadata | None = None


class BatchError(ResponseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(ResponseModel):
    object: Literal["list"] = "list"
    data: list[BatchError]


class RequestCounts(ResponseModel):
    total: int
    completed: int = Field(description="requests answered with a 200")
    failed: int = Field(description="requests answered with an error")


class BatchObject(ResponseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None


class BatchList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class Progress(ResponseModel):
    done: int = Field(description="items finished, failed ones included")
    total: int
    failed: int


class BatchPrediction(ResponseModel):
    id: str
    object: Literal["batch_prediction"] = "batch_prediction"
    status: SeedStatus
    poll_url: str
    results_url: str
    created_at: str = Field(description="RFC 3339")
    finished_at: str | None = None
    progress: Progress
    eta_seconds: float | None = Field(description="from the rate measured so far; null before any item ends")
    metadata: dict[str, str] | None = None


class BatchPredictionResult(ResponseModel):
    line: int = Field(description="the request's line (JSONL) or position from 1 (JSON list)")
    status: Literal["succeeded", "failed", "cancelled", "pending"]
    result: dict[str, Any] | None = Field(default=None)
    error: dict[str, Any] | None = Field(default=None, description="{line, code, message} for a line that could not be "
                                         "read; else the error envelope's `error`")


class BatchPredictionResults(ResponseModel):
    object: Literal["list"] = "list"
    data: list[BatchPredictionResult]
    has_more: bool
    next_after: int | None = Field(description="pass as `after` for the next page")


class BatchPredictionList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[BatchPrediction]
    has_more: bool
