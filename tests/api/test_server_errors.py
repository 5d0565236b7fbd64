"""uvicorn's own answers under the guarded protocol are the envelope too: an app that ends without answering
gets uvicorn's 500, rendered as `internal_error` with an `X-Request-Id`."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from sluicegate.api.server.run import uvicorn_config
from sluicegate.config import Config
from sluicegate.testing.refserver import free_port
from tests.api.rawhttp import exchange, request


async def silent_app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
    # an HTTP request: ends without a response


@pytest.fixture
def port() -> Iterator[int]:
    port = free_port()
    server = uvicorn.Server(uvicorn_config(silent_app, Config(port=port), log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        thread.join(0.01)
    yield port
    server.should_exit = True
    thread.join(30)


def test_an_app_that_never_answers_gets_the_envelope(port: int) -> None:
    reply, closed = exchange(port, request("GET", "/anything", "X-Request-Id: silent-1"))
    assert reply.status == 500 and closed
    assert reply.headers["content-type"] == "application/json"
    assert reply.error["type"] == "internal_error" and reply.error["request_id"] == "silent-1"
    assert reply.headers["x-request-id"] == "silent-1"
