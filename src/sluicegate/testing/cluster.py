"""The deploy/ topology as processes on 127.0.0.1: replicas on one Postgres database and one Redis, behind
HAProxy (the system's package) running deploy/haproxy.cfg as shipped, TLS terminated with a certificate made
here. For bench/cluster.py and the HAProxy test; no container runtime needed.

    with Cluster(tmp, database_url, redis_url, replicas=3) as c:     # reference backend by default
        httpx.get(c.url + "/v1/models", verify=c.tls)
        c.restart(0)          # SIGTERM, wait for the exit, start again, wait until HAProxy has it back
        c.kill9(1)

`model=True` runs `sluicegate serve` with the real model instead of the reference server. Every process gets a
free port, logs to a file under the given directory, and is stopped at the end.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

from sluicegate.testing.refserver import free_port
from sluicegate.testing.wait import wait_for

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
HAPROXY_CFG = DEPLOY / "haproxy.cfg"


def haproxy_binary() -> str | None:
    return shutil.which("haproxy")


def make_certificate(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1: (the PEM HAProxy serves: certificate and key;
    the certificate alone, for clients to trust)."""
    key, cert = directory / "tls.key", directory / "tls.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    pem = directory / "tls.pem"
    pem.write_bytes(cert.read_bytes() + key.read_bytes())
    pem.chmod(0o600)
    return pem, cert


def _wait(check: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, timeout: float, what: str) -> None:
    """Until `check()` holds (a refused connection counts as not yet); fails when `proc` exits or at `timeout`."""

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {proc.returncode}:\n"
                               f"{log.read_text(errors='replace')[-4000:]}")
        try:
            return check()
        except httpx.TransportError:
            return False

    try:
        wait_for(ready, timeout, interval=0.1, message=what)
    except AssertionError as e:
        raise RuntimeError(str(e)) from None


@dataclass
class Replica:
    index: int
    port: int
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Cluster:
    directory: Path
    database_url: str
    redis_url: str | None
    replicas_n: int = 3
    model: bool = False  # the real model (`sluicegate serve`); False: the reference server
    args: Sequence[str] = ()  # more settings for every replica
    env: dict[str, str] = field(default_factory=dict)
    replicas: list[Replica] = field(default_factory=list)
    haproxy: subprocess.Popen[bytes] | None = None
    url: str = ""
    ca: str = ""  # the certificate, for a client to trust
    tls: ssl.SSLContext | None = None  # a client context that trusts it
    stats_url: str = ""

    def __enter__(self) -> Cluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        if haproxy_binary() is None:
            raise RuntimeError("haproxy is not installed (apt-get install haproxy)")
        self.replicas = [Replica(i, free_port(), self.directory / f"replica{i}.log") for i in range(3)]
        # the schema once, before any replica starts (as the compose file's one-shot `migrate` service does)
        subprocess.run([sys.executable, "-m", "sluicegate", "db", "upgrade", "--database-url", self.database_url],
                       check=True, capture_output=True)
        try:
            for r in self.replicas[:self.replicas_n]:
                self._spawn(r)
            for r in self.replicas[:self.replicas_n]:
                self.wait_ready(r)
            self._start_haproxy()
            self.wait_in_rotation(range(self.replicas_n))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object | TracebackType) -> None:
        self.close()

    def _command(self, r: Replica) -> list[str]:
        common = ["--host", "127.0.0.1", "--port", str(r.port), "--database-url", self.database_url,
                  "--log-format", "json", *self.args]
        if self.redis_url:
            common += ["--redis-url", self.redis_url]
        if self.model:
            return [sys.executable, "-m", "sluicegate", "serve", *common]
        return [sys.executable, "-m", "sluicegate.testing.refserver", "--log-level", "info", *common]

    def _spawn(self, r: Replica) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        with r.log_path.open("ab") as log:
            r.proc = subprocess.Popen(self._command(r), stdout=log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, r: Replica, timeout: float = 180.0) -> None:
        assert r.proc is not None

        def ready() -> bool:
            return httpx.get(f"{r.url}/readyz", timeout=2.0).status_code == 200

        _wait(ready, r.proc, r.log_path, timeout, f"replica {r.index} not ready")

    def _start_haproxy(self) -> None:
        pem, cert = make_certificate(self.directory)
        self.ca = str(cert)
        self.tls = ssl.create_default_context(cafile=self.ca)
        https, http, stats = free_port(), free_port(), free_port()
        env = {**os.environ, "SG_HTTPS_BIND": f"127.0.0.1:{https}", "SG_HTTP_BIND": f"127.0.0.1:{http}",
               "SG_STATS_BIND": f"127.0.0.1:{stats}", "SG_TLS_CERT": str(pem)}
        for r in self.replicas:
            env[f"SG_REPLICA{r.index + 1}"] = f"127.0.0.1:{r.port}"
        log = (self.directory / "haproxy.log").open("ab")
        self.haproxy = subprocess.Popen([haproxy_binary() or "haproxy", "-W", "-db", "-f", str(HAPROXY_CFG)],
                                        stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        self.url = f"https://127.0.0.1:{https}"
        self.http_url = f"http://127.0.0.1:{http}"
        self.stats_url = f"http://127.0.0.1:{stats}/metrics"

    def rotation(self) -> dict[str, str]:
        """Each server's state as HAProxy sees it (`UP`, `DOWN`, `MAINT`, ...)."""
        text = httpx.get(self.stats_url, timeout=5).text
        out: dict[str, str] = {}
        for m in re.finditer(r'^haproxy_server_status\{proxy="sluicegate",server="(r\d)",state="(\w+)"\} 1', text,
                             re.M):
            out[m.group(1)] = m.group(2)
        return out

    def wait_in_rotation(self, indexes: Sequence[int] | range, timeout: float = 120.0) -> None:
        assert self.haproxy is not None
        want = {f"r{i + 1}" for i in indexes}

        def up() -> bool:
            states = self.rotation()
            return all(states.get(s) == "UP" for s in want)

        _wait(up, self.haproxy, self.directory / "haproxy.log", timeout, f"replicas {sorted(want)} not in rotation")

    def stop(self, i: int, sig: signal.Signals = signal.SIGTERM, timeout: float = 120.0) -> int:
        """Signal replica `i` and wait for its exit; its exit status."""
        r = self.replicas[i]
        assert r.proc is not None
        r.proc.send_signal(sig)
        return r.proc.wait(timeout=timeout)

    def start(self, i: int) -> None:
        r = self.replicas[i]
        self._spawn(r)
        self.wait_ready(r)

    def restart(self, i: int) -> int:
        """One step of a rolling restart: SIGTERM (the drain), the exit, a new process, back in rotation."""
        status = self.stop(i)
        self.start(i)
        self.wait_in_rotation([i])
        return status

    def kill9(self, i: int) -> None:
        self.stop(i, signal.SIGKILL)

    def close(self) -> None:
        procs = [r.proc for r in self.replicas if r.proc is not None] + ([self.haproxy] if self.haproxy else [])
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


__all__ = ["HAPROXY_CFG", "Cluster", "Replica", "haproxy_binary", "make_certificate"]
