"""API keys: the format, the hash the store keeps, and creating, finding, listing and revoking them.

Format: `sg_live_` + 43 base62 characters (32 random bytes, 256 bits) + 6 base62 characters of CRC32 over
everything before them, 57 characters in all, matching `sg_live_[0-9A-Za-z]{49}`. GitHub's `ghp_` design:
the fixed prefix lets secret scanners find a leaked key, and the checksum lets them (and this server) tell a
key from a lookalike, so a mistyped or truncated key is refused without a database lookup.

Storage: only the SHA-256 of the whole key and the first `PREFIX_CHARS` characters of its random part (to
find the row by an index, and to let an operator recognise a key in `keys list`). With 256 random bits a
single fast hash is the right one: a slow password hash would add latency and no security, since nobody can
guess such a key. The found row's hash is compared with `hmac.compare_digest`, in constant time.

Imported secrets (`keys create --secret-stdin`): an existing secret clients already hold for another server, of
`IMPORTED_MIN` to `IMPORTED_MAX` visible ASCII characters. It must be random (a single hash is right only for
secrets nobody can guess), and `create_key` checks it: zxcvbn (Dropbox's strength estimator, which finds
repeats, sequences, keyboard walks, dates and dictionary words) must estimate at least 10^`IMPORTED_MIN_GUESSES_LOG10`
guesses for it: random strings of 24 characters score 20 and more (hex, 96 bits) and 22 and more (base62), while
repeats, sequences and words score under 17 (`aaaa...` 2.5, `abcd...` 2.0, `password1234password1234` 4.4). It is
stored the same way, its lookup prefix being `#` and the first 7 hex digits of its hash, so it too is found by
one indexed query and nothing of it is shown.

Names are 1 to 200 characters without control characters (sluicegate/textsafe.py), so a name cannot forge a
line of `keys list` or a log. Expiry is at most `MAX_EXPIRY` (9999-12-31, the last day a timestamp holds).

Granting (`check_grant`): a key that creates or changes keys over HTTP (the `admin` scope) cannot make one
wider than itself: no scope it does not hold, no expiry later than its own (so, when it expires, no key
without one); its own expiry can be brought forward, never lifted. An expired or revoked key cannot change:
an expired one is not revived, a new one is created instead. The command line (`sluicegate keys`) is the
operator's and grants anything.

Synchronous SQLAlchemy: call from a thread when on the event loop (tenancy/key_cache.py does).
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import hmac
import re
import secrets
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

from sqlalchemy import exists, select, update

from sluicegate.store.db import Store
from sluicegate.store.models import ApiKey
from sluicegate.textsafe import has_controls

PREFIX = "sg_live_"
ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
RANDOM_BYTES = 32
RANDOM_CHARS = 43  # 62**43 > 2**256
CHECK_CHARS = 6  # 62**6 > 2**32
KEY_LENGTH = len(PREFIX) + RANDOM_CHARS + CHECK_CHARS
PREFIX_CHARS = 8  # stored, indexed and shown: 62**8 makes a collision between two keys vanishingly rare
KEY_PATTERN = re.compile(rf"^{PREFIX}[0-9A-Za-z]{{{RANDOM_CHARS + CHECK_CHARS}}}$")
IMPORTED_MIN, IMPORTED_MAX = 24, 256  # an imported secret's length, in visible ASCII characters
IMPORTED_MIN_GUESSES_LOG10 = 18  # zxcvbn's estimate for an imported secret (~60 bits); see the module doc
NAME_MAX = 200
MAX_EXPIRY = dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC)
_IMPORTED = re.compile(rf"^[\x21-\x7e]{{{IMPORTED_MIN},{IMPORTED_MAX}}}$")


class Scope(enum.StrEnum):
    GENERATE = "generate"  # generate, chat, completions, predictions
    BATCH = "batch"  # batch jobs and files
    ADMIN = "admin"  # everyone's usage, and keys over HTTP (/v1/admin/keys)
    METRICS = "metrics"  # /metrics


ALL_SCOPES = frozenset(Scope)
DEFAULT_SCOPES = frozenset({Scope.GENERATE})


def _base62(n: int, width: int) -> str:
    out = []
    for _ in range(width):
        n, r = divmod(n, 62)
        out.append(ALPHABET[r])
    assert n == 0, "value wider than the field"
    return "".join(reversed(out))


def _checksum(body: str) -> str:
    return _base62(zlib.crc32(body.encode("ascii")), CHECK_CHARS)


def new_secret() -> str:
    """A fresh key: the prefix, 32 random bytes in base62, and the checksum of both."""
    body = PREFIX + _base62(int.from_bytes(secrets.token_bytes(RANDOM_BYTES), "big"), RANDOM_CHARS)
    return body + _checksum(body)


def well_formed(secret: str) -> bool:
    """Prefix, length, alphabet and checksum: what can be checked without the store."""
    if len(secret) != KEY_LENGTH or not KEY_PATTERN.match(secret):
        return False
    body, check = secret[:-CHECK_CHARS], secret[-CHECK_CHARS:]
    return hmac.compare_digest(_checksum(body), check)


def importable(secret: str) -> bool:
    """A secret from elsewhere that may be imported (and so may be looked up): not one of ours (those carry a
    checksum), 24 to 256 visible ASCII characters."""
    return not secret.startswith(PREFIX) and bool(_IMPORTED.match(secret))


def acceptable(secret: str) -> bool:
    """Whether a presented secret is worth a lookup: a well-formed key of ours, or an importable one."""
    return well_formed(secret) or importable(secret)


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def lookup_prefix(secret: str) -> str:
    if secret.startswith(PREFIX):
        return secret[len(PREFIX):len(PREFIX) + PREFIX_CHARS]
    return "#" + secret_hash(secret)[:PREFIX_CHARS - 1]


def new_key_id() -> str:
    return "key_" + secrets.token_hex(12)


def parse_scopes(names: Iterable[str]) -> frozenset[Scope]:
    """Scopes by name; an unknown name raises ValueError naming the accepted ones."""
    out = set()
    for name in names:
        try:
            out.add(Scope(name))
        except ValueError:
            raise ValueError(f"unknown scope {name!r}; the scopes are {', '.join(s.value for s in Scope)}") from None
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A key as the server sees it: never the secret."""

    id: str
    name: str
    prefix: str
    scopes: frozenset[Scope]
    tpm: int | None
    burst: int | None
    created_at: dt.datetime
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None
    rpm: int | None = None  # requests per minute, beside the tokens
    max_concurrent: int | None = None  # requests in flight at once
    monthly_tokens: int | None = None  # tokens per calendar month (UTC)

    @classmethod
    def of(cls, row: ApiKey) -> KeyRecord:
        return cls(row.id, row.name, row.prefix, parse_scopes(row.scopes.split()), row.tpm, row.burst,
                   row.created_at, row.expires_at, row.revoked_at, row.rpm, row.max_concurrent, row.monthly_tokens)

    @property
    def display_prefix(self) -> str:
        """How `keys list` shows the key: its lookup prefix (an imported one's: `imported#` and hash digits)."""
        return f"imported{self.prefix}" if self.prefix.startswith("#") else f"{PREFIX}{self.prefix}"

    def state(self, now: dt.datetime | None = None) -> str:
        """`active`, `revoked` or `expired`."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= (now or dt.datetime.now(dt.UTC)):
            return "expired"
        return "active"

    def usable(self, now: dt.datetime | None = None) -> bool:
        return self.state(now) == "active"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def create_key(
    store: Store,
    name: str,
    scopes: Iterable[Scope] = DEFAULT_SCOPES,
    *,
    tpm: int | None = None,
    burst: int | None = None,
    expires_in: dt.timedelta | None = None,
    secret: str | None = None,
    rpm: int | None = None,
    max_concurrent: int | None = None,
    monthly_tokens: int | None = None,
    expires_at: dt.datetime | None = None,
    grantor: KeyRecord | None = None,
) -> tuple[KeyRecord, str]:
    """Create a key; returns its record and the secret, which exists nowhere else from now on. `secret`: import
    this one (a sluicegate key, or an importable one) instead of making one; one already stored is refused.
    `grantor`: the key asking for it over HTTP, which the new key may not be wider than (`check_grant`)."""
    check_name(name)
    check_limits(tpm=tpm, burst=burst, rpm=rpm, max_concurrent=max_concurrent, monthly_tokens=monthly_tokens)
    if expires_in is not None:
        if expires_in <= dt.timedelta(0):
            raise InvalidKeyField("expires_in", "invalid_value", "a key's lifetime must be positive")
        if expires_in > MAX_EXPIRY - _now():
            raise InvalidKeyField("expires_in", "invalid_value", "a key's lifetime ends at 9999-12-31 at the latest")
        expires_at = _now() + expires_in
    check_expiry(expires_at)
    scope_set = frozenset(Scope(s) for s in scopes)
    if not scope_set:
        raise ValueError("a key needs at least one scope")
    check_grant(grantor, scope_set, expires_at, sets_expiry=True)
    if secret is not None and not acceptable(secret):
        raise ValueError(f"the secret to import is neither a sluicegate key ({PREFIX}..., its checksum intact) nor "
                         f"{IMPORTED_MIN} to {IMPORTED_MAX} visible ASCII characters")
    if secret is not None and importable(secret):
        check_imported(secret)
    if secret is not None and find_key(store, secret) is not None:
        raise ValueError("that secret is already a key in this store")
    secret = secret if secret is not None else new_secret()
    now = _now()
    row = ApiKey(
        id=new_key_id(), name=name, prefix=lookup_prefix(secret), secret_hash=secret_hash(secret),
        scopes=" ".join(sorted(scope_set)), tpm=tpm, burst=burst, created_at=now,
        expires_at=expires_at, revoked_at=None,
        rpm=rpm, max_concurrent=max_concurrent, monthly_tokens=monthly_tokens,
    )
    with store.session() as s, s.begin():
        s.add(row)
    return KeyRecord.of(row), secret


LIMITS = ("tpm", "burst", "rpm", "max_concurrent", "monthly_tokens")  # a key's own limits; None: the default
CHANGEABLE = frozenset({"name", "scopes", "expires_at", *LIMITS})


class InvalidKeyField(ValueError):
    """A field of a key that cannot be taken; `param` names it, `code` says why."""

    def __init__(self, param: str, code: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class NotGranted(InvalidKeyField):
    """A key asked to create or change a key wider than itself (`check_grant`); `param` names the field."""

    def __init__(self, param: str, code: str, message: str) -> None:  # its own: the error scan reads its codes
        super().__init__(param, code, message)


def check_name(name: str) -> None:
    if not name or len(name) > NAME_MAX:
        raise InvalidKeyField("name", "invalid_value", f"a key's name is 1 to {NAME_MAX} characters")
    if has_controls(name):
        raise InvalidKeyField("name", "invalid_name", "a key's name must not contain control characters (line "
                              "breaks, escapes, bidirectional overrides)")


def check_expiry(at: dt.datetime | None) -> None:
    if at is None:
        return
    if at > MAX_EXPIRY:
        raise InvalidKeyField("expires_at", "invalid_value", "expires_at is at most 9999-12-31T23:59:59Z")
    if at <= _now():
        raise InvalidKeyField("expires_at", "expires_in_past", "expires_at must be in the future")


def check_imported(secret: str) -> None:
    """An imported secret must be one nobody can guess (zxcvbn's estimate; the module's docstring)."""
    from zxcvbn import zxcvbn

    guesses = float(zxcvbn(secret[:72])["guesses_log10"])  # zxcvbn reads at most 72 characters
    if guesses < IMPORTED_MIN_GUESSES_LOG10:
        raise InvalidKeyField("secret", "weak_secret", f"the secret to import is guessable (about 10^{guesses:.0f} "
                              f"guesses; at least 10^{IMPORTED_MIN_GUESSES_LOG10} needed): repeats, sequences "
                              "or words. Import only random secrets, or let sluicegate make the key")


def check_grant(grantor: KeyRecord | None, scopes: Iterable[Scope] | None, expires_at: dt.datetime | None,
                *, sets_expiry: bool) -> None:
    """A key (`grantor`, None when auth is off or on the command line) creating a key, or changing one, to hold
    `scopes` (None: unchanged) and, when `sets_expiry`, to expire at `expires_at` (None: never). NotGranted when
    that is wider than the grantor itself."""
    if grantor is None:
        return
    if scopes is not None and (extra := frozenset(scopes) - grantor.scopes):
        raise NotGranted("scopes", "scope_not_held", f"this API key cannot grant a scope it does not hold "
                         f"({', '.join(sorted(extra))})")
    if sets_expiry and grantor.expires_at is not None and (expires_at is None or expires_at > grantor.expires_at):
        raise NotGranted("expires_at", "expiry_not_held", "this API key expires, so a key it creates or changes "
                         "must expire no later than it does: send expires_at at or before "
                         f"{grantor.expires_at.isoformat(timespec='seconds').replace('+00:00', 'Z')}")


def check_limits(**limits: int | None) -> None:
    for label, value in limits.items():
        if value is not None and value <= 0:
            raise InvalidKeyField(label, "invalid_value", f"{label} must be a positive whole number")


class KeyRevoked(ValueError):
    """A revoked key cannot change."""


class KeyExpired(ValueError):
    """An expired key cannot change (it is not revived: a new key is created instead)."""


def update_key(store: Store, key_id: str, changes: dict[str, object], *,
               grantor: KeyRecord | None = None) -> KeyRecord | None:
    """Change a key's name, scopes, limits (None: back to the server's default) or expiry (None: never); only
    the fields in `changes`, and no wider than `grantor` (`check_grant`; None: anything). A revoked or expired
    key cannot change. None: no such key; ValueError: a bad value."""
    unknown = changes.keys() - CHANGEABLE
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]} cannot be changed")
    asked = changes.get("scopes")
    scopes = None if asked is None else frozenset(Scope(str(x)) for x in cast(Iterable[object], asked))
    expiry = changes.get("expires_at")
    check_grant(grantor, scopes, expiry if isinstance(expiry, dt.datetime) else None,
                sets_expiry="expires_at" in changes)
    values: dict[str, object] = {}
    for field, value in changes.items():
        if field == "name":
            assert isinstance(value, str)
            check_name(value)
        elif field == "scopes":
            assert isinstance(value, frozenset | set | list | tuple)
            scope_set = frozenset(Scope(s) for s in value)
            if not scope_set:
                raise ValueError("a key needs at least one scope")
            value = " ".join(sorted(scope_set))
        elif field == "expires_at":
            assert value is None or isinstance(value, dt.datetime)
            check_expiry(value)
        else:
            assert value is None or isinstance(value, int)
            check_limits(**{field: value})
        values[field] = value
    with store.session() as s, s.begin():
        row = s.get(ApiKey, key_id)
        if row is None:
            return None
        if row.revoked_at is not None:
            raise KeyRevoked("a revoked key cannot change")
        if KeyRecord.of(row).state() == "expired":
            raise KeyExpired("an expired key cannot change; create a new key instead")
        if values:
            s.execute(update(ApiKey).where(ApiKey.id == key_id).values(**values))
            s.expire(row)
            row = s.get(ApiKey, key_id)
            assert row is not None
        return KeyRecord.of(row)


def find_key(store: Store, secret: str) -> KeyRecord | None:
    """The key this secret belongs to (revoked and expired ones too), or None. Malformed: None, no query."""
    if not acceptable(secret):
        return None
    digest = secret_hash(secret)
    with store.session() as s:
        rows = s.scalars(select(ApiKey).where(ApiKey.prefix == lookup_prefix(secret))).all()
    found = None
    for row in rows:  # one row, but compare every candidate the same way
        if hmac.compare_digest(row.secret_hash, digest):
            found = row
    return None if found is None else KeyRecord.of(found)


def get_key(store: Store, key_id: str) -> KeyRecord | None:
    with store.session() as s:
        row = s.get(ApiKey, key_id)
    return None if row is None else KeyRecord.of(row)


def list_keys(store: Store) -> list[KeyRecord]:
    with store.session() as s:
        rows = s.scalars(select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)).all()
    return [KeyRecord.of(r) for r in rows]


def revoke_key(store: Store, key_id: str) -> KeyRecord | None:
    """Revoke a key (a second revocation keeps the first time); None when there is no such key."""
    with store.session() as s, s.begin():
        s.execute(update(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None)).values(revoked_at=_now()))
        row = s.get(ApiKey, key_id)
        return None if row is None else KeyRecord.of(row)


def any_keys(store: Store) -> bool:
    """Whether the store holds any key at all, revoked ones included: once it has, auth stays on."""
    with store.session() as s:
        return bool(s.scalar(select(exists().where(ApiKey.id.is_not(None)))))


__all__ = [
    "ALL_SCOPES",
    "DEFAULT_SCOPES",
    "KEY_LENGTH",
    "KEY_PATTERN",
    "MAX_EXPIRY",
    "PREFIX",
    "InvalidKeyField",
    "KeyExpired",
    "KeyRecord",
    "KeyRevoked",
    "NotGranted",
    "Scope",
    "acceptable",
    "any_keys",
    "check_grant",
    "create_key",
    "find_key",
    "get_key",
    "importable",
    "list_keys",
    "lookup_prefix",
    "new_secret",
    "parse_scopes",
    "revoke_key",
    "secret_hash",
    "well_formed",
]
