"""Runnable examples in Markdown: find them, point them at a test server, run them, say what went wrong.

The convention (docs/versioning.md, "Examples are tested"):

- A fenced block tagged `sh` is a shell example. It runs under `bash -euo pipefail -c`, with `curl` wrapped to
  `curl -sS --fail-with-body`, so any HTTP error status fails it.
- A fenced block tagged `python` is a Python example. It runs as `python -c` with a timeout.
- Both talk to `http://127.0.0.1:8000`; the runner rewrites that address to the server under test.
- A comment line `# expect: 422` in an `sh` block declares the failure it demonstrates: every `curl` in the
  block must then answer that status (the body is printed, and the block still has to exit 0).
- Any other tag (`sh-notest`, `json`, `text`, none) is not run. A block that is not run but still names the
  server's address is a *stray* unless its tag ends in `-notest`: the checker reports it, so an example cannot
  escape the tests by a typo in its tag.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_ADDRESS", "RUNNABLE", "DocExampleError", "Example", "RunResult", "doc_paths", "extract",
    "extract_file", "rewrite", "run", "sh_script", "strays",
]

DEFAULT_ADDRESS = "127.0.0.1:8000"
RUNNABLE = ("sh", "python")
_ADDRESS_HINTS = (DEFAULT_ADDRESS, "localhost:8000")
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_EXPECT = re.compile(r"^\s*#\s*expect:\s*(?P<status>\S*)\s*$")


class DocExampleError(ValueError):
    """The Markdown breaks the convention: an unclosed fence, a malformed or misplaced `# expect:`."""


@dataclass(frozen=True)
class Example:
    source: str  # the file it came from, as given (e.g. "README.md")
    line: int  # 1-based line of the opening fence
    lang: str  # the info string's first word ("" when untagged)
    code: str
    expect: int | None = None  # the HTTP status an `sh` block declares with `# expect: NNN`

    @property
    def id(self) -> str:
        return f"{self.source}:{self.line}"

    @property
    def runnable(self) -> bool:
        return self.lang in RUNNABLE


def extract(text: str, source: str = "<string>") -> list[Example]:
    """Every fenced code block, in order; fences may be indented (inside list items)."""
    lines = text.splitlines()
    out: list[Example] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None or (m["fence"][0] == "`" and "`" in m["info"]):
            i += 1
            continue
        start, indent, fence = i, len(m["indent"]), m["fence"]
        lang = (m["info"].split() or [""])[0]
        body: list[str] = []
        i += 1
        while True:
            if i >= len(lines):
                raise DocExampleError(f"{source}:{start + 1}: the fenced block opened here is never closed")
            close = lines[i].strip()
            if close and set(close) == {fence[0]} and len(close) >= len(fence):
                break
            line = lines[i]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))):])
            i += 1
        i += 1
        code = "\n".join(body) + "\n"
        out.append(Example(source, start + 1, lang, code, _expect(code, lang, f"{source}:{start + 1}")))
    return out


def _expect(code: str, lang: str, where: str) -> int | None:
    found: list[int] = []
    if lang not in RUNNABLE:
        return None
    for line in code.splitlines():
        m = _EXPECT.match(line)
        if m is None:
            continue
        if lang != "sh":
            raise DocExampleError(f"{where}: `# expect:` applies to sh blocks only (a python block "
                                  "shows a failure by handling it)")
        if not re.fullmatch(r"[1-5]\d\d", m["status"]):
            raise DocExampleError(f"{where}: `# expect:` needs an HTTP status, e.g. `# expect: 422`")
        found.append(int(m["status"]))
    if len(found) > 1:
        raise DocExampleError(f"{where}: one `# expect:` line per block")
    return found[0] if found else None


def extract_file(path: Path, root: Path | None = None) -> list[Example]:
    source = str(path.relative_to(root)) if root is not None else str(path)
    return extract(path.read_text(encoding="utf-8"), source)


def doc_paths(root: Path) -> list[Path]:
    """The Markdown whose examples are tested: README.md and docs/*.md (those that exist)."""
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.is_file()]


def strays(examples: list[Example]) -> list[Example]:
    """Blocks that address the server but are not run, and do not say so with a `-notest` tag."""
    return [e for e in examples if not e.runnable and not e.lang.endswith("-notest")
            and any(h in e.code for h in _ADDRESS_HINTS)]


def rewrite(code: str, base_url: str) -> str:
    """Point an example at `base_url` (e.g. `http://127.0.0.1:41234`) instead of the documented address."""
    host = re.sub(r"^https?://", "", base_url).rstrip("/")
    return code.replace(f"http://{DEFAULT_ADDRESS}", base_url.rstrip("/")).replace(DEFAULT_ADDRESS, host)


def sh_script(example: Example, base_url: str, status_log: Path) -> str:
    """The block's code behind a `curl` wrapper that fails on HTTP errors and logs each status it gets."""
    fail = "" if example.expect is not None else " --fail-with-body"
    prelude = f"""curl() {{
  local body code rc=0
  body=$(mktemp)
  code=$(command curl -sS{fail} -o "$body" -w '%{{http_code}}' "$@") || rc=$?
  cat "$body"
  rm -f "$body"
  printf '%s\\n' "${{code:-000}}" >> {shlex.quote(str(status_log))}
  return "$rc"
}}
"""
    return prelude + rewrite(example.code, base_url)


@dataclass(frozen=True)
class RunResult:
    returncode: int
    stdout: str
    stderr: str
    statuses: tuple[int, ...]  # HTTP statuses the wrapped `curl` received, in order (sh blocks only)
    failure: str | None  # why the example failed, or None


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}  # no redirect, no real key
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])  # `sluicegate`
    for key in ("NO_PROXY", "no_proxy"):
        env[key] = ",".join(filter(None, [env.get(key), "127.0.0.1", "localhost"]))
    return env


def run(example: Example, base_url: str, *, cwd: Path, timeout: float = 120.0) -> RunResult:
    """Run one runnable example against the server at `base_url`, from `cwd` (the repository root)."""
    if not example.runnable:
        raise ValueError(f"{example.id}: a {example.lang or 'untagged'} block is not run")
    with tempfile.TemporaryDirectory(prefix="sluicegate-example-") as tmp:
        log = Path(tmp) / "statuses"
        log.touch()
        if example.lang == "sh":
            argv = ["bash", "-euo", "pipefail", "-c", sh_script(example, base_url, log)]
        else:
            argv = [sys.executable, "-c", rewrite(example.code, base_url)]
        try:
            proc = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
            return RunResult(-1, out, err, (), f"{example.id}: timed out after {timeout:g}s")
        statuses = tuple(int(s) for s in log.read_text().split() if s.isdigit())
    failure = None
    if proc.returncode != 0:
        failure = f"{example.id}: exit status {proc.returncode}"
    elif example.expect is not None and not statuses:
        failure = f"{example.id}: declares `# expect: {example.expect}` but made no curl request"
    elif example.expect is not None and any(s != example.expect for s in statuses):
        failure = f"{example.id}: expected HTTP {example.expect} from every curl, got {list(statuses)}"
    return RunResult(proc.returncode, proc.stdout, proc.stderr, statuses, failure)
