"""Connection limits: server memory with many idle connections and under oversized headers, and what the guarded
protocol costs per request against uvicorn's own httptools protocol.

    flock /tmp/sluicegate-bench.lock .venv/bin/python bench/connections.py [--idle 1000] [--pushers 8]
        [--push-mib 32] [--requests 2000] [--rounds 5] [--write]

Two reference servers (`sluicegate.testing.refserver`, subprocesses, the same app and flags) run side by side:
**guarded** (what `serve` runs: api/server/protocol.py) and **plain** (`--plain-http`: uvicorn 0.54's
HttpToolsProtocol, as served before the limits). For each:

- **idle**: server RSS (VmRSS) before and after `--idle` connections that each made one request and then sit
  kept alive (the keep-alive time is set long enough to hold them); KiB per connection;
- **push**: `--pushers` connections each sending one header line that never ends, up to `--push-mib` MiB; the
  server's peak RSS while they push (sampled every 10 ms) minus its RSS before. Guarded: refused with 431 at
  64 KiB, so it must stay flat; plain: it holds what it is sent;
- **latency**: `GET /healthz` and a one-token `POST /v1/generate`, one at a time over one kept-alive raw socket
  per server, the two servers interleaved request by request in `--rounds` rounds of `--requests`; client wall
  time per request, median and p99; *added* is guarded minus plain per interleaved pair (median).

`--write` replaces the "## Connection limits" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.report import median, percentile, publish  # noqa: E402
from sluicegate.testing.refserver import RefServer, running  # noqa: E402

HEADING = "## Connection limits"
GENERATE = json.dumps({"prompt": "Hello", "max_new_tokens": 1, "temperature": 0}).encode()


def request(method: str, path: str, body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + "\r\n").encode() + body


class Conn:
    """One kept-alive connection; `ask` sends a request and reads its whole (Content-Length) answer."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def ask(self, data: bytes) -> int:
        self.sock.sendall(data)
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        while len(self.buf) < length:
            self.buf += self.sock.recv(65536)
        self.buf = self.buf[length:]
        return int(head.split(b" ", 2)[1])

    def close(self) -> None:
        self.sock.close()


def idle_rss(server: RefServer, n: int) -> tuple[int, int]:
    """RSS (KiB) before and with `n` idle kept-alive connections."""
    before = server.rss_kib()
    conns = []
    try:
        for _ in range(n):
            c = Conn(server.port)
            assert c.ask(request("GET", "/healthz")) == 200
            conns.append(c)
        time.sleep(0.5)  # let the server settle before sampling (not a timing)
        return before, server.rss_kib()
    finally:
        for c in conns:
            c.close()


def push(port: int, total: int) -> None:
    piece = b"h" * 65536
    with socket.create_connection(("127.0.0.1", port)) as s:
        try:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Huge: ")
            for _ in range(total // len(piece)):
                s.sendall(piece)
            s.settimeout(30)
            s.recv(65536)  # the plain server may still be reading: wait for its answer or its close
        except OSError:
            pass


def push_rss(server: RefServer, pushers: int, mib: int) -> tuple[int, int]:
    """RSS (KiB) before, and the peak while `pushers` connections each push a `mib` MiB header."""
    before = peak = server.rss_kib()
    threads = [threading.Thread(target=push, args=(server.port, mib << 20)) for _ in range(pushers)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, server.rss_kib())
        time.sleep(0.01)
    return before, peak


def latency(servers: dict[str, RefServer], data: bytes, requests: int, rounds: int) -> dict[str, list[float]]:
    """Microseconds per request for each server, interleaved request by request."""
    conns = {name: Conn(s.port) for name, s in servers.items()}
    out: dict[str, list[float]] = {name: [] for name in servers}
    try:
        for c in conns.values():  # warm-up
            for _ in range(50):
                c.ask(data)
        for _ in range(rounds):
            for _ in range(requests):
                for name, c in conns.items():
                    t0 = time.perf_counter()
                    status = c.ask(data)
                    out[name].append((time.perf_counter() - t0) * 1e6)
                    assert status == 200, status
    finally:
        for c in conns.values():
            c.close()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--idle", type=int, default=1000)
    p.add_argument("--pushers", type=int, default=8)
    p.add_argument("--push-mib", type=int, default=32)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--write", action="store_true")
    args = p.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the client holds --idle sockets too
    flags = ("--keepalive-timeout", "600", "--eos-slope", "0")
    logs = Path(tempfile.mkdtemp(prefix="sluicegate-bench-conn-"))
    rows: list[str] = []
    with running(logs, *flags) as guarded, running(logs, *flags, "--plain-http") as plain:
        servers = {"guarded": guarded, "plain": plain}
        mem: dict[str, dict[str, tuple[int, int]]] = {}
        for name, s in servers.items():
            mem[name] = {"idle": idle_rss(s, args.idle), "push": push_rss(s, args.pushers, args.push_mib)}
            print(name, mem[name], flush=True)
        lat: dict[str, dict[str, list[float]]] = {}
        cases: dict[str, bytes] = {"GET /healthz": request("GET", "/healthz"),
                                   "POST /v1/generate (1 token)": request("POST", "/v1/generate", GENERATE)}
        for case, data in cases.items():
            lat[case] = latency(servers, data, args.requests, args.rounds)
            print(case, {k: round(median(v), 1) for k, v in lat[case].items()}, flush=True)
    rows.append(f"| server | RSS before | with {args.idle} idle connections | per connection | {args.pushers} "
                f"pushers x {args.push_mib} MiB header: peak RSS growth |")
    rows.append("| --- | --- | --- | --- | --- |")
    for name, m in mem.items():
        (b0, b1), (p0, p1) = m["idle"], m["push"]
        rows.append(f"| {name} | {b0 / 1024:.1f} MiB | {b1 / 1024:.1f} MiB | {(b1 - b0) / max(args.idle, 1):.1f} KiB "
                    f"| {(p1 - p0) / 1024:+.1f} MiB |")
    rows += ["", "| request | plain median / p99 (µs) | guarded median / p99 (µs) | added (median of pairs) |",
             "| --- | --- | --- | --- |"]
    for case, per in lat.items():
        added = median([g - q for g, q in zip(per["guarded"], per["plain"], strict=True)])
        rows.append(f"| {case} | {median(per['plain']):.0f} / {percentile(per['plain'], 0.99):.0f} | "
                    f"{median(per['guarded']):.0f} / {percentile(per['guarded'], 0.99):.0f} | {added:+.1f} µs |")
    text = "\n".join([
        HEADING, "",
        f"`bench/connections.py --idle {args.idle} --pushers {args.pushers} --push-mib {args.push_mib} "
        f"--requests {args.requests} --rounds {args.rounds}` on {platform.machine()}, Python "
        f"{platform.python_version()}: the reference server with the guarded protocol (what `serve` runs) and "
        "with uvicorn's own httptools protocol (`--plain-http`), side by side; method in the script's docstring.",
        "", *rows, ""])
    publish(HEADING, text, args.write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
