"""The served OpenAPI document against the committed snapshot (docs/openapi.json), and the gate's verdicts."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from sluicegate.api.app import create_app
from sluicegate.config import Config, LimitsConfig, ModelConfig
from sluicegate.contract import snapshot
from tests.conftest import make_client

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "docs" / "openapi.json"


@pytest.fixture(scope="module")
def served() -> dict[str, Any]:
    return snapshot.served_document()


def test_served_document_matches_the_snapshot(served: dict[str, Any]) -> None:
    """Fails on a breaking change without a major bump, and asks for `make openapi` on any other change."""
    verdict = snapshot.check(snapshot.load(SNAPSHOT), served)
    assert verdict.ok, verdict.message


def test_document_does_not_depend_on_model_or_config(served: dict[str, Any]) -> None:
    config = Config(model=ModelConfig(path=Path("/nonexistent.gguf"), name="other", version="v9", n_ctx=64,
                                      n_slots=1),
                    limits=LimitsConfig(max_body_bytes=10, max_new_tokens=3, estimate_new_tokens=1))

    def never() -> Any:
        raise AssertionError("producing the document must not load a model")

    doc = json.loads(json.dumps(create_app(config, never).openapi()))
    assert doc == served


def test_document_is_what_the_app_serves(served: dict[str, Any]) -> None:
    with make_client() as client:
        r = client.get("/openapi.json")
    assert r.status_code == 200
    assert r.json() == served


def test_dump_is_deterministic(served: dict[str, Any]) -> None:
    text = snapshot.dump(served)
    assert text == snapshot.dump(snapshot.served_document())
    assert text.endswith("}\n") and not text.endswith("\n\n")
    assert text.startswith('{\n  "components": {\n    "schemas": {\n')
    shuffled = dict(reversed(list(served.items())))
    assert snapshot.dump(shuffled) == text


def test_equal_documents_pass(served: dict[str, Any]) -> None:
    reordered = json.loads(json.dumps(served, sort_keys=True))
    verdict = snapshot.check(served, reordered)
    assert verdict.status == "equal" and verdict.ok and verdict.changes == ()


def test_response_field_type_change_is_breaking(served: dict[str, Any]) -> None:
    new = copy.deepcopy(served)
    new["components"]["schemas"]["Usage"]["properties"]["prompt_tokens"]["type"] = "string"
    verdict = snapshot.check(served, new)
    assert verdict.status == "breaking" and not verdict.ok
    paths = [c.path for c in verdict.breaking]
    assert "POST /v1/generate response 200 $.usage.prompt_tokens" in paths
    assert all(c.kind == "type_changed" for c in verdict.breaking)
    assert "POST /v1/generate response 200 $.usage.prompt_tokens" in verdict.message
    assert "major" in verdict.message


def test_new_finish_reason_is_breaking(served: dict[str, Any]) -> None:
    new = copy.deepcopy(served)
    new["components"]["schemas"]["GenerateResponse"]["properties"]["finish_reason"]["enum"].append("tool_calls")
    verdict = snapshot.check(served, new)
    assert verdict.status == "breaking"
    assert [(c.path, c.kind) for c in verdict.breaking] == [
        ("POST /v1/generate response 200 $.finish_reason", "enum_value_added")]


def test_breaking_change_with_major_bump_asks_for_refresh(served: dict[str, Any]) -> None:
    new = copy.deepcopy(served)
    new["components"]["schemas"]["Usage"]["properties"]["prompt_tokens"]["type"] = "string"
    major = int(served["info"]["version"].split(".")[0])
    new["info"]["version"] = f"{major + 1}.0.0"
    verdict = snapshot.check(served, new)
    assert verdict.status == "refresh" and verdict.breaking
    assert snapshot.REFRESH_COMMAND in verdict.message
    # a minor bump does not license a break
    new["info"]["version"] = f"{major}.99.0"
    assert snapshot.check(served, new).status == "breaking"


def test_new_optional_request_field_asks_for_refresh(served: dict[str, Any]) -> None:
    new = copy.deepcopy(served)
    new["components"]["schemas"]["GenerateRequest"]["properties"]["min_p"] = {
        "type": "number", "minimum": 0.0, "maximum": 1.0, "default": 0.0}
    verdict = snapshot.check(served, new)
    assert verdict.status == "refresh" and not verdict.ok
    assert not verdict.breaking
    assert [(c.path, c.kind) for c in verdict.changes] == [
        ("POST /v1/generate request $.min_p", "property_added")]
    assert "`make openapi`" in verdict.message


def test_description_edit_asks_for_refresh(served: dict[str, Any]) -> None:
    new = copy.deepcopy(served)
    new["components"]["schemas"]["GenerateRequest"]["properties"]["prompt"]["description"] = "reworded"
    verdict = snapshot.check(served, new)
    assert verdict.status == "refresh" and verdict.changes == ()
    assert "make openapi" in verdict.message


def test_cli_write_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             served: dict[str, Any]) -> None:
    path = tmp_path / "openapi.json"
    assert snapshot.main(["--write", str(path)]) == 0
    assert path.read_text(encoding="utf-8") == snapshot.dump(served)
    assert snapshot.main(["--check", str(path)]) == 0
    stale = copy.deepcopy(served)
    stale["components"]["schemas"]["GenerateResponse"]["properties"]["finish_reason"]["enum"].remove("cancelled")
    path.write_text(snapshot.dump(stale), encoding="utf-8")
    capsys.readouterr()
    assert snapshot.main(["--check", str(path)]) == 1
    assert "BREAKING" in capsys.readouterr().err
