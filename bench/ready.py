"""Time to ready and memory, side by side with llama.cpp's own llama-server, on the same GGUF and window.

    LLAMA_SERVER=.../llama-cpp-server .venv/bin/python bench/ready.py --rounds 3
    ... bench/ready.py --model gemma-3-270m-q4_k_m.gguf --chat-template-file tests/data/chat_templates/gemma-3.jinja

Each round starts sluicegate (as shipped) and llama-server (`-np SLOTS -t 2 --no-repack`, the same positions
per slot), one after the other, the first alternating: time from the process's start to its readiness probe's
first 200 (ours `/readyz`, llama-server `/health`), its RSS then (the whole process group's, from /proc), and
its RSS after 16 streaming chat requests at once (64 tokens each). Our ready time is then split into what the
log says each load stage took. Results print as the markdown table in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import free_port, fresh_data_dir, serve_command

PEER = Path("/work/peer-venv/bin")


def rss_mb(pid: int) -> float:
    """The RSS of `pid` and its children (llama-cpp-server is a wrapper), MB."""
    total = 0
    pids = [pid]
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        pids += [int(p) for p in f.read().split()]
    for p in pids:
        with open(f"/proc/{p}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 300.0) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return time.monotonic() - began
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{url} not ready in {timeout} s")


def burst(base: str, n: int, model: str | None) -> None:
    def one(i: int) -> None:
        body = {"max_tokens": 64, "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": f"Request {i}: tell me about rivers."}]}
        if model:
            body["model"] = model
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=600) as r:
            for _ in r.iter_lines():
                pass

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run(kind: str, args: argparse.Namespace, log: Path) -> tuple[float, float, float]:
    port = free_port()
    gguf = str(args.model) if args.model else None
    tmpl = str(args.chat_template_file) if args.chat_template_file else None
    if kind == "sluicegate":
        cmd = serve_command(port, "--data-dir", fresh_data_dir(), "--slots", str(args.slots), "--ctx", str(args.ctx),
                            "--threads", "2", *(["--model", gguf] if gguf else []),
                            *(["--chat-template-file", tmpl] if tmpl else []))
        probe = f"http://127.0.0.1:{port}/readyz"
    else:
        from sluicegate.backends.llama_cpp import default_model_path

        exe = os.environ.get("LLAMA_SERVER", str(PEER / "llama-cpp-server"))
        template = ["--jinja", "--chat-template-file", str(args.chat_template_file)] if args.chat_template_file else []
        cmd = [exe, "-m", gguf or str(default_model_path()), "--host", "127.0.0.1", "--port", str(port),
               "--ctx-size", str(args.ctx * args.slots), "--", "-np", str(args.slots), "-t", "2", "--no-repack",
               *template]
        probe = f"http://127.0.0.1:{port}/health"
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ready = wait_ready(probe, proc)
        at_ready = rss_mb(proc.pid)
        burst(f"http://127.0.0.1:{port}", 16, None)
        return ready, at_ready, rss_mb(proc.pid)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=1024, help="positions per slot, both servers")
    ap.add_argument("--model", type=Path, default=None, help="another GGUF (default: SmolLM2)")
    ap.add_argument("--chat-template-file", type=Path, default=None)
    ap.add_argument("--log", type=Path, default=Path("/tmp/sluicegate-bench-ready.log"))
    args = ap.parse_args()
    args.log.write_bytes(b"")
    found: dict[str, list[tuple[float, float, float]]] = {"sluicegate": [], "llama-server": []}
    for r in range(args.rounds):
        order = ["sluicegate", "llama-server"] if r % 2 == 0 else ["llama-server", "sluicegate"]
        for kind in order:
            found[kind].append(run(kind, args, args.log))
            print(kind, *(f"{x:.2f}" for x in found[kind][-1]), flush=True)
    print("\n| server | ready s (rounds) | RSS at ready MB | RSS after 16 streams MB |\n|---|---|---|---|")
    for kind, rows in found.items():
        ready = ", ".join(f"{x[0]:.1f}" for x in rows)
        print(f"| {kind} | {statistics.median(x[0] for x in rows):.1f} ({ready}) | "
              f"{statistics.median(x[1] for x in rows):.0f} | {statistics.median(x[2] for x in rows):.0f} |")


if __name__ == "__main__":
    main()
