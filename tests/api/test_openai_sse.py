"""SSE framing (api/sse.py): heartbeat comments, the typed error event, [DONE] always last, and a client
that leaves aborting its engine requests."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from sluicegate.api import sse
from sluicegate.api.anthropic_errors import anthropic_envelope
from sluicegate.api.openai_errors import openai_envelope
from sluicegate.protocol.common import ResponseModel
from sluicegate.serving.errors import ApiError
from sluicegate.testing.wait import wait_for
from tests.api.threaded_server import SlowRunner, threaded_server


class Item(ResponseModel):
    n: int


async def collect(items: AsyncIterator[Item | None]) -> list[bytes]:
    return [b async for b in sse.sse_stream(items, request_id="req_x", render_error=openai_envelope)]


def test_items_then_done() -> None:
    async def items() -> AsyncIterator[Item]:
        for n in range(3):
            yield Item(n=n)

    out = asyncio.run(collect(items()))
    assert out == [b'data: {"n":0}\n\n', b'data: {"n":1}\n\n', b'data: {"n":2}\n\n', b"data: [DONE]\n\n"]


def test_heartbeat_cues_become_comments() -> None:
    """The producer's `None` (serving/core.py: silence for HEARTBEAT_S) is a comment SSE parsers ignore."""

    async def items() -> AsyncIterator[Item | None]:
        yield None
        yield None
        yield Item(n=1)

    out = asyncio.run(collect(items()))
    assert out == [b": keep-alive\n\n", b": keep-alive\n\n", b'data: {"n":1}\n\n', b"data: [DONE]\n\n"]


@pytest.mark.parametrize(
    ("exc", "etype"),
    [
        (ApiError("overloaded", "queue full", retry_after=1), "overloaded"),
        (ApiError("invalid_request", "bad", param="x", code="oops"), "invalid_request_error"),
        (RuntimeError("secret detail"), "internal_error"),
    ],
)
def test_error_event_mid_stream(exc: Exception, etype: str) -> None:
    async def items() -> AsyncIterator[Item]:
        yield Item(n=0)
        raise exc

    out = asyncio.run(collect(items()))
    assert out[0] == b'data: {"n":0}\n\n' and out[-1] == b"data: [DONE]\n\n" and len(out) == 3
    head, data = out[1].decode().rstrip("\n").split("\n")
    assert head == "event: error" and data.startswith("data: ")
    err = json.loads(data[len("data: ") :])["error"]
    assert err["type"] == etype and err["request_id"] == "req_x"
    assert "secret" not in out[1].decode()


class Event(ResponseModel):
    type: str
    n: int | None = None


def test_anthropic_framing_names_events_pings_and_ends_with_message_stop() -> None:
    """Anthropic's framing: each event named after its type and serialised whole (defaults too), a heartbeat
    is a `ping` event, an error is Anthropic's error body, and `message_stop` is always last."""

    async def items() -> AsyncIterator[Event | None]:
        yield Event(type="message_start")
        yield None
        raise ApiError("overloaded", "queue full", retry_after=1)

    out = asyncio.run(_anthropic(items()))
    assert out[:2] == [b'event: message_start\ndata: {"type":"message_start","n":null}\n\n',
                       b'event: ping\ndata: {"type": "ping"}\n\n']
    assert out[-1] == b'event: message_stop\ndata: {"type": "message_stop"}\n\n' and len(out) == 4
    head, data = out[2].decode().rstrip("\n").split("\n")
    body = json.loads(data[len("data: "):])
    assert head == "event: error" and body["type"] == "error" and body["request_id"] == "req_x"
    assert body["error"]["type"] == "overloaded_error" and body["error"]["code"] == "overloaded"


async def _anthropic(items: AsyncIterator[Event | None]) -> list[bytes]:
    return [b async for b in sse.sse_stream(items, request_id="req_x", render_error=anthropic_envelope,
                                            framing=sse.ANTHROPIC_FRAMING)]


