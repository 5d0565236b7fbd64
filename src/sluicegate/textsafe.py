"""Text a client controls, made safe for a line of a log or a terminal.

A control character in a request path (`%0a` decodes to a newline), a header value or a key's name would
otherwise reach a text log or `keys list` raw: a newline forges a log line of its own, a carriage return or an
escape sequence rewrites what a terminal shows, and a bidirectional override reorders it. `escape` writes each
such character as a visible escape (`\\n`, `\\r`, `\\t`, `\\x1b`, `\\u202e`); `has_controls` says whether a
text holds any (key names refuse them).

The characters: every C0 and C1 control and DEL (Unicode category Cc), the line and paragraph separators
(U+2028, U+2029, which some viewers break lines at) and the bidirectional formatting characters (U+200E,
U+200F, U+202A-U+202E, U+2066-U+2069).
"""

from __future__ import annotations

import re

_BIDI = "\u200e\u200f\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f\u2028\u2029{_BIDI}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_one(m: re.Match[str]) -> str:
    c = m.group(0)
    if c in _NAMED:
        return _NAMED[c]
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def escape(text: str) -> str:
    """`text` on one line: every control, separator or bidirectional formatting character escaped."""
    return _UNSAFE.sub(_escape_one, text)


def has_controls(text: str) -> bool:
    """Whether `text` holds a character `escape` would escape."""
    return _UNSAFE.search(text) is not None


__all__ = ["escape", "has_controls"]
