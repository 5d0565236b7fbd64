"""Validation errors as the envelope: the code lives in serving/validation.py (the serving adapters and the
job system validate request bodies too); re-exported here for the API layer."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from sluicegate.protocol.openai_common import clean_loc
from sluicegate.serving.errors import ApiError
from sluicegate.serving.validation import error_from_details, plain_name, validation_error


def openai_validation_error(exc: ValidationError, data: Any) -> ApiError:
    """The shared validation message, located by the client's JSON path (without union-member names).

    A union reports one error per member at the same place; the member that took the input's type (and
    failed a bound) explains the problem, so it is kept and the type mismatches of the others are dropped.
    """
    best: dict[tuple[int | str, ...], dict[str, Any]] = {}
    for e in exc.errors(include_url=False):
        loc = clean_loc(tuple(e["loc"]), data, missing=e["type"] == "missing")
        mismatch = e["type"].endswith("_type")
        if loc not in best or (best[loc]["type"].endswith("_type") and not mismatch):
            best[loc] = {**e, "loc": loc}
    return error_from_details(list(best.values()))


__all__ = ["error_from_details", "openai_validation_error", "plain_name", "validation_error"]
