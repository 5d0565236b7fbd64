"""What each surface answers to the generic JSON-boundary cases (contract/probes.py): a logical outcome ->
(status, error type)."""

from __future__ import annotations

from collections.abc import Mapping

ProbeExpectation = tuple[int, str]  # the (status, error type) a surface is expected to answer a probe case with

NATIVE_EXPECT: Mapping[str, ProbeExpectation] = {
    "malformed": (400, "invalid_json"),
    "invalid": (422, "invalid_request"),
    "media_type": (415, "unsupported_media_type"),
    "too_large": (413, "body_too_large"),
    "prompt_too_long": (422, "prompt_too_long"),
    "window": (422, "context_length_exceeded"),
    "no_model": (404, "model_not_found"),
}


def dialect_outcomes(invalid: ProbeExpectation, *, media_type: ProbeExpectation, too_large: ProbeExpectation,
                     no_model: ProbeExpectation) -> Mapping[str, ProbeExpectation]:
    """A dialect's outcomes, where one (status, type) answers malformed JSON, an invalid field and a prompt that
    does not fit alike (OpenAI's and Anthropic's `invalid_request_error`)."""
    return {"malformed": invalid, "invalid": invalid, "media_type": media_type, "too_large": too_large,
            "prompt_too_long": invalid, "window": invalid, "no_model": no_model}
