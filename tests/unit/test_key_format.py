"""The API key format: recognisable prefix, 256 random bits in base62, a CRC32 checksum that refuses typos."""

from __future__ import annotations

import re

import pytest

from sluicegate.tenancy.keys import (
    KEY_LENGTH,
    KEY_PATTERN,
    PREFIX,
    Scope,
    lookup_prefix,
    new_secret,
    parse_scopes,
    secret_hash,
    well_formed,
)


def test_a_new_key_has_the_documented_shape() -> None:
    key = new_secret()
    assert len(key) == KEY_LENGTH == 57
    assert re.fullmatch(r"sg_live_[0-9A-Za-z]{49}", key)
    assert KEY_PATTERN.match(key) and well_formed(key)
    assert lookup_prefix(key) == key[len(PREFIX):len(PREFIX) + 8]


def test_keys_are_distinct_and_use_the_whole_alphabet() -> None:
    keys = [new_secret() for _ in range(300)]
    assert len(set(keys)) == len(keys)
    alphabet = set("".join(k[len(PREFIX):] for k in keys))
    assert len(alphabet) == 62  # digits, upper and lower case all occur


def test_every_single_character_change_is_refused() -> None:
    key = new_secret()
    for i in range(len(PREFIX), len(key)):
        for c in "0aZ":
            if key[i] != c:
                assert not well_formed(key[:i] + c + key[i + 1:]), i


@pytest.mark.parametrize("mangle", [
    lambda k: k[:-1],  # truncated
    lambda k: k + "0",  # too long
    lambda k: "sg_test_" + k[len(PREFIX):],  # another prefix
    lambda k: k.replace("sg_live_", "SG_LIVE_"),
    lambda k: k[:20] + "-" + k[21:],  # not base62
    lambda k: k[:20] + "é" + k[21:],
    lambda k: " " + k[1:],
    lambda k: "",
])
def test_malformed_keys_are_refused_without_a_store(mangle: object) -> None:
    assert callable(mangle)
    assert not well_formed(mangle(new_secret()))


def test_the_hash_is_sha256_hex_of_the_whole_key() -> None:
    key = new_secret()
    digest = secret_hash(key)
    assert re.fullmatch(r"[0-9a-f]{64}", digest) and key not in digest
    assert digest != secret_hash(new_secret())


def test_scopes() -> None:
    assert parse_scopes(["generate", "metrics", "generate"]) == {Scope.GENERATE, Scope.METRICS}
    with pytest.raises(ValueError, match="generate, batch, admin, metrics"):
        parse_scopes(["root"])
