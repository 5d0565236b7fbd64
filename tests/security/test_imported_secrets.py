"""An imported secret must be one nobody can guess: repeats, sequences and words are refused (zxcvbn's
estimate), random secrets of the documented lengths pass."""

from __future__ import annotations

import io
import secrets
import string
from pathlib import Path

import pytest

from sluicegate.cli import main
from sluicegate.store.db import Store, default_url
from sluicegate.store.migrate import upgrade
from sluicegate.tenancy.keys import InvalidKeyField, create_key

WEAK = ["a" * 24, "abcdefghijklmnopqrstuvwx", "password1234password1234", "qwertyuiopasdfghjklzxcvb",
        "0123456789012345678901234", "Tr0ub4dor&3Tr0ub4dor&3xx", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab"]


@pytest.mark.parametrize("secret", WEAK)
def test_a_guessable_secret_is_refused(secret: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(secret + "\n"))
    assert main(["keys", "create", "--name", "imported", "--secret-stdin", "--data-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "guessable" in err and secret not in err


def test_random_secrets_pass(tmp_path: Path) -> None:
    url = default_url(tmp_path)
    upgrade(url)
    store = Store.open(url)
    alphabet = string.ascii_letters + string.digits
    try:
        for i in range(40):  # hex of 96 bits scores lowest of the usual forms: all must pass
            for secret in (secrets.token_hex(12), "".join(secrets.choice(alphabet) for _ in range(24)),
                           "sk-" + secrets.token_urlsafe(36)):
                create_key(store, f"k{i}", secret=secret)
        with pytest.raises(InvalidKeyField) as refused:
            create_key(store, "weak", secret="x" * 30)
        assert refused.value.code == "weak_secret" and refused.value.param == "secret"
    finally:
        store.close()
