"""The app on the tiny reference backend, served by uvicorn on 127.0.0.1: for socket tests and benchmarks.

    python -m sluicegate.testing.refserver --port 8123 [--max-body-bytes N] [--ctx 512] [--database-url URL]
        [--redis-url URL] [--idempotency-ttl-hours H] [--step-delay-ms MS] [--eos-slope X]
        [--jobs-lease-s S] [--jobs-worker-slots N] [--jobs-poll-s S]
        [--upstream [NAME=]URL --no-local-model ...]  (serve's upstream flags; the reference tokenizer)
        [--drain-seconds S] [the connection flags of `serve`: --header-timeout S, ...] [--plain-http]

`running()` starts it as a subprocess on a free port and waits for readiness; the CLI's `serve` serves only
llama.cpp, and the reference backend needs no model file.
"""

from __future__ import annotations

import argparse
import logging
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


def main(argv: list[str] | None = None) -> int:
    from sluicegate import cli_upstream
    from sluicegate.api.app import create_app
    from sluicegate.api.server.run import serve_app
    from sluicegate.cli import add_connection_args, connections_from_args
    from sluicegate.config import Config, DeadlineConfig, IdempotencyConfig, JobsConfig, LimitsConfig, RateLimitConfig

    p = argparse.ArgumentParser(prog="refserver", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--ctx", type=int, default=512)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--max-body-bytes", type=int, default=LimitsConfig().max_body_bytes)
    p.add_argument("--database-url", default=None,
                   help="the store (keys, usage), migrated to head here; default: a private in-memory one")
    p.add_argument("--redis-url", default=None, help="rate-limit buckets in Redis (as serve --redis-url)")
    p.add_argument("--idempotency-ttl-hours", type=float, default=IdempotencyConfig().ttl_hours)
    p.add_argument("--step-delay-ms", type=float, default=0.0, help="sleep this long in every engine step")
    p.add_argument("--eos-slope", type=float, default=0.02, help="0: generations run to their max_new_tokens")
    p.add_argument("--jobs-lease-s", type=float, default=JobsConfig().lease_s, help="batch item lease")
    p.add_argument("--jobs-worker-slots", type=int, default=None, help="batch items run at once")
    p.add_argument("--jobs-poll-s", type=float, default=JobsConfig().poll_s, help="idle batch worker's poll")
    p.add_argument("--drain-seconds", type=float, default=LimitsConfig().drain_s)
    add_connection_args(p)
    p.add_argument("--plain-http", action="store_true",
                   help="uvicorn's own httptools protocol, without the connection limits (benchmarks only)")
    p.add_argument("--log-level", default="warning")
    cli_upstream.add_upstream_args(p)  # --upstream [NAME=]URL: front another server (tokenizer: the reference's)
    args = p.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    upstream = cli_upstream.upstream_from_args(args, "reference", max_timeout_s=DeadlineConfig().max_timeout_s)
    config = Config(upstream=upstream,
                    limits=LimitsConfig(max_body_bytes=args.max_body_bytes, drain_s=args.drain_seconds),
                    connections=connections_from_args(args),
                    ratelimit=RateLimitConfig(redis_url=args.redis_url),
                    idempotency=IdempotencyConfig(ttl_hours=args.idempotency_ttl_hours),
                    jobs=JobsConfig(lease_s=args.jobs_lease_s, worker_slots=args.jobs_worker_slots,
                                    poll_s=args.jobs_poll_s),
                    host=args.host, port=args.port)
    store = None
    if args.database_url:
        from sluicegate.store.db import Store
        from sluicegate.store.migrate import upgrade_engine

        store = Store.open(args.database_url)
        upgrade_engine(store.engine)
    delay = args.step_delay_ms / 1e3
    app = create_app(config, lambda: DelayedRunner(delay, n_ctx=args.ctx, n_slots=args.slots,
                                                   eos_slope=args.eos_slope), store=store)
    try:
        serve_app(app, app.state.sluicegate, log_level=args.log_level, plain=args.plain_http)
    finally:
        if store is not None:
            store.close()
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
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"refserver exited with {proc.returncode}:\n{server.log()}")
            try:
                if httpx.get(f"{server.url}/readyz", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"refserver not ready in {timeout}s:\n{server.log()}")
            time.sleep(0.05)
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
