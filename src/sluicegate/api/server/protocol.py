"""HTTP/1.1 connections: uvicorn's httptools protocol with the limits it lacks, and the envelope on its errors.

Why a subclass, not another server: uvicorn 0.54 with httptools bounds neither the size nor the count of a
request's headers (httptools joins a header's pieces in memory for as long as they come), nor the time to
send them, nor the silence inside a body, and it answers parser errors in plain text. Its h11 protocol bounds
only the head's size, is slower, and has no timeouts either; zttp, the other parser uvicorn offers, is at
0.0.x. The rest of uvicorn (the event loop, flow control, keep-alive, the ASGI cycle) is kept as it is, so the
subclass only watches the bytes before they reach the parser and the parser's callbacks:

- head size: each read is cut at what the head may still take (exact when the head starts a read: a new
  connection, or a keep-alive one after its idle time); the parser's callbacks count too, which covers a
  pipelined head that starts inside a read (it may run over by at most the rest of that one read);
- header count, and `Transfer-Encoding` (only `chunked` is understood: anything else is 501, RFC 9112 6.1);
- one timer per connection and only while a request is incomplete after a read (most requests arrive in one
  read and never arm it): the head must end within `header_timeout_s` of its first read, and a body may not
  fall silent for `body_timeout_s`; while uvicorn has paused reading (the app is not reading) neither runs;
- a connection with no request in progress (new, or kept alive) closes after `keepalive_s` (uvicorn arms that
  timer only after a response; here a new connection gets it too);
- connections past `max_connections` are answered only on /healthz and /readyz (503 `overloaded` elsewhere),
  up to `health_connections` more; past those, closed at once: the process keeps descriptors for its checks.

Every answer written here is the envelope with `X-Request-Id` (the caller's valid one if its header was read)
and `Connection: close`; then the connection is closed gracefully: our side is shut down for writing and what
the client still sends is read and dropped for a moment (`LINGER_S`, `LINGER_BYTES`), so that the client reads
the answer instead of a reset. An error in a request that follows another one on the same connection
(pipelining) waits until the answers before it are written.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sluicegate.api.middleware.request_context import CLOSED_BY, new_request_id, request_id_from
from sluicegate.api.server.refusals import (
    EnvelopeCycle,
    header_bytes_over,
    header_count_over,
    malformed,
    response_bytes,
    timed_out,
    too_many_connections,
    unsupported_coding,
)
from sluicegate.config import ConnectionConfig
from sluicegate.registry import ROUTES
from sluicegate.serving.errors import ApiError

log = logging.getLogger("sluicegate.connection")

IDLE, HEAD, BODY = 0, 1, 2  # where the parser is: between requests, inside a head, inside a body
HEALTH_PATHS = frozenset(r.path.encode() for r in ROUTES if r.probe)  # the route registry's probes
LINGER_S = 2.0  # after an answer written here, read and drop what the client still sends for this long
LINGER_BYTES = 1 << 20  # or this much, then close
_REFUSED_LOG_EVERY_S = 10.0


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """One connection. `limits` and `max_connections` are set per server by `protocol_class`."""

    limits: ClassVar[ConnectionConfig] = ConnectionConfig()
    max_connections: ClassVar[int] = 4096
    _refused_at: ClassVar[float] = 0.0
    _refused_since_log: ClassVar[int] = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.limits.keepalive_s  # type: ignore[assignment]
        self._phase = IDLE
        self._head_bytes = 0  # bytes of the current head, counted by whole reads
        self._field_bytes = 0  # the same, counted by the parser's callbacks
        self._n_headers = 0
        self._completed = False  # a request ended during the current feed
        self._head_since: float | None = None
        self._last_rx = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._pending: tuple[ApiError, str] | None = None  # a refusal waiting for the answers before it
        self._lingering = False
        self._dropped = 0
        self._health_only = False
        self._skipped: object = None  # a pipelined request refused before it started

    # -- connection --------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        n = len(self.connections)
        if n > self.max_connections:
            if n > self.max_connections + self.limits.health_connections:
                self._note_refused_connection(n)
                self.transport.close()
                return
            self._health_only = True
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        super().connection_lost(exc)

    def _note_refused_connection(self, n: int) -> None:
        cls = GuardedHttpToolsProtocol
        cls._refused_since_log += 1
        now = time.monotonic()
        if now - cls._refused_at >= _REFUSED_LOG_EVERY_S:
            log.warning("%d open connections (limit %d plus %d for health checks): %d new ones closed at once",
                        n - 1, self.max_connections, self.limits.health_connections, cls._refused_since_log)
            cls._refused_at, cls._refused_since_log = now, 0

    # -- reading -----------------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._lingering:
            self._dropped += len(data)
            if self._dropped > LINGER_BYTES:
                self.transport.close()
            return
        if self._pending is not None:  # the connection ends after the answers before the refusal
            return
        self._unset_keepalive_if_required()
        rest = memoryview(data)
        while rest:
            if self._phase == BODY:
                chunk, rest = rest, rest[:0]
            else:  # a head starts at, or continues from, this read's first byte: cut it at what it may take
                room = self.limits.max_header_bytes - self._head_bytes
                if room <= 0:
                    self._refuse(header_bytes_over(self.limits.max_header_bytes))
                    return
                chunk, rest = rest[:room], rest[room:]
            self._completed = False
            if not self._feed(chunk):
                return
            if self._phase == HEAD:
                # A head begun after another request ended inside this read counts from the next read on.
                self._head_bytes = 0 if self._completed else self._head_bytes + len(chunk)
        self._arm()

    def _feed(self, chunk: memoryview) -> bool:
        try:
            self.parser.feed_data(chunk)
        except httptools.HttpParserUpgrade:
            return False  # no upgrades are served; the request was handled as plain HTTP
        except httptools.HttpParserError as exc:  # a callback's error too (an unparseable URL, as uvicorn has it)
            cause = exc.__context__
            if isinstance(cause, ApiError):  # a callback's refusal (below): answered, then the connection closed
                self._refuse(cause)
                return False
            if isinstance(exc, httptools.HttpParserCallbackError):  # its text may hold the input: never echoed
                bad_url = isinstance(cause, httptools.HttpParserInvalidURLError)
                reason = "the URL cannot be parsed" if bad_url else "unparseable"
            else:  # llhttp's reasons are fixed texts
                reason = str(exc).strip().rstrip(".") or "unparseable"
            self._refuse(malformed(reason))
            return False
        return True

    # -- parser callbacks --------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase = HEAD
        self._head_bytes = self._field_bytes = self._n_headers = 0
        self._head_since = None

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._field_bytes += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        lim = self.limits
        self._n_headers += 1
        self._field_bytes += len(name) + len(value) + 4
        if self._n_headers > lim.max_headers:
            raise header_count_over(lim.max_headers)
        if self._field_bytes > lim.max_header_bytes:
            raise header_bytes_over(lim.max_header_bytes)
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        elif name == b"transfer-encoding" and [c.strip() for c in value.lower().split(b",")] != [b"chunked"]:
            raise unsupported_coding()
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self._health_only and httptools.parse_url(self.url).path not in HEALTH_PATHS:
            raise too_many_connections(self.max_connections)
        self._phase = BODY
        super().on_headers_complete()
        self.cycle.__class__ = EnvelopeCycle  # uvicorn's own 500, as the envelope
        if self._health_only:
            self.cycle.keep_alive = False

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._phase = IDLE
        self._completed = True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        done = self.cycle.response_complete or self.cycle is self._skipped
        if self._pending is not None and done and not self.pipeline and not self.transport.is_closing():
            (error, request_id), self._pending = self._pending, None
            self._unset_keepalive_if_required()
            self._answer(error, request_id)

    # -- timers ------------------------------------------------------------------------------------------
    def _arm(self) -> None:
        if self._phase == IDLE:
            self._cancel_timer()
            return
        now = self.loop.time()
        if self._phase == HEAD:
            if self._head_since is None:
                self._head_since = now
        else:
            self._last_rx = now
        if self._timer is None:
            wait = self.limits.header_timeout_s if self._phase == HEAD else self.limits.body_timeout_s
            self._timer = self.loop.call_later(wait, self._on_timer)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self._lingering or self._pending is not None or self._phase == IDLE:
            return
        now = self.loop.time()
        head = self._phase == HEAD
        wait = self.limits.header_timeout_s if head else self.limits.body_timeout_s
        if self.flow.read_paused:  # uvicorn is not reading (the app is busy): the client is not the one late
            self._head_since = self._last_rx = now
        due = (self._head_since or now) + wait if head else self._last_rx + wait
        if now < due:
            self._timer = self.loop.call_later(due - now, self._on_timer)
            return
        self._refuse(timed_out(head, wait))

    # -- answering ---------------------------------------------------------------------------------------
    def _refuse(self, error: ApiError) -> None:
        """Answer `error` for the request being read (now, or after the answers before it) and close."""
        self._cancel_timer()
        cycle = self.cycle
        if self._phase == BODY and cycle is not None and not cycle.response_complete:
            queued = [item for item in self.pipeline if item[0] is cycle]
            if queued:  # pipelined behind others, never started: it never reaches the app; answered after them
                self.pipeline.remove(queued[0])
                self._skipped = cycle
                self._pending = (error, request_id_from(cycle.scope["headers"]))  # type: ignore[arg-type]
                self.flow.pause_reading()
                return
            # This request's own body failed: the app is reading it. Answer for it, and tell it the client left.
            cycle.scope["state"][CLOSED_BY] = error.type
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:
                self.transport.close()
                return
            ctx = cycle.scope["state"].get("ctx")
            self._answer(error, ctx.request_id if ctx is not None else request_id_from(self.headers), quiet=True)
        elif self._phase == BODY and cycle is not None:  # answered already, without the body: nothing to say
            self.transport.close()
        else:  # a new request's head (self.headers are its own once the parser has begun it)
            request_id = request_id_from(self.headers) if self._phase == HEAD else new_request_id()
            if cycle is not None and not cycle.response_complete:
                self._pending = (error, request_id)  # answers before this one are still being written
                self.flow.pause_reading()
            else:
                self._answer(error, request_id)

    def _answer(self, error: ApiError, request_id: str, *, quiet: bool = False) -> None:
        self.transport.write(response_bytes(error, request_id, self.server_state.default_headers))
        if not quiet:  # else the app's access line tells it, once
            log.info("%s %d %s/%s from %s", request_id, error.status, error.type, error.code,
                     self.client[0] if self.client else "?")
        self._linger()

    def _linger(self) -> None:
        self._lingering = True
        self._cancel_timer()
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._timer = self.loop.call_later(LINGER_S, self.transport.close)


def protocol_class(limits: ConnectionConfig, max_connections: int) -> type[GuardedHttpToolsProtocol]:
    """The protocol for one server, with its limits (uvicorn builds one instance per connection)."""
    attrs = {"limits": limits, "max_connections": max_connections}
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), attrs)
