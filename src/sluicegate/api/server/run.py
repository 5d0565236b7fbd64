"""Serving the app: uvicorn with the guarded protocol, a descriptor budget, and a drain on SIGTERM.

uvicorn's own shutdown closes the listener first (new requests are refused at the socket), waits for open
connections without telling the app, then cancels what is left (streams end with no final event, and a
CancelledError traceback each), and re-raises the signal (exit status 143). `Server` replaces that with:

1. first SIGTERM or SIGINT: the app's `Drain` turns on (api/drain.py: /readyz 503, new requests 503
   `shutting_down` + Retry-After, the listener still accepting); in-flight requests get up to `drain_s`;
2. then the requests still running are marked cut and the engine is stopped: its cancelled runs end every
   stream with an error event and `[DONE]`, every whole answer with its 503 envelope; they get `CUT_GRACE_S`
   to be written, then any connection still busy is closed (its app sees a disconnect);
3. then uvicorn's own shutdown, with nothing left for it to cut; the process exits 0.

A second SIGTERM or SIGINT exits at once, with the status of a process killed by that signal (128 + N).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import resource
import signal
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

from sluicegate.api.server.protocol import protocol_class
from sluicegate.api.state import AppState
from sluicegate.config import Config, ConnectionConfig

log = logging.getLogger("sluicegate.server")

DEFAULT_MAX_CONNECTIONS = 4096
FD_RESERVE = 256  # descriptors kept for everything but client connections (store, Redis pool, model, logs)
CUT_GRACE_S = 5.0  # after the engine stops, how long cut responses get to write their last bytes
SHUTDOWN_S = 5  # then uvicorn's own wait for connections (only stuck ones are left)
EXIT_CANNOT_SERVE = 3  # the exit status of a server whose configuration can never serve


def raise_fd_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):  # not allowed here: keep what we have
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def connection_budget(conn: ConnectionConfig, nofile: int) -> int:
    """Connections served fully: as configured (default 4096), and never more than the descriptors allow
    after `FD_RESERVE` and the health-check headroom."""
    room = max(1, nofile - FD_RESERVE - conn.health_connections)
    want = conn.max_connections or DEFAULT_MAX_CONNECTIONS
    if want > room:
        log.warning("--max-connections %d does not fit in %d file descriptors; serving at most %d", want, nofile,
                    room)
    return min(want, room)


def uvicorn_config(app: ASGIApp, config: Config, *, log_level: str = "info", plain: bool = False) -> uvicorn.Config:
    """uvicorn's configuration for the app. `plain`: uvicorn's own httptools protocol, none of the connection
    limits (only to measure what they cost: bench/connections.py)."""
    conn = config.connections
    http: type[asyncio.Protocol] | str = "httptools"
    if not plain:
        http = protocol_class(conn, connection_budget(conn, raise_fd_limit()))
    return uvicorn.Config(
        # log_config None: uvicorn's lines go through the process's own handler and format (text or JSON)
        app, host=config.host, port=config.port, log_level=log_level, log_config=None, access_log=False, http=http,
        ws="none",
        timeout_keep_alive=max(1, math.ceil(conn.keepalive_s)), timeout_graceful_shutdown=SHUTDOWN_S,
    )


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: AppState) -> None:
        super().__init__(config)
        self.state = state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signalled = False
        self._drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        self._loop = asyncio.get_running_loop()
        self.state.runtime.shutdown = self._fatal
        await super().serve(sockets)  # type: ignore[arg-type]

    def _fatal(self, why: str) -> None:
        """A configuration that can never serve (api/model_runtime.py): shut down; `serve_app` then exits non-zero."""
        if not self._signalled:
            self._signalled = True
            self._start_drain("the configuration cannot serve")

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        name = signal.Signals(sig).name
        if self._signalled:
            log.warning("second %s: exiting now", name)
            logging.shutdown()
            os._exit(128 + sig)
        self._signalled = True
        if self._loop is None:
            self.should_exit = True
            return
        self._loop.call_soon_threadsafe(self._start_drain, name)

    def _start_drain(self, name: str) -> None:
        self._drain_task = asyncio.ensure_future(self.drain(name))

    async def drain(self, why: str = "shutdown") -> None:
        """The graceful shutdown (module doc); sets `should_exit` when done."""
        state, drain = self.state, self.state.drain
        limit = state.config.limits.drain_s
        drain.begin()
        log.warning("%s: draining; /readyz answers 503 and new requests get 503 shutting_down; %d in flight "
                    "have up to %g s", why, drain.inflight, limit)
        try:
            if not await drain.wait_idle(limit):
                n = drain.cut()
                log.warning("drain time over: ending the %d requests still running", n)
            for engine in state.runtime.engines:
                await asyncio.to_thread(engine.stop, drain_s=0.0)
            if not await drain.wait_idle(CUT_GRACE_S):
                self._close_busy_connections()
        finally:
            self.should_exit = True

    def _close_busy_connections(self) -> None:
        for conn in list(self.server_state.connections):
            cycle = getattr(conn, "cycle", None)
            if cycle is not None and not cycle.response_complete:
                conn.transport.close()


def serve_app(app: ASGIApp, state: AppState, *, log_level: str = "info", plain: bool = False) -> None:
    """Serve until a signal ends it (see the module doc); SystemExit(EXIT_CANNOT_SERVE) when the configuration
    can never serve (an upstream that does not serve the model it is named for: api/model_runtime.py)."""
    Server(uvicorn_config(app, state.config, log_level=log_level, plain=plain), state).run()
    if state.runtime.fatal is not None:
        log.error("exiting: %s", state.runtime.fatal)
        raise SystemExit(EXIT_CANNOT_SERVE)
