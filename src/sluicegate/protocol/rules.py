"""The rules of request schemas that their fields cannot state: cross-field conditions (JSON Schema `if`/`then`
in the model's `allOf`) and the number rules every request description ends with."""

from __future__ import annotations

from pydantic import ConfigDict
from pydantic.config import JsonDict, JsonValue

WHOLE_NUMBER_RULE = (
    "Integer fields take JSON integers only: a number with a fraction part written, such as `8.0`, is refused "
    "(`wrong_type`) although JSON Schema counts it as an integer. Numbers are I-JSON anywhere in the body, "
    "free-form objects included: an integer of more than 64 digits is refused (`number_out_of_range`). This "
    "schema cannot say either (docs/errors.md)."
)
"""Part of every request schema's description: the number rules JSON Schema has no keyword for."""


def request_schema(description: str, rules: list[JsonValue]) -> ConfigDict:
    """A request model's config: its description, ending with the number rules, and its cross-field rules."""
    return ConfigDict(json_schema_extra={"description": f"{description} {WHOLE_NUMBER_RULE}", "allOf": rules})


def present(name: str, schema: JsonDict) -> JsonDict:
    """A JSON Schema condition: `name` is in the object and matches `schema`."""
    return {"required": [name], "properties": {name: schema}}


def when(condition: JsonDict, then: JsonDict) -> JsonDict:
    """A cross-field rule of a request schema (JSON Schema 2020-12 `if`/`then`), for its `allOf`."""
    return {"if": condition, "then": then}


NOT_NULL: JsonDict = {"not": {"type": "null"}}
NULL_OR_EMPTY: JsonDict = {"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]}
