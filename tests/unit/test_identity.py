from __future__ import annotations

import hashlib
import json
from pathlib import Path

from sluicegate.backends.identity import file_digest, slug


def test_digest_is_sha256_and_cached_by_size_and_mtime(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"weights" * 1000)
    cache = tmp_path / "cache.json"
    d = file_digest(f, cache)
    assert d == "sha256:" + hashlib.sha256(b"weights" * 1000).hexdigest()
    # a cached value is used while size and mtime are unchanged (prove it by planting a marker)
    data = json.loads(cache.read_text())
    key = next(iter(data))
    cache.write_text(json.dumps({key: "sha256:planted"}))
    assert file_digest(f, cache) == "sha256:planted"
    # a changed file is hashed again
    f.write_bytes(b"other weights")
    assert file_digest(f, cache) == "sha256:" + hashlib.sha256(b"other weights").hexdigest()


def test_slug() -> None:
    assert slug("SmolLM2 135M Instruct") == "smollm2-135m-instruct"
    assert slug("  ") == "model"
