"""`response_format` on `/v1/completions` (as vLLM takes it there): the JSON schema, compiled as chat
compiles it (serving/constraints.py), so a sluicegate can enforce what a front sluicegate forwards."""

from __future__ import annotations

import asyncio
from typing import Any

from sluicegate.protocol.openai_chat import ResponseFormatJsonObject, ResponseFormatJsonSchema
from sluicegate.protocol.openai_completions import CompletionRequest
from sluicegate.serving.constraints import Grammar, GrammarError, compile_json
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel


def _schema(req: CompletionRequest) -> tuple[dict[str, Any] | None, str]:
    fmt = req.response_format
    if isinstance(fmt, ResponseFormatJsonSchema):
        return fmt.json_schema.schema_, "response_format.json_schema.schema"
    if isinstance(fmt, ResponseFormatJsonObject):
        return {"type": "object"}, "response_format"
    return None, ""


async def completion_grammar(model: ServedModel, req: CompletionRequest) -> Grammar | None:
    """The grammar a completion's `response_format` asks for; None for text."""
    schema, param = _schema(req)
    if schema is None:
        return None
    if req.stop:
        raise ApiError("invalid_request", "stop cannot be combined with JSON output: it could cut the JSON",
                       param="stop", code="invalid_combination")
    try:
        return await asyncio.to_thread(compile_json, model.runner, schema)
    except GrammarError:
        raise ApiError("invalid_request", f"{param} is not a JSON schema this server can enforce (see "
                       "docs/openai.md for the supported subset)", param=param, code="unsupported_schema") from None
