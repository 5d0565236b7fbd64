"""The auth middleware as plain ASGI (no server): what it hands the app inside it, and a websocket refused."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from sluicegate.api.middleware.auth import AuthMiddleware, api_key_of
from sluicegate.api.tenancy import Tenancy
from sluicegate.config import Config
from sluicegate.store.db import in_memory
from sluicegate.tenancy.keys import Scope as KeyScope
from sluicegate.tenancy.keys import create_key


def call(mw: AuthMiddleware, scope: Scope) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(mw(scope, receive, send))
    return sent


def test_the_app_inside_sees_the_key_and_a_websocket_without_one_is_closed() -> None:
    store = in_memory()
    tenancy = Tenancy(Config(), store)
    record, secret = create_key(store, "k", {KeyScope.GENERATE}, tpm=600, burst=100)
    seen: list[Any] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append((api_key_of(scope), scope["state"]["ctx"].tenant))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    mw = AuthMiddleware(app, tenancy)
    headers = [(b"authorization", f"Bearer {secret}".encode())]
    sent = call(mw, {"type": "http", "method": "GET", "path": "/v1/models", "headers": headers})
    assert sent[0]["status"] == 204
    key, tenant = seen[0]
    assert key == record and key.tpm == 600 and key.burst == 100 and tenant == record.id

    sent = call(mw, {"type": "websocket", "path": "/v1/anything", "headers": []})
    assert sent == [{"type": "websocket.close", "code": 1008}] and len(seen) == 1
    sent = call(mw, {"type": "websocket", "path": "/v1/anything", "headers": headers})
    assert len(seen) == 2  # with a key, the app gets it
    store.close()
