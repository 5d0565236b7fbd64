"""`sluicegate keys` on the store the settings name: the store said, never created by a list, secrets imported."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from sluicegate.cli import main
from sluicegate.store.db import Store, default_url
from sluicegate.tenancy.keys import find_key, new_secret


def test_list_refuses_a_store_that_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "nowhere"
    assert main(["keys", "list", "--data-dir", str(data)]) == 2
    assert "no store at" in capsys.readouterr().err
    assert not data.exists()  # nothing created on the way


def test_create_says_which_store_and_the_file_and_environment_name_the_same_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sluicegate.toml").write_text('data_dir = "state"\n')
    monkeypatch.chdir(tmp_path / "..")
    assert main(["keys", "create", "--name", "a", "--config", str(tmp_path / "sluicegate.toml")]) == 0
    out, err = capsys.readouterr()
    assert f"store: sqlite:///{tmp_path / 'state' / 'sluicegate.db'} (new)" in err
    assert out.splitlines()[-1].startswith("sg_live_")
    monkeypatch.setenv("SLUICEGATE_DATA_DIR", str(tmp_path / "state"))
    assert main(["keys", "list"]) == 0
    assert " a\n" in capsys.readouterr().out + "\n"


@pytest.mark.parametrize("secret", [new_secret(), "vllm-9fQ2xLm7Rt4bKz8WcN1pHs6Yd3Ve0Ga5"])
def test_secret_stdin_imports_an_existing_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch, secret: str) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(secret + "\n"))
    assert main(["keys", "create", "--name", "imported", "--secret-stdin", "--data-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert secret not in out + err and "read from standard input" in out
    store = Store.open(default_url(tmp_path))
    try:
        found = find_key(store, secret)
        assert found is not None and found.name == "imported"
    finally:
        store.close()
    monkeypatch.setattr("sys.stdin", io.StringIO(secret + "\n"))  # the same secret twice is refused
    assert main(["keys", "create", "--name", "again", "--secret-stdin", "--data-dir", str(tmp_path)]) == 2
    assert "already a key" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["short", "sg_live_" + "A" * 49, "has spaces in it and is long enough"])
def test_secret_stdin_refuses_what_cannot_be_a_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(bad + "\n"))
    assert main(["keys", "create", "--name", "x", "--secret-stdin", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "neither a sluicegate key" in err and bad not in err
