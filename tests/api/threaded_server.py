"""The app served by uvicorn in a thread on 127.0.0.1: a real socket, with the app's state reachable from the
test (engine counters, a runner that fails on demand)."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn

from sluicegate.api.app import create_app
from sluicegate.api.server.run import uvicorn_config
from sluicegate.api.state import AppState
from sluicegate.backends.base import BatchItem, Logits
from sluicegate.backends.reference import ReferenceRunner
from sluicegate.config import Config
from sluicegate.store.db import Store
from sluicegate.testing.wait import wait_for


class SlowRunner(ReferenceRunner):
    """The reference model, `delay_s` slower per step, failing every step while `fail` is set."""

    def __init__(self, *, delay_s: float = 0.0, **kw: int) -> None:
        super().__init__(**kw)
        self.delay_s = delay_s
        self.fail = False

    def execute(self, batch: Sequence[BatchItem]) -> Logits:
        if self.fail:
            raise RuntimeError("injected failure")
        if self.delay_s:
            time.sleep(self.delay_s)
        return super().execute(batch)


@dataclass
class Threaded:
    url: str
    state: AppState
    runner: SlowRunner


@contextmanager
def threaded_server(
    config: Config | None = None, runner: Callable[[], SlowRunner] | None = None, store: Store | None = None
) -> Iterator[Threaded]:
    """`store`: the keys and usage ledger (the caller opens and closes it); None: in-memory, no key, auth off."""
    made: list[SlowRunner] = []

    def factory() -> SlowRunner:
        r = (runner or (lambda: SlowRunner(n_ctx=2048, n_slots=4)))()
        made.append(r)
        return r

    config = config or Config()
    app = create_app(config, factory, store=store)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    # As `serve` runs it (the guarded protocol and its limits), without the signal handling of the main thread.
    server = uvicorn.Server(uvicorn_config(app, dataclasses.replace(config, host="127.0.0.1", port=port),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(ready, 20, interval=0.02, message="the threaded server to become ready")
    try:
        yield Threaded(url, app.state.sluicegate, made[0])
    finally:
        server.should_exit = True
        thread.join(timeout=30)
