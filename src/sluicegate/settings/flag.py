"""`Flag`: what a setting is on the command line, in the environment and in the TOML file, kept beside its type.

Every field of the settings model carries one in its `Annotated` metadata: the value type (settings/types.py)
that checks the value from any source, and how the flag looks (`metavar`), whether the value is a secret
(redacted by `config show`, also read from a `SLUICEGATE_<NAME>_FILE` file), and whether it is a list (a
repeated flag, a comma-separated variable, a TOML array).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from sluicegate.settings.types import Parse, split_list


@dataclass(frozen=True, slots=True)
class Flag:
    parse: Parse  # checks one value from any source; raises ValueError with the reason
    metavar: str | None = None  # how `--help` names the value
    secret: bool = False  # never printed; also read from the file SLUICEGATE_<NAME>_FILE names
    repeat: bool = False  # a list: the flag repeats (or takes a,b), the variable is a,b, the file an array

    def check(self, value: Any) -> Any:
        if value is None:
            return None
        if self.repeat:
            items = [v for raw in split_list(value) for v in (split_list(raw) if isinstance(raw, str) else [raw])]
            return [self.parse(v) for v in items]
        return self.parse(value)

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_before_validator_function(self.check, handler(source))


def flag_of(metadata: list[Any]) -> Flag:
    """The Flag among a field's metadata (every settings field has one)."""
    for m in metadata:
        if isinstance(m, Flag):
            return m
    raise LookupError("a settings field without a Flag")


__all__ = ["Flag", "flag_of"]
