"""Every ```sh and ```python example in README.md and docs/*.md, run against the real server.

The convention is in docs/versioning.md ("Examples are tested") and sluicegate.contract.doc_examples.
Examples run from the repository root, so relative paths such as docs/openapi.json work.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import httpx
import pytest

from sluicegate.contract.doc_examples import DocExampleError, Example, doc_paths, extract_file, run
from sluicegate.contract.snapshot import served_document
from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _examples() -> list[Example]:
    out: list[Example] = []
    for path in doc_paths(ROOT):
        with contextlib.suppress(DocExampleError):  # tests/unit/test_doc_examples.py reports it
            out += [e for e in extract_file(path, ROOT) if e.runnable]
    return out


EXAMPLES = _examples()


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_example_runs(server: Server, example: Example) -> None:
    res = run(example, server.url, cwd=ROOT, timeout=120)
    assert res.failure is None, (
        f"{res.failure}\n--- code ---\n{example.code}--- stdout ---\n{res.stdout[-4000:]}\n"
        f"--- stderr ---\n{res.stderr[-4000:]}\n--- HTTP statuses --- {list(res.statuses)}")


def test_real_server_serves_the_snapshot_document(server: Server) -> None:
    """The snapshot's source (the reference-backend app) is what the server with the real model serves."""
    r = httpx.get(f"{server.url}/openapi.json", timeout=30)
    assert r.status_code == 200
    assert r.json() == served_document()
