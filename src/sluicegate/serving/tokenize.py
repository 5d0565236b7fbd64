"""`/tokenize` and `/detokenize` on the serving path: the same tokenizer, chat template and text checks
as the generating surfaces, so a count here is the count a generation of the same input is charged."""

from __future__ import annotations

import asyncio

from sluicegate.protocol.openai_chat import ChatCompletionRequest
from sluicegate.protocol.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from sluicegate.serving.chat_template import (
    TemplateRenderError,
    chat_format,
    template_for,
    template_messages,
    template_tools,
    tokenize_prompt,
)
from sluicegate.serving.errors import ApiError
from sluicegate.serving.models import ServedModel, check_text


async def tokenize(model: ServedModel, req: TokenizeRequest) -> TokenizeResponse:
    model.resolve(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise ApiError("invalid_request", "give exactly one of prompt and messages", param="prompt",
                       code="missing_field" if req.prompt is None else "conflicting_fields")
    if req.prompt is not None:
        check_text(req.prompt, "prompt")
        add = True if req.add_special_tokens is None else req.add_special_tokens
        ids = await model.tokenize(req.prompt, add_special=add, parse_special=req.parse_special)
    else:
        assert req.messages is not None
        ids = await _chat_ids(model, req)
    return TokenizeResponse(count=len(ids), max_model_len=model.limits.n_ctx, tokens=ids)


async def _chat_ids(model: ServedModel, req: TokenizeRequest) -> list[int]:
    template = template_for(model)
    fmt = chat_format(model)
    assert req.messages is not None
    chat = ChatCompletionRequest.model_construct(model=req.model or model.identity.name, messages=req.messages,
                                                 tools=req.tools)
    messages = template_messages(chat, fmt)

    def work() -> list[int]:
        plain, pieces = template.segments_merging(messages, tools=template_tools(chat, fmt),
                                          add_generation_prompt=req.add_generation_prompt)
        check_text(plain, "messages")
        return tokenize_prompt(model, plain, pieces).token_ids  # exactly what chat completions runs

    try:
        return await asyncio.to_thread(work)
    except TemplateRenderError as exc:
        raise ApiError("invalid_request", f"the model's chat template refused these messages: {exc}",
                       param="messages", code="template_error") from None


def detokenize(model: ServedModel, req: DetokenizeRequest) -> DetokenizeResponse:
    model.resolve(req.model)
    n_vocab = model.limits.n_vocab
    for i, t in enumerate(req.tokens):
        if t >= n_vocab:
            raise ApiError("invalid_request", f"tokens[{i}] is not a token id: ids run from 0 to {n_vocab - 1}",
                           param=f"tokens[{i}]", code="invalid_token_id")
    text = b"".join(model.runner.token_bytes(t) for t in req.tokens).decode("utf-8", errors="replace")
    return DetokenizeResponse(prompt=text)
