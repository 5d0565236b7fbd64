"""Benchmark helpers: start our server (real model) on a free port, wait for readiness, stop it."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
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


@contextlib.contextmanager
def sluicegate_server(*args: str, log: Path | None = None) -> Iterator[str]:
    port = free_port()
    out = log.open("wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluicegate", "serve", "--port", str(port), "--data-dir", fresh_data_dir(), *args],
        stdout=out, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, "/readyz", proc)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def fresh_data_dir() -> str:
    """A store of its own for a benchmark's server: no API keys, so no 401 whatever the checkout holds."""
    return tempfile.mkdtemp(prefix="sluicegate-bench-")

