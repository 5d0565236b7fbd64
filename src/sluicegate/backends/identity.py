"""Model identity: the SHA-256 of the weights file, computed once and cached by path, size and mtime."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

_CACHE = Path(os.environ.get("SLUICEGATE_CACHE_DIR", Path.home() / ".cache" / "sluicegate")) / "digests.json"


def file_digest(path: Path, cache_file: Path = _CACHE) -> str:
    """`sha256:<hex>` of the file; reuses a cached value while the file's size and mtime are unchanged."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    try:
        cache: dict[str, str] = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    if key in cache:
        return cache[key]
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    digest = f"sha256:{h.hexdigest()}"
    cache[key] = digest
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache))
        tmp.replace(cache_file)
    except OSError:
        pass  # a read-only home only costs a re-hash next time
    return digest


def slug(text: str) -> str:
    """A model name fit for `name@version` addressing: lowercase letters, digits, '.', '_' and '-'."""
    s = re.sub(r"[^a-z0-9._-]+", "-", text.strip().lower()).strip("-")
    return s or "model"
