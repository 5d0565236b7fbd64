"""Token budgets: two separate, reachable rules, checked after tokenising and before any engine work.

1. prompt tokens (prefill cost) must not exceed `max_prompt_tokens`;
2. prompt tokens plus new tokens (positions) must fit the context window.
"""

from __future__ import annotations

from sluicegate.serving.errors import ApiError


def check_budget(
    prompt_tokens: int, max_new_tokens: int, *, n_ctx: int, max_prompt_tokens: int | None = None,
    prompt_param: str = "prompt", new_param: str = "max_new_tokens",
) -> None:
    limit = n_ctx - 1 if max_prompt_tokens is None else min(max_prompt_tokens, n_ctx - 1)
    if prompt_tokens > limit:
        raise ApiError(
            "prompt_too_long", f"the prompt is {prompt_tokens} tokens; at most {limit} prompt tokens are accepted",
            param=prompt_param, code="prompt_tokens_exceeded",
        )
    total = prompt_tokens + max_new_tokens
    if total > n_ctx:
        raise ApiError(
            "context_length_exceeded",
            f"{prompt_tokens} prompt tokens plus {max_new_tokens} new tokens is {total}; "
            f"the context window is {n_ctx}",
            param=new_param, code="context_window_exceeded",
        )
