"""The error catalog (src/sluicegate/errorcatalog/) against the source that emits errors and the document that
publishes it (docs/errors.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sluicegate import errorcatalog as catalog
from sluicegate.contract import errors_doc
from sluicegate.serving.errors import STATUS, ApiError
from tests.unit import error_scan

NAME = re.compile(r"^[a-z][a-z0-9_]*$")
DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


@pytest.fixture(scope="module")
def emitted() -> error_scan.Scan:
    return error_scan.scan()


def test_the_scan_follows_every_path_an_error_code_takes(emitted: error_scan.Scan) -> None:
    assert emitted.unknown == [], "error sites the scan cannot follow: name their carrier in error_scan.ATTRIBUTES"
    # one pair for each way a code reaches the envelope, so a scan that lost one fails here, not silently
    assert {
        ("invalid_request", "unsupported_parameter"),  # a literal in ApiError(...)
        ("invalid_json", "duplicate_key"),  # a helper's positional parameter (strict_json._invalid)
        ("invalid_api_key", "malformed_api_key"),  # another module's helper of the same name (auth._invalid)
        ("invalid_request", "invalid_combination"),  # a helper's default (openai_chat's bad())
        ("invalid_request", "not_allowed"),  # a module-level dict's values (validation._CODES)
        ("invalid_request", "wrong_type"),  # that lookup's default
        ("deadline_too_short", "first_token"),  # a conditional
        ("invalid_request", "unsupported_role"),  # a carrier class: FieldRefusal
        ("invalid_request", "url_unresolvable"),  # UnsafeUrl
        ("overloaded", "queue_full"),  # EngineOverloaded's default
        ("upstream_timeout", None),  # a type from a carrier: UpstreamFailure
        ("internal_error", "item_failed"),  # an envelope written as a dict (jobs/worker.py)
    } <= emitted.pairs


def test_every_code_the_source_emits_is_in_the_catalog(emitted: error_scan.Scan) -> None:
    missing = sorted(f"{t} / {c}" for t, c in emitted.pairs
                     if t not in catalog.TYPES or (c is not None and c != t and (t, c) not in catalog.CODES))
    assert missing == [], f"add these to src/sluicegate/errorcatalog/ (and run `make errors-doc`): {missing}"


def test_every_catalog_entry_is_emitted_somewhere(emitted: error_scan.Scan) -> None:
    """A code nothing sends any more leaves the catalog (and the document) with it."""
    stale = sorted(f"{t} / {c}" for (t, c) in catalog.CODES if (t, c) not in emitted.pairs)
    assert stale == []
    assert sorted(catalog.TYPES) == sorted({t for t, _ in emitted.pairs})


def test_entries_are_well_formed() -> None:
    anchors = [e.anchor for e in catalog.ENTRIES]
    assert len(anchors) == len(set(anchors)) == len(catalog.TYPES) + len(catalog.CODES)
    for e in catalog.ENTRIES:
        assert NAME.match(e.type) and (e.code is None or NAME.match(e.code)), e
        assert e.code != e.type, f"{e.type}: a code equal to its type is the type's own entry"
        assert e.status == catalog.TYPES[e.type].status, e
        assert e.meaning and e.action and "\n" not in e.meaning + e.action, e
        assert "|" not in e.meaning + e.action, f"{e.anchor}: `|` would break the document's table"


def test_lookup_and_address() -> None:
    assert catalog.entry("invalid_json", "too_deep").anchor == "invalid_json-too_deep"
    assert catalog.entry("invalid_json", None) is catalog.TYPES["invalid_json"]
    assert catalog.entry("body_too_large", "body_too_large") is catalog.TYPES["body_too_large"]
    assert catalog.entry("not_found", "no_such_code") is catalog.TYPES["not_found"]
    assert catalog.docs_url("invalid_request", "unknown_field") == (
        f"{catalog.DEFAULT_DOCS_URL}#invalid_request-unknown_field")


def test_statuses_come_from_the_catalog() -> None:
    assert dict(STATUS) == {t: e.status for t, e in catalog.TYPES.items()}
    assert ApiError("request_exceeds_capacity", "x").status == 413


def test_the_scan_reports_a_code_it_cannot_follow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "m.py").write_text(
        "def f(exc):\n    raise ApiError('invalid_request', 'x', code=exc.reason)\n"
        "def g(why):\n    raise ApiError('invalid_request', 'x', code='brand_new' if why else None)\n")
    monkeypatch.setattr(error_scan, "SRC", tmp_path)
    found = error_scan.scan()
    assert found.unknown == ["m.py:2: code=attr:exc.reason"]
    assert found.pairs == {("invalid_request", "brand_new"), ("invalid_request", None)}


def test_every_entry_has_its_anchor_in_the_document() -> None:
    anchors = errors_doc.anchors(DOC.read_text())
    missing = [e.anchor for e in catalog.ENTRIES if e.anchor not in anchors]
    assert missing == [], f"docs/errors.md lacks these anchors; run `{errors_doc.REFRESH_COMMAND}`: {missing}"
    assert "every-code" in anchors  # the section the envelope fields' description links to


def test_the_documents_catalog_is_the_rendered_catalog() -> None:
    text = DOC.read_text()
    assert errors_doc.splice(text, errors_doc.render()) == text, f"run `{errors_doc.REFRESH_COMMAND}`"
    assert errors_doc.main(["--check", str(DOC)]) == 0


def test_a_stale_document_is_caught(tmp_path: Path) -> None:
    stale = tmp_path / "errors.md"
    stale.write_text(DOC.read_text().replace('<a name="invalid_json-too_deep"></a>', ""))
    assert "invalid_json-too_deep" not in errors_doc.anchors(stale.read_text())
    assert errors_doc.main(["--check", str(stale)]) == 1
    assert errors_doc.main(["--write", str(stale)]) == 0
    assert stale.read_text() == DOC.read_text()
    with pytest.raises(ValueError, match="no catalog section"):
        errors_doc.splice("# Errors\n", errors_doc.render())


def test_the_hand_written_type_table_lists_the_catalogs_types() -> None:
    """docs/errors.md's "Every error type" table (the long form, with examples) has the catalog's types and
    statuses, no more and no fewer."""
    text = DOC.read_text()
    table = text[text.index("## Every error type"):text.index("## Every code")]
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| (\d{3}) \|", table, re.M))
    assert {t: int(s) for t, s in rows.items()} == dict(catalog.STATUS)
