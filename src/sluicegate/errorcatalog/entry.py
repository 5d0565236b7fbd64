"""One row of the error catalog."""

from __future__ import annotations

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
