"""`sluicegate jobs submit | watch | results | cancel`: an HTTP client of a running server (unlike `keys`, which
works on the store).

    sluicegate jobs submit FILE.jsonl [--watch]    # prints the job's id
    sluicegate jobs watch ID                        # done/total, rate, ETA, until the job ends
    sluicegate jobs results ID -o FILE
    sluicegate jobs cancel ID

`--url` (default http://127.0.0.1:8000); the API key from `--key` or `SLUICEGATE_API_KEY`. FILE's first line
picks the shape: OpenAI batch lines (`custom_id`, `method`, `url`, `body`) are uploaded to `/v1/files` and run
as a `/v1/batches` job on the line's `url`; prediction requests are streamed to `/v1/batch-predictions`. Both
shapes' ids start with `batch_`; `watch`, `results` and `cancel` find the job under either.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from sluicegate.cli.types import positive_seconds

SEED = "/v1/batch-predictions"
FINAL = {"succeeded", "failed", "cancelled", "completed", "expired"}


class JobsError(Exception):
    pass


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    jobs = sub.add_parser("jobs", help="batch jobs on a running server (submit, watch, results, cancel)")
    jsub = jobs.add_subparsers(dest="jobs_command", required=True)
    submit = jsub.add_parser("submit", help="submit a JSONL file as a job; prints its id")
    submit.add_argument("file", type=Path, metavar="FILE.jsonl")
    submit.add_argument("--watch", action="store_true", help="then show its progress until it ends")
    watch = jsub.add_parser("watch", help="show a job's progress (done/total, rate, ETA) until it ends")
    watch.add_argument("job_id", metavar="ID")
    results = jsub.add_parser("results", help="download a job's results as JSONL")
    results.add_argument("job_id", metavar="ID")
    results.add_argument("-o", "--output", type=Path, required=True, metavar="FILE",
                         help="where to write them (an OpenAI batch's error file goes to FILE.errors.jsonl)")
    cancel = jsub.add_parser("cancel", help="cancel a job: running items abort, the rest never start")
    cancel.add_argument("job_id", metavar="ID")
    for p in (submit, watch, results, cancel):
        p.add_argument("--url", default=os.environ.get("SLUICEGATE_URL", "http://127.0.0.1:8000"),
                       help="the server (default http://127.0.0.1:8000, or SLUICEGATE_URL)")
        p.add_argument("--key", default=None, help="API key (default: the SLUICEGATE_API_KEY variable)")
        p.add_argument("--interval", type=positive_seconds, default=1.0, help=argparse.SUPPRESS)


def _client(args: argparse.Namespace) -> httpx.Client:
    key = args.key or os.environ.get("SLUICEGATE_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=args.url.rstrip("/"), headers=headers, timeout=httpx.Timeout(60, connect=10))


def _ok(r: httpx.Response) -> dict[str, Any]:
    if r.status_code >= 400:
        try:
            err = r.json()["error"]
            raise JobsError(f"{r.status_code} {err.get('type')}: {err.get('message')}")
        except (ValueError, KeyError, TypeError):
            raise JobsError(f"HTTP {r.status_code}") from None
    body: dict[str, Any] = r.json()
    return body


def _first_line(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    obj = json.loads(raw)
                except ValueError:
                    raise JobsError(f"{path}: the first line is not JSON") from None
                return obj if isinstance(obj, dict) else {}
    raise JobsError(f"{path}: the file has no line")


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as f:
        while data := f.read(1 << 16):
            yield data


def submit(c: httpx.Client, path: Path) -> str:
    first = _first_line(path)
    if {"custom_id", "url", "body"} <= first.keys():
        with path.open("rb") as f:
            uploaded = _ok(c.post("/v1/files", files={"file": (path.name, f)}, data={"purpose": "batch"}))
        batch = _ok(c.post("/v1/batches", json={"input_file_id": uploaded["id"], "endpoint": first["url"],
                                                "completion_window": "24h"}))
        if batch["status"] == "failed":
            errs = (batch.get("errors") or {}).get("data") or []
            lines = "; ".join(f"line {e.get('line')}: {e.get('message')}" for e in errs[:5])
            raise JobsError(f"the batch failed validation: {lines}")
        return str(batch["id"])
    job = _ok(c.post(SEED, content=_chunks(path), headers={"Content-Type": "application/jsonl"}))
    return str(job["id"])


def _status(c: httpx.Client, job_id: str) -> tuple[str, dict[str, Any]]:
    """("seed" | "openai", the job) for an id of either shape."""
    r = c.get(f"{SEED}/{job_id}")
    if r.status_code != 404:
        return "seed", _ok(r)
    return "openai", _ok(c.get(f"/v1/batches/{job_id}"))


def progress(shape: str, job: dict[str, Any]) -> tuple[int, int, int]:
    """(done, total, failed) of either shape."""
    if shape == "seed":
        p = job["progress"]
        return int(p["done"]), int(p["total"]), int(p["failed"])
    rc = job.get("request_counts") or {}
    return int(rc.get("completed", 0)) + int(rc.get("failed", 0)), int(rc.get("total", 0)), int(rc.get("failed", 0))


def watch(c: httpx.Client, job_id: str, interval: float = 1.0) -> str:
    """Print a progress line until the job ends; returns its final status."""
    start = time.monotonic()
    first_done: int | None = None
    tty = sys.stderr.isatty()
    while True:
        shape, job = _status(c, job_id)
        done, total, failed = progress(shape, job)
        first_done = done if first_done is None else first_done
        elapsed = time.monotonic() - start
        rate = (done - first_done) / elapsed if elapsed > 0 else 0.0
        eta = job.get("eta_seconds")
        if eta is None and rate > 0:
            eta = (total - done) / rate
        width = 30
        filled = width * done // total if total else 0
        line = (f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} ({failed} failed) {rate:.1f}/s "
                f"ETA {'-' if eta is None else f'{eta:.0f}s'} {job['status']}")
        print(("\r" if tty else "") + line, end="" if tty else "\n", file=sys.stderr, flush=True)
        if job["status"] in FINAL:
            if tty:
                print(file=sys.stderr)
            return str(job["status"])
        time.sleep(interval)


def _download(c: httpx.Client, path: str, out: Path) -> int:
    n = 0
    with c.stream("GET", path) as r, out.open("wb") as f:
        if r.status_code >= 400:
            r.read()
            _ok(r)
        for data in r.iter_bytes():
            f.write(data)
            n += data.count(b"\n")
    return n


def results(c: httpx.Client, job_id: str, out: Path) -> int:
    shape, job = _status(c, job_id)
    if shape == "seed":
        return _download(c, f"{SEED}/{job_id}/results.jsonl", out)
    n = 0
    if job.get("output_file_id"):
        n += _download(c, f"/v1/files/{job['output_file_id']}/content", out)
    else:
        out.write_bytes(b"")
    if job.get("error_file_id"):
        n += _download(c, f"/v1/files/{job['error_file_id']}/content", out.with_suffix(out.suffix + ".errors.jsonl"))
    if job["status"] not in FINAL:
        print(f"the job is {job['status']}: results so far", file=sys.stderr)
    return n


def cancel(c: httpx.Client, job_id: str) -> str:
    shape, _job = _status(c, job_id)
    r = c.delete(f"{SEED}/{job_id}") if shape == "seed" else c.post(f"/v1/batches/{job_id}/cancel")
    return str(_ok(r)["status"])


def run(args: argparse.Namespace) -> int:
    try:
        with _client(args) as c:
            if args.jobs_command == "submit":
                job_id = submit(c, args.file)
                print(job_id)
                if args.watch:
                    return 0 if watch(c, job_id, args.interval) in ("succeeded", "completed") else 1
            elif args.jobs_command == "watch":
                return 0 if watch(c, args.job_id, args.interval) in ("succeeded", "completed") else 1
            elif args.jobs_command == "results":
                n = results(c, args.job_id, args.output)
                print(f"{n} lines written to {args.output}", file=sys.stderr)
            else:
                print(cancel(c, args.job_id))
    except JobsError as exc:
        print(f"sluicegate jobs: {exc}", file=sys.stderr)
        return 1
    except httpx.HTTPError as exc:
        print(f"sluicegate jobs: cannot reach {args.url}: {type(exc).__name__}", file=sys.stderr)
        return 1
    return 0
