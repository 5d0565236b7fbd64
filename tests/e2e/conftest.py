"""End-to-end fixtures: the real server as a subprocess on 127.0.0.1, serving the real SmolLM2 model."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sluicegate.testing.wait import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_server(tmp: Path, *args: str, timeout: float = 180.0) -> Server:
    """`sluicegate serve` on a free port; its store is a fresh SQLite file under `tmp` unless `args` name one."""
    port = free_port()
    if "--database-url" not in args and "--data-dir" not in args:
        args = (*args, "--data-dir", str(tmp / f"data-{port}"))
    log_path = tmp / f"server-{port}.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sluicegate", "serve", "--host", "127.0.0.1", "--port", str(port), *args],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            return httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_for(ready, timeout, interval=0.1, message="the server to be ready")
    except AssertionError as e:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{e}:\n{log_path.read_text()}") from None
    return Server(url, proc, log_path)


def stop_server(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One real server for the session: default model, 16 slots."""
    srv = start_server(tmp_path_factory.mktemp("server"), "--slots", "16")
    yield srv
    stop_server(srv)
