"""Reading a JSON request body: strictly (serving/strict_json.py has every decision), then into its schema."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from sluicegate.api.validation import validation_error
from sluicegate.serving.errors import ApiError
from sluicegate.serving.strict_json import MAX_DEPTH, MAX_NUMBER_CHARS, nesting_depth_exceeds, parse_json

__all__ = ["MAX_DEPTH", "MAX_NUMBER_CHARS", "nesting_depth_exceeds", "parse_json", "parse_model", "validate"]

M = TypeVar("M", bound=BaseModel)


def parse_model(raw: bytes, model: type[M]) -> M:
    return validate(parse_json(raw), model)


def validate(data: Any, model: type[M]) -> M:
    """Validate parsed JSON against a request schema; the body must be one object."""
    if not isinstance(data, dict):
        raise ApiError("invalid_request", f"the body must be a JSON object, not {_json_kind(data)}",
                       code="wrong_type")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None


def _json_kind(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )
