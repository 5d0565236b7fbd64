"""Benchmark helpers: one launcher for every server a benchmark starts (ours, the reference server, llama.cpp's
server) on a free port, waiting for readiness and stopping it after; `sluicegate_server` is ours on the real model."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, path: str, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url + path, timeout=1.0).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready in {timeout}s")


@dataclass(frozen=True, slots=True)
class Launched:
    url: str
    pid: int


@contextlib.contextmanager
def launch(
    cmd: Sequence[str], port: int, *, ready: str = "/readyz", log: Path | None = None, append: bool = False,
    env: Mapping[str, str] | None = None, group: bool = False, timeout: float = 120.0,
) -> Iterator[Launched]:
    """Run `cmd` (listening on 127.0.0.1:`port`) until `ready` answers 200 within `timeout` seconds; stop it on
    exit (SIGTERM, then up to 60 s). Output goes to `log` (truncated, or appended to with `append`) or nowhere;
    `env` is added to this process's environment. `group`: the server runs in a session of its own and is
    stopped as a process group, SIGKILLed after the 60 s (a wrapper whose child must go too)."""
    with log.open("ab" if append else "wb") if log else contextlib.nullcontext(subprocess.DEVNULL) as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT,
                                env=None if env is None else {**os.environ, **env}, start_new_session=group)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, ready, proc, timeout=timeout)
        yield Launched(url, proc.pid)
    finally:
        if not group:
            proc.terminate()
            proc.wait(timeout=60)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def serve_command(port: int, *args: str) -> list[str]:
    """`sluicegate serve` on `port` with this interpreter (the checkout's sources, or PYTHONPATH's)."""
    return [sys.executable, "-m", "sluicegate", "serve", "--port", str(port), *args]


@contextlib.contextmanager
def sluicegate_server(*args: str, log: Path | None = None) -> Iterator[str]:
    port = free_port()
    with launch(serve_command(port, "--data-dir", fresh_data_dir(), *args), port, log=log) as server:
        yield server.url


def fresh_data_dir() -> str:
    """A store of its own for a benchmark's server: no API keys, so no 401 whatever the checkout holds."""
    return tempfile.mkdtemp(prefix="sluicegate-bench-")
