"""`sluicegate probe URL`: send the probe suite to any running server and print a graded table.

    sluicegate probe http://127.0.0.1:8000 [--surface native] [--foreign] [--json | --markdown] [--timeout S]

Strict grading (our contract) is the default; `--foreign` grades a server with its own error shapes loosely
(status class, an error object with a message). Both columns are printed either way. Exit status: 0 when
every probe passed under the chosen grading, 1 otherwise, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from sluicegate.contract.probe_runner import Result, Totals, run_probes, totals
from sluicegate.contract.probes import ProbeOptions, all_probes, surfaces


def _discover_model(client: httpx.Client) -> str | None:
    """The served model's id from an OpenAI-style /v1/models, if the server has one."""
    try:
        resp = client.get("/v1/models")
        data = resp.json().get("data") if resp.status_code == 200 else None
        first = data[0] if isinstance(data, list) and data else None
        if isinstance(first, dict) and isinstance(first.get("id"), str):
            return str(first["id"])
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return None


def _mark(ok: bool) -> str:
    return "ok" if ok else "NO"


def _row(r: Result, strict: bool) -> list[str]:
    p = r.probe
    got = str(r.status) if r.status is not None else (r.transport_error or "none")
    etype = r.error_type or ("-" if not r.is_error else "?")
    if p.expect_type and r.error_type != p.expect_type:
        etype += " (!)"
    flags = []
    if r.silently_accepted:
        flags.append("SILENT")
    if r.echoed:
        flags.append("ECHO")
    if r.server_error:
        flags.append("5XX" if r.status else "NO ANSWER")
    flags += [f"check:{c}" for c in r.failed_checks]
    return [
        p.name,
        str(p.expect_status),
        got,
        etype[:28],
        _mark(r.envelope) if r.is_error else "-",
        _mark(r.loose_envelope) if r.is_error else "-",
        _mark(r.request_id),
        "pass" if r.passed(strict) else "FAIL",
        " ".join(flags),
    ]


HEADER = ["probe", "want", "got", "error type", "envelope", "loose", "req-id", "grade", "flags"]


def _summary(t: Totals, strict: bool) -> list[str]:
    classes = ", ".join(f"{k} {v}" for k, v in t.by_class.items())
    return [
        f"probes: {t.probes}; answers: {classes}",
        f"status as expected: {t.status_exact}/{t.probes}",
        f"errors in our envelope (type, code, message, param, request_id = X-Request-Id): "
        f"{t.envelope}/{t.errors}",
        f"errors with an error object and a message (loose): {t.loose_envelope}/{t.errors}",
        f"answers with X-Request-Id: {t.request_id}/{t.probes}",
        f"silently accepted (2xx for a request that should be refused): {t.silently_accepted}",
        f"echoed the input: {t.echoed}; failed extra checks: {t.failed_checks}",
        f"passed ({'strict' if strict else 'loose'} grading): "
        f"{t.passed_strict if strict else t.passed_loose}/{t.probes}",
    ]


def render_table(results: Sequence[Result], strict: bool) -> str:
    rows = [HEADER, *(_row(r, strict) for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([*lines, "", *_summary(totals(results), strict)])


def render_markdown(results: Sequence[Result], strict: bool) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in _row(r, strict)) + " |" for r in results]
    return "\n".join([*lines, "", *(f"- {s}" for s in _summary(totals(results), strict))])


def _cell(d: dict[str, Any] | None, strict: bool) -> str:
    if d is None:
        return "(not run)"
    got = str(d["status"]) if d["status"] is not None else str(d["transport_error"] or "no answer")
    etype = f" `{d['error_type'][:26]}`" if d["error_type"] else ""
    grade = "pass" if d["passed_strict" if strict else "passed_loose"] else "**FAIL**"
    flags = [f for f, on in (("SILENT", d["silently_accepted"]), ("ECHO", d["echoed"])) if on]
    return " ".join([got + etype, grade, *flags])


def render_side_by_side(docs: Sequence[dict[str, Any]]) -> str:
    """Several `--json` documents as one Markdown table, probe by probe (the union of the runs' probes)."""
    runs = [{r["name"]: r for r in d["results"]} for d in docs]
    names: list[str] = []
    for run in runs:
        names += [n for n in run if n not in names]
    head = ["probe", "want"] + [f"{d['url']} ({'strict' if d['strict'] else 'loose'})" for d in docs]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in names:
        ref = next(run[n] for run in runs if n in run)
        want = (
            f"{ref['expect_status']} `{ref['expect_type']}`"
            if ref["expect_type"]
            else str(ref["expect_status"])
        )
        row = [n, want, *(_cell(run.get(n), d["strict"]) for run, d in zip(runs, docs, strict=True))]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    return "\n".join(lines)


def main(argv: list[str], *, client: httpx.Client | None = None) -> int:
    """The `probe` command; `client` (tests) replaces the one made for the URL, and is left open."""
    parser = argparse.ArgumentParser(
        prog="sluicegate probe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("url", help="base URL of the server, e.g. http://127.0.0.1:8000")
    parser.add_argument(
        "--surface",
        action="append",
        default=None,
        help="only these surfaces' probes (repeatable; default: all of them)",
    )
    parser.add_argument(
        "--foreign", action="store_true", help="grade loosely: a server with its own error shape"
    )
    parser.add_argument(
        "--model", default=None, help="model name for bodies that need one (default: from /v1/models)"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per probe (default 30)")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the results and totals as JSON")
    out.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--list", action="store_true", help="list the probes and exit")
    parser.add_argument(
        "--compare-with",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="also print a side-by-side Markdown table with earlier runs' --json output (repeatable)",
    )
    args = parser.parse_args(argv)
    strict = not args.foreign
    own = client is None
    http = client or httpx.Client(base_url=args.url.rstrip("/"), timeout=args.timeout)
    try:
        model = args.model or _discover_model(http)
        try:
            probes = all_probes(ProbeOptions(model=model), args.surface)
        except ValueError as exc:
            print(f"sluicegate probe: {exc} (surfaces: {', '.join(surfaces())})", file=sys.stderr)
            return 2
        if args.list:
            for p in probes:
                print(f"{p.name:36} {p.method:6} {p.expect_status} {p.expect_type or '-':24} {p.note}")
            return 0
        results = run_probes(http, probes)
    finally:
        if own:
            http.close()
    t = totals(results)
    doc = {
        "url": args.url,
        "strict": strict,
        "totals": t.as_dict(),
        "results": [r.as_dict() for r in results],
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    elif args.markdown:
        print(render_markdown(results, strict))
    else:
        print(render_table(results, strict))
    if args.compare_with:
        print()
        print(render_side_by_side([doc, *(json.loads(f.read_text()) for f in args.compare_with)]))
    return 0 if (t.passed_strict if strict else t.passed_loose) == t.probes else 1