def test_cancel_while_waiting_closes_the_producer() -> None:
    closed = asyncio.Event()

    async def items() -> AsyncIterator[Item]:
        try:
            yield Item(n=0)
            await asyncio.sleep(60)
            yield Item(n=1)
        finally:
            closed.set()

    async def main() -> None:
        gen = sse.sse_stream(items(), request_id="r", render_error=openai_envelope)
        assert await anext(gen) == b'data: {"n":0}\n\n'
        task = asyncio.ensure_future(anext(gen))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(closed.wait(), 2)

    asyncio.run(main())


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_disconnect_aborts_the_engine_request(path: str) -> None:
    with threaded_server(
        runner=lambda: SlowRunner(n_ctx=2048, n_slots=4, delay_s=0.01, eos_slope=0.0)
    ) as srv:
        engine = srv.state.runtime.engine
        assert engine is not None
        body: dict[str, Any] = {"model": "reference", "max_tokens": 1500, "stream": True, "n": 2, "seed": 1}
        body |= {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hi"}
        with httpx.Client(base_url=srv.url, timeout=10) as http, http.stream("POST", path, json=body) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            for _ in range(6):
                next(lines)
            wait_for(lambda: len(engine.scheduler.running) == 2)
        # the client is gone: both runs are aborted within a step or two, long before 1500 tokens
        wait_for(lambda: engine.stats.requests_cancelled >= 2 and not engine.scheduler.running, 10.0)
        assert engine.stats.generated_tokens < 1000


def test_a_reused_request_id_does_not_mix_up_two_requests() -> None:
    """Two requests in flight under one X-Request-Id: leaving one cancels only that one."""
    with threaded_server(
        runner=lambda: SlowRunner(n_ctx=2048, n_slots=4, delay_s=0.005, eos_slope=0.0)
    ) as srv:
        engine = srv.state.runtime.engine
        assert engine is not None
        head = {"X-Request-Id": "same-id"}
        body: dict[str, Any] = {"model": "reference", "max_tokens": 1500, "stream": True, "prompt": "Hi"}
        kept: list[httpx.Response] = []

        def send_kept() -> None:
            with httpx.Client(base_url=srv.url, timeout=30) as other:
                plain = {**body, "stream": False, "max_tokens": 400, "temperature": 0}  # greedy: no chance end-of-text
                kept.append(other.post("/v1/completions", json=plain, headers=head))

        with httpx.Client(base_url=srv.url, timeout=30) as http:
            with http.stream("POST", "/v1/completions", json=body, headers=head) as dropped:
                assert dropped.status_code == 200 and dropped.headers["x-request-id"] == "same-id"
                lines = dropped.iter_lines()  # held: dropping the iterator would close the response
                next(lines)
                thread = threading.Thread(target=send_kept)
                thread.start()
                wait_for(lambda: len(engine.scheduler.running) == 2)
            # the first client has gone while the second request runs
            wait_for(lambda: engine.stats.requests_cancelled == 1)
            thread.join(30)
        assert engine.stats.requests_cancelled == 1
        (resp,) = kept
        assert resp.status_code == 200 and resp.headers["x-request-id"] == "same-id"
        choice = resp.json()["choices"][0]
        assert choice["finish_reason"] == "length" and resp.json()["usage"]["completion_tokens"] == 400


def test_engine_failure_mid_stream_is_an_error_event() -> None:
    with threaded_server(
        runner=lambda: SlowRunner(n_ctx=2048, n_slots=4, delay_s=0.01, eos_slope=0.0)
    ) as srv:
        body = {"model": "reference", "max_tokens": 500, "stream": True, "prompt": "Hi"}
        with (
            httpx.Client(base_url=srv.url, timeout=10) as http,
            http.stream("POST", "/v1/completions", json=body) as resp,
        ):
            lines = resp.iter_lines()
            first = next(lines)
            assert first.startswith("data: {")
            srv.runner.fail = True
            rest = list(lines)
        events = [x for x in rest if x]
        assert events[-1] == "data: [DONE]"
        i = events.index("event: error")
        err = json.loads(events[i + 1][len("data: ") :])["error"]
        assert err["type"] == "internal_error" and err["request_id"] == resp.headers["x-request-id"]
        srv.runner.fail = False
