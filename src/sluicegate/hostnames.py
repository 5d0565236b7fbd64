"""Host names as the operator writes them and as a `Host` header carries them: one normal spelling, and the
`--allowed-hosts` patterns. Plain functions with no HTTP in them, so settings validation (settings/types.py)
and the trusted-host middleware (api/middleware/trusted_host.py) share them without settings importing api/.
"""

from __future__ import annotations

import ipaddress
import re

_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")


def normal_host(name: str) -> str | None:
    """A host name or IP literal in one spelling (lower case, no trailing dot, IPv6 without brackets and
    compressed), or None when it is neither."""
    name = name.lower()
    if name.startswith("[") and name.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(name[1:-1]))
        except ValueError:
            return None
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    name = name[:-1] if name.endswith(".") else name
    if not name or len(name) > 253 or not all(_LABEL.match(label) for label in name.split(".")):
        return None
    return name


def parse_pattern(text: str) -> str:
    """One `--allowed-hosts` entry, normalised: `*` (any host), `*.example.com` (its subdomains), or a name
    or IP address (`[::1]` and `::1` alike). Raises ValueError for anything else."""
    text = text.strip()
    if text == "*":
        return text
    if text.startswith("*."):
        rest = normal_host(text[2:])
        if rest is None or ":" in rest:
            raise ValueError(f"not a host pattern: {text!r}")
        return "*." + rest
    name = normal_host(text)
    if name is None:
        raise ValueError(f"not a host name or IP address: {text!r}")
    return name
