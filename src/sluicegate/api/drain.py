"""The shutdown drain, as the app sees it: which requests are in flight, and refusing new ones while draining.

`Drain` is flipped by the server on SIGTERM (api/server/run.py). From then on `/readyz` answers 503
`shutting_down` (a load balancer stops sending), every other new request but `/healthz` and `/metrics` (the
route registry's `drain_exempt`, sluicegate/registry.py) gets 503 `shutting_down` with `Retry-After`, and
every response carries `Connection: close` (a kept-alive client reconnects, to another replica). Requests
already in flight go on; the server waits for them (`wait_idle`), then marks those still running as cut (their
access line says so, once) and stops the engine, whose cancelled runs end each stream with an error event and
`[DONE]` and each whole answer with its envelope.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluicegate.api.envelope import send_error
from sluicegate.api.middleware.request_context import CUT, context_of
from sluicegate.registry import ROUTES
from sluicegate.serving.errors import ApiError

_EXEMPT = frozenset(r.path for r in ROUTES if r.drain_exempt)  # answered while draining (readyz says 503 itself)
RETRY_AFTER_S = 5  # Retry-After on 503 shutting_down


def shutting_down() -> ApiError:
    return ApiError("shutting_down", "the server is shutting down; retry, another replica may take the request",
                    code="draining", retry_after=RETRY_AFTER_S, headers={"Connection": "close"})


class Drain:
    def __init__(self) -> None:
        self.draining = False
        self._inflight: dict[int, dict[str, object]] = {}  # id -> the request's scope state
        self._idle: asyncio.Event | None = None

    def begin(self) -> None:
        self.draining = True

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    def enter(self, state: dict[str, object]) -> int:
        key = id(state)
        self._inflight[key] = state
        return key

    def leave(self, key: int) -> None:
        self._inflight.pop(key, None)
        if not self._inflight and self._idle is not None:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is in flight, or `timeout` seconds; True when none is."""
        if self._inflight:
            self._idle = asyncio.Event()
            try:
                async with asyncio.timeout(timeout):
                    await self._idle.wait()
            except TimeoutError:
                pass
            finally:
                self._idle = None
        return not self._inflight

    def cut(self) -> int:
        """Mark every request still in flight as cut by the shutdown; how many."""
        for state in self._inflight.values():
            state[CUT] = True
        return len(self._inflight)


class DrainMiddleware:
    """Tracks in-flight requests; while draining, refuses new ones and closes connections after answers."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _EXEMPT:
            await self.app(scope, receive, self._closing(send))
            return
        drain = self.drain
        if drain.draining:
            await send_error(send, shutting_down(), context_of(scope).request_id)
            return
        key = drain.enter(scope.setdefault("state", {}))
        try:
            await self.app(scope, receive, self._closing(send))
        finally:
            drain.leave(key)

    def _closing(self, send: Send) -> Send:
        drain = self.drain

        async def send_closing(message: Message) -> None:
            if drain.draining and message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        return send_closing
