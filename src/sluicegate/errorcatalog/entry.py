"""One row of the error catalog."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ErrorEntry:
    """An error `type`, or one of its `code`s, as docs/errors.md lists it.

    `status` is the HTTP status on the native routes: a number here, so every layer can read the catalog without
    importing HTTP machinery. `meaning` and `action` are one line each: what happened, what the caller should do.
    """

    type: str
    code: str | None  # None: the type's own entry
    status: int
    meaning: str
    action: str

    @property
    def anchor(self) -> str:
        """The entry's anchor in docs/errors.md: `type`, or `type-code` (names are `[a-z_]`, so `-` is unambiguous)."""
        return self.type if self.code is None else f"{self.type}-{self.code}"


def rows(table: str) -> Iterator[tuple[list[str], str, str]]:
    """The rows of a catalog table, each its key's words, its meaning and its action. A row is `KEY: meaning` at
    the start of a line, then `-> action` on an indented line; any other indented line continues the part above
    it, and a `#` line is a comment."""
    parts: list[list[str]] = []
    for line in table.splitlines():
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if not line[0].isspace():
            key, _, meaning = text.partition(": ")
            parts.append([key, meaning])
        elif text.startswith("-> "):
            parts[-1].append(text.removeprefix("-> "))
        else:
            parts[-1][-1] += " " + text
    for key, meaning, action in parts:
        yield key.split(), meaning, action
