"""The app on the tiny reference backend, served by uvicorn on 127.0.0.1: for socket tests and benchmarks.

    python -m sluicegate.testing.refserver --port 8123 [every `serve` setting: --database-url URL,
        --redis-url URL, --batch-lease-seconds S, --upstream [NAME=]URL, --name NAME (the model's name,
        default reference), --log-format json, ...]
        [--step-delay-ms MS] [--eos-slope X] [--plain-http]

Its own defaults differ from serve's where a test wants it: a 512-token window, 8 slots, warnings only, and
(without --database-url) a private in-memory store instead of the data directory's.

`running()` starts it as a subprocess on a free port and waits for readiness; the CLI's `serve` serves only
llama.cpp, and the reference backend needs no model file.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from sluicegate.backends.base import BatchItem, Logits
from sluicegate.backends.reference import ReferenceRunner
from sluicegate.testing.wait import wait_for

DEFAULTS = {"ctx": 512, "slots": 8, "log_level": "warning"}  # below the flags, the environment and the file


def main(argv: list[str] | None = None) -> int:
    from sluicegate.api.app import create_app
    from sluicegate.api.server.run import serve_app
    from sluicegate.cli.options import add_config_arg, add_settings_args, given
    from sluicegate.settings import SettingsError, load, to_config
    from sluicegate.telemetry.logs import setup_logging

    p = argparse.ArgumentParser(prog="refserver", description=__doc__)
    add_config_arg(p)
    add_settings_args(p)  # serve's own settings, from flags, SLUICEGATE_* and the file alike
    p.add_argument("--step-delay-ms", type=float, default=0.0, help="sleep this long in every engine step")
    p.add_argument("--eos-slope", type=float, default=0.02, help="0: generations run to their max_new_tokens")
    p.add_argument("--plain-http", action="store_true",
                   help="uvicorn's own httptools protocol, without the connection limits (benchmarks only)")
    args = p.parse_args(argv)
    try:
        s = load(given(args), args.config, defaults=DEFAULTS).settings
        config = to_config(s, default_name="reference")
    except (SettingsError, ValueError) as exc:
        print(f"refserver: {exc}", file=sys.stderr)
        return 2
    setup_logging(s.log_level, s.log_format)
    from sluicegate.telemetry import tracing

    provider = tracing.setup_from_environment()
    store = None
    if s.database_url:  # else a private in-memory store
        from sluicegate.store.db import Store
        from sluicegate.store.migrate import upgrade_engine

        store = Store.open(s.database_url)
        upgrade_engine(store.engine)
    delay = args.step_delay_ms / 1e3
    app = create_app(config, lambda: DelayedRunner(delay, n_ctx=s.ctx, n_slots=s.slots, eos_slope=args.eos_slope,
                                                   name=s.name or "reference"), store=store)
    try:
        serve_app(app, app.state.sluicegate, log_level=s.log_level, plain=args.plain_http)
    finally:
        if store is not None:
            store.close()
        if provider is not None:
            provider.shutdown()
    return 0


class DelayedRunner(ReferenceRunner):
    """The reference model, `delay_s` slower per engine step (a generation long enough to overlap others)."""

    def __init__(self, delay_s: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.delay_s = delay_s

    def execute(self, batch: Sequence[BatchItem]) -> Logits:
        if self.delay_s:
            time.sleep(self.delay_s)
        return super().execute(batch)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RefServer:
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_kib(self) -> int:
        """The server process's resident memory (VmRSS), in KiB."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS for the server process")


@contextmanager
def running(log_dir: Path, *args: str, timeout: float = 120.0) -> Iterator[RefServer]:
    """Start the reference server on a free port, wait until /readyz says 200, stop it afterwards."""
    port = free_port()
    log_path = log_dir / f"refserver-{port}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sluicegate.testing.refserver", "--port", str(port), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    server = RefServer(f"http://127.0.0.1:{port}", port, proc, log_path)
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"refserver exited with {proc.returncode}:\n{server.log()}")
            try:
                return httpx.get(f"{server.url}/readyz", timeout=1.0).status_code == 200
            except httpx.TransportError:
                return False

        try:
            wait_for(ready, timeout, interval=0.05, message="the refserver to be ready")
        except AssertionError as e:
            raise RuntimeError(f"{e}:\n{server.log()}") from None
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    sys.exit(main())
