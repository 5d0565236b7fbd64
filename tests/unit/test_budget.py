"""Token budgets: separate, reachable rules with the numbers in the message; the byte bound is sound."""

from __future__ import annotations

import random

import pytest

from sluicegate.backends.reference import ReferenceRunner
from sluicegate.config import LimitsConfig
from sluicegate.serving.budget import Budget, check_budget
from sluicegate.serving.errors import ApiError


def refusal(prompt: int, new: int, **kw: int | None) -> ApiError:
    with pytest.raises(ApiError) as info:
        check_budget(prompt, new, **kw)  # type: ignore[arg-type]
    return info.value


def test_fits() -> None:
    check_budget(1000, 1048, n_ctx=2048)
    check_budget(2047, 1, n_ctx=2048)


def test_rule_1_prompt_tokens_window_minus_one() -> None:
    err = refusal(2048, 1, n_ctx=2048)
    assert (err.type, err.status, err.param, err.code) == (
        "prompt_too_long",
        422,
        "prompt",
        "prompt_tokens_exceeded",
    )
    assert err.message == (
        "the prompt is 2048 tokens; at most 2047 prompt tokens are accepted "
        "(the context window is 2048 and at least one new token must fit)"
    )


def test_rule_1_configured_prompt_limit_is_its_own_reachable_rule() -> None:
    check_budget(500, 1000, n_ctx=2048, max_prompt_tokens=500)
    err = refusal(501, 1, n_ctx=2048, max_prompt_tokens=500)
    assert err.type == "prompt_too_long"
    assert "the prompt is 501 tokens; at most 500 prompt tokens" in err.message
    assert "the server's prompt-token limit; the context window is 2048" in err.message
    # a configured limit above the window is capped by the window
    assert "at most 2047" in refusal(3000, 1, n_ctx=2048, max_prompt_tokens=10_000).message


def test_rule_2_window_with_the_numbers() -> None:
    err = refusal(901, 256, n_ctx=1024)
    assert (err.type, err.param, err.code) == (
        "context_length_exceeded",
        "max_new_tokens",
        "context_window_exceeded",
    )
    assert err.message.startswith("901 prompt tokens plus 256 new tokens is 1157; the context window is 1024")
    assert "at most 123 new tokens fit" in err.message


def test_rule_3_new_token_limit() -> None:
    err = refusal(10, 5000, n_ctx=32768, max_new_tokens_limit=4096)
    assert (err.type, err.param, err.code) == ("invalid_request", "max_new_tokens", "out_of_range")
    assert "5000" in err.message and "4096" in err.message


def test_param_names_follow_the_surface() -> None:
    err = refusal(10, 5000, n_ctx=1024, prompt_param="messages", new_param="max_tokens")
    assert err.param == "max_tokens" and "max_tokens" not in err.message  # numbers, not names, in the text
    assert refusal(5000, 1, n_ctx=1024, prompt_param="messages").param == "messages"


def test_budget_for_runner_takes_the_model_and_the_config() -> None:
    runner = ReferenceRunner(n_ctx=512)
    b = Budget.for_runner(runner, LimitsConfig(max_prompt_tokens=100, max_new_tokens=64))
    assert (b.n_ctx, b.prompt_limit, b.max_new_tokens, b.max_token_bytes) == (512, 100, 64, 1)
    with pytest.raises(ApiError, match="at most 100 prompt tokens"):
        b.check(101, 1)
    with pytest.raises(ApiError, match="at most 64 new tokens"):
        b.check(10, 65)
    b.check(100, 64)


def test_byte_bound_refuses_early_with_the_numbers() -> None:
    b = Budget(n_ctx=2048, max_token_bytes=81)
    b.check_prompt_bytes(81 * 2047)  # could be 2047 tokens: must be tokenised to know
    with pytest.raises(ApiError) as info:
        b.check_prompt_bytes(81 * 2047 + 1)
    assert info.value.type == "prompt_too_long"
    assert info.value.message.startswith(
        "the prompt is at least 2048 tokens (165808 bytes; no token covers more "
        "than 81 bytes); at most 2047 prompt tokens are accepted"
    )
    Budget(n_ctx=16).check_prompt_bytes(10**9)  # unknown longest token: no early refusal


def test_byte_bound_is_sound_against_real_tokenisation() -> None:
    """Whenever the bound refuses, tokenising would have refused too (never a false refusal)."""
    runner = ReferenceRunner(n_ctx=64)
    b = Budget.for_runner(runner)
    rng = random.Random(7)
    alphabet = "ab é漢😀"
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        n_bytes = len(text.encode())
        try:
            b.check_prompt_bytes(n_bytes)
        except ApiError:
            assert len(runner.tokenize(text)) > b.prompt_limit
