"""The official `openai` client's batch flow, unmodified, over a real socket (reference backend)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import openai
import pytest

from sluicegate.testing.wait import wait_for
from tests.api.threaded_server import Threaded, threaded_server
from tests.jobs.helpers import FINAL_OPENAI, chat_line, jsonl


@pytest.fixture(scope="module")
def server() -> Iterator[Threaded]:
    with threaded_server() as srv:
        yield srv


@pytest.fixture
def client(server: Threaded) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _finish(client: openai.OpenAI, batch_id: str) -> openai.types.Batch:
    return wait_for(lambda: (b := client.batches.retrieve(batch_id)).status in FINAL_OPENAI and b,
                    message="the batch to finish")


def test_upload_create_poll_and_read_the_output(client: openai.OpenAI) -> None:
    rows = [chat_line(i) for i in range(6)]
    rows.append({"custom_id": "bad-body", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": "reference", "messages": [], "max_tokens": 2}})
    f = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(rows))), purpose="batch")
    assert f.purpose == "batch" and f.bytes == len(jsonl(rows)) and f.filename == "in.jsonl"
    assert client.files.retrieve(f.id).id == f.id
    assert f.id in [x.id for x in client.files.list()]
    assert client.files.content(f.id).read() == jsonl(rows)

    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"run": "one"})
    assert batch.status in ("in_progress", "finalizing", "completed") and batch.metadata == {"run": "one"}
    assert batch.request_counts is not None and batch.request_counts.total == 7
    done = _finish(client, batch.id)
    assert done.status == "completed" and done.completed_at is not None
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (6, 1)
    assert done.output_file_id and done.error_file_id

    out = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in out) == sorted(f"req-{i}" for i in range(6))
    for o in out:
        assert o["error"] is None and o["response"]["status_code"] == 200
        body = o["response"]["body"]
        assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] >= 1
    (err,) = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert err["custom_id"] == "bad-body" and err["response"]["status_code"] == 400
    assert err["response"]["body"]["error"]["type"] == "invalid_request_error"

    assert batch.id in [b.id for b in client.batches.list()]
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(batch.id)  # finished: not cancellable
    assert client.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(f.id)


@pytest.mark.parametrize(("bad", "code"), [
    (b"{not json", "invalid_json_line"),
    (json.dumps(chat_line(0)).encode(), "duplicate_custom_id"),
    (json.dumps(chat_line(9, url="/v1/completions")).encode(), "mismatched_endpoint"),
    (json.dumps(chat_line(9, stream=True)).encode(), "stream_unsupported"),
])
def test_a_bad_line_fails_the_whole_batch_at_validation(client: openai.OpenAI, bad: bytes, code: str) -> None:
    data = jsonl([chat_line(0), chat_line(1)]) + bad + b"\n"
    f = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed" and batch.failed_at is not None and batch.errors is not None
    (e,) = batch.errors.data or []
    assert (e.code, e.line) == (code, 3)
    assert batch.request_counts is not None and batch.request_counts.completed == 0


def test_completions_endpoint(client: openai.OpenAI) -> None:
    rows = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
             "body": {"model": "reference", "prompt": f"p {i}", "max_tokens": 3, "temperature": 0}} for i in range(3)]
    f = client.files.create(file=("c.jsonl", io.BytesIO(jsonl(rows))), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="24h")
    done = _finish(client, batch.id)
    assert done.status == "completed" and done.request_counts is not None and done.request_counts.completed == 3
    assert done.error_file_id is None
    out = [json.loads(x) for x in client.files.content(done.output_file_id or "").text.splitlines()]
    assert {o["response"]["body"]["object"] for o in out} == {"text_completion"}


def test_cancel_mid_run(server: Threaded, client: openai.OpenAI) -> None:
    server.runner.delay_s = 0.03
    try:
        rows = [chat_line(i, max_tokens=200) for i in range(12)]
        f = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(rows))), purpose="batch")
        batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        cancelling = client.batches.cancel(batch.id)
        assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at is not None
        done = _finish(client, batch.id)
        assert done.status == "cancelled" and done.cancelled_at is not None
        errors = [json.loads(x) for x in client.files.content(done.error_file_id or "").text.splitlines()]
        never_ran = [e for e in errors if e["response"] is None]
        assert never_ran and all(e["error"]["code"] == "batch_cancelled" for e in never_ran)
        assert len(errors) + (done.request_counts.completed if done.request_counts else 0) == 12
    finally:
        server.runner.delay_s = 0.0


def test_list_pagination_and_unknown_ids(client: openai.OpenAI) -> None:
    first = client.batches.list(limit=1)
    assert len(first.data) == 1 and first.has_more
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    with pytest.raises(openai.NotFoundError):
        client.files.content("file-nope")
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id="file-x", endpoint="/v1/embeddings",  # type: ignore[arg-type]
                              completion_window="24h")
