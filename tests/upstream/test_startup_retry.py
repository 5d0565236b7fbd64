"""An upstream that fails its start-up checks, as a server process meets it (real processes, real sockets):

- one not listening yet, then answering 503, then well: the server checks it again with backoff, /readyz
  says which upstream and why meanwhile (503, `upstream_starting`, Retry-After), and it then serves;
- one that answers but does not serve the model it is named for (another sluicegate, which answers 404
  model_not_found): a configuration that can never work, so the server exits non-zero with that message.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import uvicorn

from sluicegate.api.server.run import EXIT_CANNOT_SERVE
from sluicegate.testing.refserver import free_port, running
from sluicegate.testing.wait import wait_for
from tests.upstream.fake import FakeUpstream


@contextmanager
def front(tmp: Path, *args: str) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """A reference server with no local model in front of the given upstream; not waited for."""
    port = free_port()
    log = tmp / f"front-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "sluicegate.testing.refserver", "--port", str(port),
                                 "--no-local-model", *args], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        yield f"http://127.0.0.1:{port}", proc, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def serve_on(port: int, app: FakeUpstream) -> Iterator[None]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 60, message="the fake upstream to listen")
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def readyz(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url + "/readyz", timeout=5)
    except httpx.TransportError:
        return None


def test_an_upstream_slow_to_start_is_checked_again_until_it_serves(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there yet
    with front(tmp_path, "--upstream", f"fake=http://127.0.0.1:{port}/v1") as (url, proc, log):
        def waiting(why: str) -> httpx.Response | None:
            assert proc.poll() is None, log.read_text()
            r = readyz(url)
            if r is None or r.status_code != 503:
                return None
            err = r.json()["error"]
            return r if err["code"] == "upstream_starting" and why in err["message"] else None

        r = wait_for(lambda: waiting("not reachable"), 60, message="/readyz to say the upstream is not reachable")
        message = r.json()["error"]["message"]
        assert "upstream fake" in message and f"127.0.0.1:{port}" in message and "checked again in" in message
        assert int(r.headers["retry-after"]) >= 1
        fake = FakeUpstream(script=["status:503"])  # up, but not serving yet: one more 503
        with serve_on(port, fake):
            wait_for(lambda: readyz(url) is not None and readyz(url).status_code == 200,  # type: ignore[union-attr]
                     120, message="the server to become ready once the upstream serves")
            assert fake.completions()[:2] == ["status:503", "ok"]  # checked again after the 503
            reply = httpx.post(url + "/v1/completions", json={"model": "fake", "prompt": "hi", "max_tokens": 2},
                               timeout=60)
            assert reply.status_code == 200, reply.text
        assert proc.poll() is None  # it kept serving all along


def test_an_upstream_not_serving_the_named_model_exits_non_zero(tmp_path: Path) -> None:
    with running(tmp_path, "--eos-slope", "0.2") as upstream, \
            front(tmp_path, "--upstream", f"nobody={upstream.url}/v1") as (_url, proc, log):  # it serves `reference`
        wait_for(lambda: proc.poll() is not None, 120, interval=0.05, message="the server to exit")
        text = log.read_text()
        assert proc.returncode == EXIT_CANNOT_SERVE, text
        assert "does not serve model nobody" in text and "upstream nobody" in text
