"""Every log record is one line in every format: a client that puts a line break, an escape or a bidirectional
override in a path cannot write a line that looks like a record of its own; a key's name cannot hold one, and
`keys list` escapes any an older store holds."""

from __future__ import annotations

import io
import logging
import re
import sys
from pathlib import Path

import httpx
import pytest

from sluicegate.cli import main
from sluicegate.store.db import Store, default_url
from sluicegate.store.migrate import upgrade
from sluicegate.store.models import ApiKey
from sluicegate.telemetry.logs import TextFormatter
from sluicegate.tenancy.keys import InvalidKeyField, create_key
from sluicegate.testing.refserver import running

FORGED = "2026-12-07 12:00:01,000 WARNING sluicegate.auth: key_deadbeef revoked"
RECORD = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3} [A-Z]+ [\w.]+: ")


def _lines_are_records(text: str) -> None:
    for line in text.splitlines():
        assert RECORD.match(line) or line.startswith("  | ") or not line.strip(), f"a line no record wrote: {line!r}"
    assert not any(line.startswith(FORGED) for line in text.splitlines())


def test_a_path_cannot_forge_a_line_of_the_text_log(tmp_path: Path) -> None:
    forged = FORGED.replace(" ", "%20")
    with running(tmp_path, "--log-format", "text", "--log-level", "info") as server:
        for path in (f"/v1/x%0a{forged}", f"/v1/x%0d%0a{forged}", "/v1/x%1b[2J%e2%80%ae", f"/healthz%0a{forged}"):
            r = httpx.get(server.url + path, timeout=30)
            assert r.status_code == 404, path
        r = httpx.post(f"{server.url}/v1/generate%0a{forged}", json={"prompt": "x"}, timeout=30)
        assert r.status_code in (404, 405)
    text = server.log()
    _lines_are_records(text)
    assert "GET /v1/x\\n2026-12-07" in text and "\\x1b[2J\\u202e" in text  # shown, escaped, on its own line


def test_a_traceback_follows_its_record_on_marked_lines() -> None:
    fmt = TextFormatter()
    try:
        raise ValueError(f"a message a client chose\n{FORGED}")
    except ValueError:
        record = logging.LogRecord("sluicegate.errors", logging.ERROR, __file__, 1, "failed on %s", (f"x\n{FORGED}",),
                                   sys.exc_info())
    out = fmt.format(record)
    _lines_are_records(out)
    first, *rest = out.splitlines()
    assert first.endswith(f"failed on x\\n{FORGED}") and rest and all(line.startswith("  | ") for line in rest)


@pytest.mark.parametrize("name", ["a\nb", "row\r\nkey_x  sg_live_  active", "\x1b[31mred", "bidi\u202eevil", "x\u2028y",
                                  "nul\x00", "del\x7f", "c1\x85"])
def test_a_key_name_with_a_control_character_is_refused(name: str, tmp_path: Path) -> None:
    url = default_url(tmp_path)
    upgrade(url)
    store = Store.open(url)
    try:
        with pytest.raises(InvalidKeyField) as refused:
            create_key(store, name)
        assert refused.value.param == "name" and refused.value.code == "invalid_name"
    finally:
        store.close()


def test_keys_list_escapes_a_name_an_older_store_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    url = default_url(tmp_path)
    upgrade(url)
    store = Store.open(url)
    try:
        record, _ = create_key(store, "plain")
        with store.session() as s, s.begin():  # as a store written before names were checked holds it
            s.get(ApiKey, record.id).name = "ok\nkey_forged  sg_live_zzzz...  active  \x1b[2Jgenerate"  # type: ignore[union-attr]
    finally:
        store.close()
    assert main(["keys", "list", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1 and "\x1b" not in out and "ok\\nkey_forged" in out and "\\x1b[2J" in out
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["keys", "create", "--name", "bad\nname", "--data-dir", str(tmp_path)]) == 2
    assert "control characters" in capsys.readouterr().err
