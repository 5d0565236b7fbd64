"""Token budgets: separate, reachable rules, checked after tokenising and before any engine work.

1. prompt tokens (prefill cost) must not exceed the prompt-token limit: the server's `max_prompt_tokens`,
   and never more than the window minus one (at least one new token must fit);
2. prompt tokens plus new tokens (positions) must fit the context window;
3. new tokens must not exceed the server's `max_new_tokens`.

Every number comes from the loaded model (`n_ctx`) and the server's limits; every message gives them.
A prompt whose UTF-8 length alone proves it too long (no token covers more than `max_token_bytes` bytes)
is refused before it is tokenised, so a megabyte of text costs microseconds, not a second of tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluicegate.backends.base import Tokenizer
from sluicegate.config import LimitsConfig
from sluicegate.serving.errors import ApiError


def _prompt_limit(n_ctx: int, max_prompt_tokens: int | None) -> int:
    return n_ctx - 1 if max_prompt_tokens is None else max(1, min(max_prompt_tokens, n_ctx - 1))


def _why(limit: int, n_ctx: int) -> str:
    if limit == n_ctx - 1:
        return f"the context window is {n_ctx} and at least one new token must fit"
    return f"the server's prompt-token limit; the context window is {n_ctx}"


def check_budget(
    prompt_tokens: int, max_new_tokens: int, *, n_ctx: int, max_prompt_tokens: int | None = None,
    max_new_tokens_limit: int | None = None, prompt_param: str = "prompt", new_param: str = "max_new_tokens",
) -> None:
    """Refuse a request that cannot fit, with the numbers. Rules 1, 2, 3 of the module doc, in that order."""
    limit = _prompt_limit(n_ctx, max_prompt_tokens)
    if prompt_tokens > limit:
        raise ApiError(
            "prompt_too_long",
            f"the prompt is {prompt_tokens} tokens; at most {limit} prompt tokens are accepted "
            f"({_why(limit, n_ctx)})",
            param=prompt_param, code="prompt_tokens_exceeded",
        )
    total = prompt_tokens + max_new_tokens
    if total > n_ctx:
        raise ApiError(
            "context_length_exceeded",
            f"{prompt_tokens} prompt tokens plus {max_new_tokens} new tokens is {total}; "
            f"the context window is {n_ctx} (at most {n_ctx - prompt_tokens} new tokens fit after this "
            "prompt)",
            param=new_param, code="context_window_exceeded",
        )
    if max_new_tokens_limit is not None and max_new_tokens > max_new_tokens_limit:
        raise ApiError(
            "invalid_request",
            f"{new_param} is {max_new_tokens}; this server generates at most {max_new_tokens_limit} new "
            "tokens",
            param=new_param, code="out_of_range",
        )


@dataclass(frozen=True, slots=True)
class Budget:
    """The limits one request must fit, taken from the loaded model and the server's LimitsConfig."""

    n_ctx: int  # positions per request (the runner's window)
    max_prompt_tokens: int | None = None  # configured prompt-token limit; None: the window minus one
    max_new_tokens: int | None = None  # configured new-token limit; None: the window alone
    max_token_bytes: int = 0  # the longest token's text, in UTF-8 bytes; 0: unknown (no early refusal)
    max_special_bytes: int = 0  # the longest control token's written form (`<|im_start|>`), in UTF-8 bytes
    estimate_new_tokens: int = 256  # the cost estimate's new tokens when a request sets no limit
    control_texts: frozenset[str] = frozenset()  # the written forms of the control tokens (`<|im_start|>`)

    @classmethod
    def for_runner(cls, runner: Tokenizer, limits: LimitsConfig | None = None) -> Budget:
        """Reads the whole vocabulary once (tens of milliseconds for 50k tokens): call it off the loop."""
        limits = limits or LimitsConfig()
        n_vocab = runner.limits.n_vocab
        longest = special = 0
        control: set[str] = set()
        for i in range(n_vocab):
            n = len(runner.token_bytes(i))
            longest = max(longest, n)
            if n == 0:  # a control token: no text bytes, but parse_special reads it from its written form
                text = runner.token_text(i)
                special = max(special, len(text.encode("utf-8")))
                if text:
                    control.add(text)
        return cls(runner.limits.n_ctx, limits.max_prompt_tokens, limits.max_new_tokens, longest, special,
                   limits.estimate_new_tokens, frozenset(control))

    @property
    def prompt_limit(self) -> int:
        return _prompt_limit(self.n_ctx, self.max_prompt_tokens)

    def check_prompt_bytes(self, n_bytes: int, *, specials: int = 0, param: str = "prompt",
                           parse_special: bool = False) -> None:
        """Refuse, before tokenising, a text that must be more tokens than the prompt limit.

        Without special-token parsing every token covers at most `max_token_bytes` bytes of the text, so the
        text is at least ceil(n_bytes / max_token_bytes) tokens (plus `specials` the tokenizer adds); with it,
        a control token's written form may cover more (`max_special_bytes`), and the bound uses the larger.
        """
        per_token = max(self.max_token_bytes, self.max_special_bytes if parse_special else 0)
        if self.max_token_bytes <= 0:
            return
        at_least = -(-n_bytes // per_token) + specials
        limit = self.prompt_limit
        if at_least > limit:
            raise ApiError(
                "prompt_too_long",
                f"the prompt is at least {at_least} tokens ({n_bytes} bytes; no token covers more than "
                f"{per_token} bytes); at most {limit} prompt tokens are accepted "
                f"({_why(limit, self.n_ctx)})",
                param=param, code="prompt_tokens_exceeded",
            )

    def check(self, prompt_tokens: int, max_new_tokens: int, *, prompt_param: str = "prompt",
              new_param: str = "max_new_tokens") -> None:
        check_budget(
            prompt_tokens, max_new_tokens, n_ctx=self.n_ctx, max_prompt_tokens=self.max_prompt_tokens,
            max_new_tokens_limit=self.max_new_tokens, prompt_param=prompt_param, new_param=new_param,
        )
