"""A fault-injecting fake upstream: a small raw-ASGI app on a real socket, speaking vLLM's `/tokenize` and a
streamed `/v1/completions`, with one scripted behaviour per completion request; and the helper that serves
an app in a thread."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from sluicegate.backends.reference import ReferenceRunner
from sluicegate.testing.wait import wait_for

# Behaviours: ok, status:503 (any status), slow_first (200, then nothing until the client leaves), hang (no
# answer until the client leaves), drop (one token, then the connection breaks), malformed, no_usage,
# wrong_usage, no_ids (usage but no token ids)
DEFAULT = "ok"


@dataclass
class FakeUpstream:
    tokenizer: ReferenceRunner = field(default_factory=lambda: ReferenceRunner(n_ctx=512, n_slots=1))
    script: list[str] = field(default_factory=list)  # consumed one per completion request; then `default`
    default: str = DEFAULT
    arrivals: list[tuple[float, str]] = field(default_factory=list)  # (monotonic, behaviour) per completion
    left: list[str] = field(default_factory=list)  # behaviours whose client closed the request
    auth: list[str] = field(default_factory=list)  # the Authorization header of each completion request
    traceparents: list[str] = field(default_factory=list)  # the traceparent header of each (empty: none)
    url: str = ""

    def completions(self) -> list[str]:
        return [b for _, b in self.arrivals]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        data: dict[str, Any] = json.loads(body) if body else {}
        if scope["path"] == "/tokenize":
            ids = self.tokenizer.tokenize(data.get("prompt", ""), add_special=data.get("add_special_tokens", True))
            await _json(send, 200, {"count": len(ids), "max_model_len": 512, "tokens": ids})
        elif scope["path"] == "/v1/completions":
            behaviour = self.script.pop(0) if self.script else self.default
            self.arrivals.append((time.monotonic(), behaviour))
            self.auth.append(dict(scope["headers"]).get(b"authorization", b"").decode())
            self.traceparents.append(dict(scope["headers"]).get(b"traceparent", b"").decode())
            await self._complete(behaviour, data, receive, send)
        else:
            await _json(send, 404, {"error": {"message": "no such route"}})

    async def _wait_gone(self, receive: Receive, behaviour: str) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.left.append(behaviour)

    async def _complete(self, behaviour: str, data: dict[str, Any], receive: Receive, send: Send) -> None:
        if behaviour.startswith("status:"):
            await _json(send, int(behaviour[7:]), {"error": {"message": "secret upstream detail"}})
            return
        if behaviour == "hang":
            await self._wait_gone(receive, behaviour)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})

        async def event(obj: Any) -> None:
            text = obj if isinstance(obj, str) else json.dumps(obj)
            await send({"type": "http.response.body", "body": f"data: {text}\n\n".encode(), "more_body": True})

        if behaviour == "slow_first":
            await self._wait_gone(receive, behaviour)
            return
        if behaviour == "malformed":
            await event("{not json")
            await event("[DONE]")
            await send({"type": "http.response.body", "body": b""})
            return
        ids = self.tokenizer.tokenize(" the fake upstream says hello", add_special=False)[: data["max_tokens"]]
        ids_out = behaviour != "no_ids" and data.get("return_token_ids")
        for i, t in enumerate(ids):
            choice: dict[str, Any] = {"index": 0, "text": self.tokenizer.token_bytes(t).decode(errors="replace"),
                                      "finish_reason": None}
            if ids_out:
                choice["token_ids"] = [t]
            await event({"choices": [choice]})
            if behaviour == "drop" and i == 0:
                raise RuntimeError("the fake upstream drops the connection mid-stream")
            await asyncio.sleep(0)
        reason = "length" if len(ids) == data["max_tokens"] else "stop"
        await event({"choices": [{"index": 0, "text": "", "finish_reason": reason}]})
        usage = {"prompt_tokens": len(data["prompt"]) + (behaviour == "wrong_usage"),
                 "completion_tokens": len(ids), "total_tokens": len(data["prompt"]) + len(ids)}
        if behaviour != "no_usage":
            await event({"choices": [], "usage": usage})
        await event("[DONE]")
        await send({"type": "http.response.body", "body": b""})


async def _json(send: Send, status: int, obj: Any) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": json.dumps(obj).encode()})


@contextmanager
def serve(app: ASGIApp, *, ready_path: str | None = None, ready_timeout: float = 60.0) -> Iterator[str]:
    """Serve `app` on 127.0.0.1 in a thread; yields its URL; `ready_path` is polled until it answers 200."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical",
                                           access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if not thread.is_alive():
            raise RuntimeError(f"the server at {url} exited before it was ready")
        return bool(server.started and (not ready_path or _ok(url + ready_path)))

    wait_for(ready, ready_timeout, interval=0.02, message=f"the server at {url} to become ready")
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.TransportError:
        return False
