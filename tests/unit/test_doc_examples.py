"""The example extractor and runner (no model needed); the repository's docs against the convention."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sluicegate.contract.doc_examples import (
    DocExampleError,
    Example,
    doc_paths,
    extract,
    extract_file,
    rewrite,
    run,
    strays,
)

ROOT = Path(__file__).resolve().parents[2]

MARKDOWN = """\
# Title

Inline `curl http://127.0.0.1:8000/healthz` is prose, not an example.

```sh
curl http://127.0.0.1:8000/healthz
```

```python
import httpx
print(httpx.get("http://127.0.0.1:8000/healthz").json())
```

```json
{"id": "req_1", "finish_reason": "length"}
```

```sh-notest
curl http://127.0.0.1:8000/v1/generate -d @big.json
```

1. In a list:

   ```sh
   # expect: 422
   curl http://127.0.0.1:8000/v1/generate \\
     -H 'Content-Type: application/json' -d '{"prompt": ""}'
   ```

````text
```sh
not a block of its own
```
````

~~~
curl http://localhost:8000/healthz
~~~
"""


def test_extract_finds_every_fenced_block_in_order() -> None:
    blocks = extract(MARKDOWN, "doc.md")
    assert [(b.lang, b.line) for b in blocks] == [
        ("sh", 5), ("python", 9), ("json", 14), ("sh-notest", 18), ("sh", 24), ("text", 30), ("", 36)]
    sh, py, _, _, listed, text, _ = blocks
    assert sh.code == "curl http://127.0.0.1:8000/healthz\n"
    assert sh.id == "doc.md:5" and sh.runnable and sh.expect is None
    assert py.code.startswith("import httpx\n") and py.runnable
    assert listed.expect == 422 and listed.runnable
    assert listed.code.startswith("# expect: 422\ncurl ")  # the list item's indent is removed
    assert text.code == "```sh\nnot a block of its own\n```\n" and not text.runnable


def test_only_sh_and_python_blocks_run() -> None:
    assert [b.lang for b in extract(MARKDOWN) if b.runnable] == ["sh", "python", "sh"]


def test_strays_are_unrun_blocks_that_address_the_server() -> None:
    assert [(b.lang, b.line) for b in strays(extract(MARKDOWN))] == [("", 36)]
    assert strays(extract("```bash\ncurl -sS http://127.0.0.1:8000/readyz\n```\n"))[0].lang == "bash"
    assert strays(extract("```sh-notest\ncurl http://127.0.0.1:8000/\n```\n")) == []


@pytest.mark.parametrize(("text", "needle"), [
    ("```sh\ncurl x\n", "never closed"),
    ("```sh\n# expect: 42\ncurl x\n```\n", "needs an HTTP status"),
    ("```sh\n# expect: 422\n# expect: 400\ncurl x\n```\n", "one `# expect:`"),
    ("```python\n# expect: 400\nprint(1)\n```\n", "sh blocks only"),
])
def test_convention_errors_are_reported_with_their_line(text: str, needle: str) -> None:
    with pytest.raises(DocExampleError, match=r"doc\.md:1") as info:
        extract(text, "doc.md")
    assert needle in str(info.value)


def test_expect_in_an_unrun_block_is_ignored() -> None:
    assert extract("```sh-notest\n# expect: 422\n```\n")[0].expect is None


def test_rewrite_points_examples_at_the_test_server() -> None:
    code = "curl http://127.0.0.1:8000/v1/generate\nOpenAI(base_url='http://127.0.0.1:8000/v1')\nhost=127.0.0.1:8000\n"
    assert rewrite(code, "http://127.0.0.1:41234") == (
        "curl http://127.0.0.1:41234/v1/generate\nOpenAI(base_url='http://127.0.0.1:41234/v1')\n"
        "host=127.0.0.1:41234\n")


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = 200 if self.path == "/ok" else 422
        body = json.dumps({"status": status}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def tiny_server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def _sh(code: str) -> Example:
    return extract(f"```sh\n{code}```\n", "doc.md")[0]


def test_runner_passes_ok_and_fails_on_http_errors(tiny_server: str) -> None:
    ok = run(_sh("curl http://127.0.0.1:8000/ok | grep -q 200\n"), tiny_server, cwd=ROOT)
    assert ok.failure is None and ok.statuses == (200,)
    bad = run(_sh("curl http://127.0.0.1:8000/bad\n"), tiny_server, cwd=ROOT)
    assert bad.failure == "doc.md:1: exit status 22"
    assert bad.statuses == (422,) and '"status": 422' in bad.stdout  # --fail-with-body still prints it


def test_runner_checks_a_declared_failure(tiny_server: str) -> None:
    declared = run(_sh("# expect: 422\ncurl http://127.0.0.1:8000/bad\n"), tiny_server, cwd=ROOT)
    assert declared.failure is None and '"status": 422' in declared.stdout
    wrong = run(_sh("# expect: 422\ncurl http://127.0.0.1:8000/ok\n"), tiny_server, cwd=ROOT)
    assert wrong.failure == "doc.md:1: expected HTTP 422 from every curl, got [200]"
    none = run(_sh("# expect: 422\ntrue\n"), tiny_server, cwd=ROOT)
    assert none.failure is not None and "made no curl request" in none.failure


def test_runner_runs_python_with_a_timeout(tiny_server: str) -> None:
    block = extract('```python\nimport httpx\nassert httpx.get("http://127.0.0.1:8000/ok").json()'
                    ' == {"status": 200}\n```\n', "doc.md")[0]
    assert run(block, tiny_server, cwd=ROOT).failure is None
    slow = extract("```python\nimport time\ntime.sleep(5)\n```\n", "doc.md")[0]
    assert run(slow, tiny_server, cwd=ROOT, timeout=0.5).failure == "doc.md:1: timed out after 0.5s"


def test_sh_examples_fail_fast() -> None:
    res = run(_sh("false\necho unreachable\n"), "http://127.0.0.1:9", cwd=ROOT)
    assert res.failure == "doc.md:1: exit status 1" and "unreachable" not in res.stdout


# The repository's own docs.

def test_readme_has_runnable_examples() -> None:
    """Without this, an empty README would pass the examples gate vacuously."""
    readme = ROOT / "README.md"
    assert readme.is_file(), "README.md is missing"
    runnable = [b for b in extract_file(readme, ROOT) if b.runnable]
    assert runnable, "README.md has no ```sh or ```python example; the examples gate would pass vacuously"


def test_docs_follow_the_example_convention() -> None:
    blocks = [b for path in doc_paths(ROOT) for b in extract_file(path, ROOT)]  # raises on a broken block
    stray = strays(blocks)
    assert not stray, ("blocks that address the server but are not run; tag them ```sh or ```python "
                       "(or ```sh-notest to opt out): " + ", ".join(f"{b.id} ({b.lang or 'untagged'})"
                                                               for b in stray))
