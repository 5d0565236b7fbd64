"""One redaction for every secret-bearing value: how a database URL, a Redis URL, an upstream URL or a key is
shown in `config show`, an error message or a log line.

The rule is the parser's that really uses the value, widened where parsers disagree:

- A database URL is read by SQLAlchemy's `make_url`, which takes everything between the user's `:` and the
  first `@` as the password (so `/`, `?`, `#` and `:` may sit in it unescaped). `database_url` shows it through
  `make_url` with the password and every query value masked; a URL `make_url` cannot read is masked whole.
- Any other URL (Redis, an upstream, a webhook): parsers disagree on where the user information ends
  (`urllib.parse` and httpx stop at the first `/`, `?` or `#`; SQLAlchemy and redis-py's older forms do not),
  so `url` masks everything between `://` and the *last* `@` of the whole value (the user name too: a token
  is often sent as one, `https://TOKEN@host`). Where an `@` follows a `?` or `#`, no reading tells a password
  holding `?` from a query holding `@`: everything after `://` is masked. That over-masks a URL whose
  path holds an `@`, never under-masks a password, whatever characters it holds. The query is masked as well
  (`?password=...` is a common form), the fragment dropped.
- `urls_in` applies the URL rule to every URL inside a longer message (an exception's text).

Hand-written: no library redacts a URL by the rules of more than one parser; this is those rules, nothing more.
"""

from __future__ import annotations

import re

MASK = "***"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
# a URL inside free text: a scheme, then anything up to whitespace or a quote
_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+")


def url(value: str) -> str:
    """A URL as it may be shown: `scheme://***@host:port/path?***`; not a URL at all: `***`."""
    head = _SCHEME.match(value)
    if head is None:
        return MASK
    scheme, rest = head.group(0), value[head.end():]
    mark = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=-1)
    if mark >= 0 and "@" in rest[mark:]:
        return scheme + MASK
    user = ""
    if "@" in rest:  # user information, a token alone (https://TOKEN@host) included: masked whole
        rest = rest.rsplit("@", 1)[1]
        user = MASK + "@"
    rest = rest.split("#", 1)[0]  # after the user information: a `#` may sit in a password
    hostpath, query, _ = rest.partition("?")
    return scheme + user + hostpath + (f"?{MASK}" if query else "")


def database_url(value: str) -> str:
    """A SQLAlchemy URL as it may be shown: through `make_url` (the parser that opens the connection), its
    password and query values masked; one it cannot read: `***`."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(value)
        host = parsed.host
        if host is not None and "@" in host:
            # SQLAlchemy ends the password at the first `@` and reads the rest as the host: its writer meant the
            # password to run to the last `@`
            host = MASK + "@" + host.rsplit("@", 1)[1]
        parsed = parsed.set(host=host, query={k: MASK for k in parsed.query})
        shown = parsed.render_as_string(hide_password=True)
    except (ArgumentError, ValueError, TypeError):
        return MASK
    if parsed.username is not None and not _plain(parsed.username):
        shown = shown.replace(parsed.username, MASK, 1)
    return shown.replace("%2A%2A%2A", MASK)


def urls_in(text: str) -> str:
    """`text` with every URL in it redacted by the URL rule (`url`)."""
    return _IN_TEXT.sub(lambda m: url(m.group(0)), text)


def _plain(name: str) -> bool:
    """A user name that may be shown: short, printable ASCII, nothing a parser could take for a separator."""
    return len(name) <= 64 and all(c.isalnum() or c in "-_." for c in name) and name.isascii()


__all__ = ["MASK", "database_url", "url", "urls_in"]
