"""The probe suite against the in-process app (reference backend), and the grader against bad servers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sluicegate.contract.probe_cli import main as probe_main
from sluicegate.contract.probe_cli import render_markdown, render_table
from sluicegate.contract.probe_runner import Result, run_probe, run_probes, totals
from sluicegate.contract.probes import (
    MARKER,
    Probe,
    ProbeOptions,
    Target,
    all_probes,
    json_body_probes,
    register,
    surfaces,
)
from tests.conftest import make_client, wait_ready


@pytest.fixture(scope="module")
def results() -> Iterator[list[Result]]:
    with make_client() as c:
        wait_ready(c)
        yield run_probes(c, all_probes(ProbeOptions(model="reference")))


def test_the_suite_is_big_and_covers_the_awkward_cases() -> None:
    probes = all_probes()
    assert len(probes) >= 40
    names = {p.name.split(":", 1)[1] for p in probes}
    for case in (
        "not_json",
        "empty_body",
        "json_array",
        "content_type_text",
        "tokens_as_string",
        "nan_literal",
        "misspelt_field",
        "unknown_model",
        "huge_prompt_cjk",
        "huge_prompt_emoji",
        "ok_emoji",
        "lone_surrogate",
        "ok_nul",
        "deep_nesting_100k",
        "body_declared_100mb",
        "body_chunked_8mb",
        "get_generate",
        "unknown_path",
        "duplicate_keys",
    ):
        assert case in names
    assert sum(p.refuses for p in probes) >= 40


def test_no_5xx(results: list[Result]) -> None:
    assert [r.probe.name for r in results if r.server_error] == []


def test_every_status_and_type_as_the_contract_says(results: list[Result]) -> None:
    wrong = [
        (r.probe.name, r.probe.expect_status, r.status, r.probe.expect_type, r.error_type)
        for r in results
        if not (r.status_ok and r.type_ok)
    ]
    assert wrong == []


def test_every_error_in_the_envelope_with_the_request_id(results: list[Result]) -> None:
    errors = [r for r in results if r.is_error]
    assert len(errors) >= 40
    assert [r.probe.name for r in errors if not r.envelope] == []
    assert all(r.request_id for r in results)


def test_zero_silent_acceptances_and_no_echo(results: list[Result]) -> None:
    assert [r.probe.name for r in results if r.silently_accepted] == []
    assert [r.probe.name for r in results if r.echoed] == []
    assert [(r.probe.name, r.failed_checks) for r in results if r.failed_checks] == []
    t = totals(results)
    assert t.passed_strict == t.probes


def test_ineffective_combinations_carry_a_warning(results: list[Result]) -> None:
    by_name = {r.probe.name: r for r in results}
    assert by_name["native:top_k_at_temp0"].warnings == [
        "top_k has no effect at temperature 0 (greedy decoding)"
    ]
    assert by_name["native:seed_at_temp0"].warnings == [
        "seed has no effect at temperature 0 (greedy decoding)"
    ]
    assert by_name["native:ok"].warnings == []


def test_table_and_markdown_render_totals(results: list[Result]) -> None:
    table = render_table(results, strict=True)
    assert "silently accepted (2xx for a request that should be refused): 0" in table
    assert f"passed (strict grading): {len(results)}/{len(results)}" in table
    md = render_markdown(results, strict=True)
    assert sum(line.startswith("| ") for line in md.splitlines()) == len(results) + 1  # header + rows


# -- the grader must catch a bad server -----------------------------------------------------------------


def _bad_server(request: httpx.Request) -> httpx.Response:
    """Accepts anything, echoes the body, has no envelope and no request id; 500 on /v1/nope."""
    if request.url.path == "/v1/nope":
        return httpx.Response(500, text="Traceback: boom")
    body = request.read()
    if request.method == "POST" and request.url.path == "/v1/generate" and body.startswith(b"{"):
        return httpx.Response(200, content=b'{"text": "' + body[:200].replace(b'"', b"'") + b'"}')
    if request.method == "POST":
        return httpx.Response(400, json={"detail": body[:100].decode("latin-1")})
    return httpx.Response(200, json={"ok": True})


def test_the_grader_catches_silence_echo_missing_envelope_and_5xx() -> None:
    with httpx.Client(transport=httpx.MockTransport(_bad_server), base_url="http://bad") as c:
        results = run_probes(c, all_probes(only=["http", "native"]))
    by_name = {r.probe.name: r for r in results}
    assert by_name["native:tokens_as_string"].silently_accepted
    assert by_name["native:unknown_field"].echoed  # MARKER came back inside a 2xx
    assert by_name["native:not_json"].echoed and not by_name["native:not_json"].loose_envelope
    assert by_name["http:unknown_path_post"].server_error
    assert not by_name["http:request_id_echo"].passed(strict=True)
    assert by_name["http:request_id_echo"].failed_checks == ["echo_request_id"]
    assert not by_name["native:top_k_at_temp0"].passed(strict=False)  # no warning: not silently fine
    t = totals(results)
    assert t.silently_accepted > 20 and t.envelope == 0 and t.passed_strict < 5


def test_loose_grading_accepts_a_foreign_error_shape() -> None:
    def foreign(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            400, json={"error": {"code": 400, "message": "bad", "type": "invalid_request_error"}}
        )

    probe = Probe("x:bad", "POST", "/v1/x", b"{", expect_status=400, expect_type="invalid_json")
    with httpx.Client(transport=httpx.MockTransport(foreign), base_url="http://f") as c:
        r = run_probe(c, probe)
    assert r.passed(strict=False) and not r.passed(strict=True)
    assert r.loose_envelope and not r.envelope and r.error_type == "invalid_request_error"


def test_no_answer_is_graded_as_a_failure() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with httpx.Client(transport=httpx.MockTransport(down), base_url="http://down") as c:
        r = run_probe(c, Probe("x:any", "GET", "/healthz", expect_status=200))
    assert r.status is None and r.transport_error == "ConnectError" and r.server_error and not r.passed(False)


# -- extending the suite ----------------------------------------------------------------------------------


def test_a_second_module_can_register_a_surface() -> None:
    target = Target(
        "extra", "/v1/completions", {"model": "m", "prompt": "Hi", "max_tokens": 1}, tokens="max_tokens"
    )
    register(
        "extra",
        lambda opts: [
            *json_body_probes(target)[:3],
            Probe("extra:custom", "GET", "/v1/models", expect_status=200),
        ],
    )
    try:
        assert "extra" in surfaces()
        probes = all_probes(only=["extra"])
        assert [p.name for p in probes][-1] == "extra:custom"
        body = json.loads(probes[0].body) if isinstance(probes[0].body, bytes) else None
        assert body == {"model": "m", "prompt": "Hi", "max_tokens": 1}
        with pytest.raises(ValueError, match="no probes for surface"):
            all_probes(only=["nope"])
    finally:
        from sluicegate.contract import probes as mod

        mod._PROVIDERS.pop("extra")


def test_target_builds_nested_prompts_and_raw_members() -> None:
    chat = Target(
        "chat",
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "x"}]},
        tokens="max_tokens",
        prompt=("messages", 0, "content"),
    )
    assert chat.body("hello")["messages"][0]["content"] == "hello"
    raw = chat.with_members('"max_tokens": NaN')
    assert raw.endswith(b', "max_tokens": NaN}')
    assert MARKER.encode() in next(p for p in json_body_probes(chat) if p.name == "chat:unknown_field").body  # type: ignore[operator]


def test_cli_against_the_in_process_app(capsys: pytest.CaptureFixture[str]) -> None:
    with make_client() as c:
        wait_ready(c)
        rc = probe_main(["http://127.0.0.1", "--surface", "http", "--json"], client=c)
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["totals"]["probes"] == len(all_probes(only=["http"]))
    assert out["totals"]["silently_accepted"] == 0


def test_cli_usage_errors_and_listing(capsys: pytest.CaptureFixture[str]) -> None:
    def never(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404)

    with httpx.Client(transport=httpx.MockTransport(never), base_url="http://x") as c:
        assert probe_main(["http://x", "--surface", "nope"], client=c) == 2
        assert probe_main(["http://x", "--list"], client=c) == 0
    out = capsys.readouterr()
    assert "no probes for surface" in out.err
    assert "native:nan_literal" in out.out


def test_side_by_side_with_an_earlier_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    def foreign(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz" and request.method == "GET":
            return httpx.Response(200, json={"status": "ok"})
        return httpx.Response(404, text="File Not Found")

    with httpx.Client(transport=httpx.MockTransport(foreign), base_url="http://peer") as c:
        assert probe_main(["http://peer", "--surface", "http", "--foreign", "--json"], client=c) == 1
    peer = tmp_path / "peer.json"
    peer.write_text(capsys.readouterr().out)
    with make_client() as c:
        wait_ready(c)
        rc = probe_main(["http://ours", "--surface", "http", "--compare-with", str(peer)], client=c)
    assert rc == 0
    table = capsys.readouterr().out.split("\n\n")[-1]
    rows = [line for line in table.splitlines() if line.startswith("| http:")]
    assert len(rows) == len(all_probes(only=["http"]))
    get_generate = next(r for r in rows if r.startswith("| http:get_generate |"))
    assert get_generate.endswith("| 405 `method_not_allowed` pass | 404 **FAIL** |")
