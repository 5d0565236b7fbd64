"""The served model: identity, limits, tokeniser and engine, and `name@version` resolution."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sluicegate.backends.base import ModelIdentity, RunnerLimits, Tokenizer
from sluicegate.engine.client import OutputCollector
from sluicegate.engine.types import EngineRequest
from sluicegate.serving.budget import Budget
from sluicegate.serving.errors import ApiError

_LARGE_TEXT = 16_384  # characters; longer texts are tokenised off the event loop


class EngineClient(Protocol):
    """What the serving core needs of an engine: the local one (engine.AsyncEngine) or an upstream one
    (upstream.AsyncUpstream). `submit` may raise the engine's refusals or an upstream's `Rejected` (an open
    circuit, what its hop cannot carry), which the core's `Runs.start` maps and lifts to ApiError; every run it
    accepts ends with a finished output."""

    def submit(self, requests: Sequence[EngineRequest]) -> OutputCollector: ...

    def abort(self, request_id: str) -> None: ...


@dataclass(slots=True)
class ServedModel:
    runner: Tokenizer  # the model's tokenizer (and, for the local model, its weights)
    engine: EngineClient
    budget: Budget | None = None  # None: the runner's window and default limits (computed here)
    identity_override: ModelIdentity | None = None  # an upstream model's configured identity
    token_ids: bool = True  # its answers carry token ids (an upstream may not return them)
    limits_override: RunnerLimits | None = None  # an upstream model's window (the tokenizer's is not it)
    chat_template_source: str | None = None  # the operator's template (--chat-template-file); None: the GGUF's
    reasoning_format: str = "auto"  # --reasoning-format (serving/reasoning.py)
    chat_cache: object | None = None  # its ChatFormat, built on first use (serving/chat_template.py)
    _control: re.Pattern[str] | None = None

    def __post_init__(self) -> None:
        if self.budget is None:
            self.budget = Budget.for_runner(self.runner)

    def control_pattern(self) -> re.Pattern[str] | None:
        """Finds the written form of any of the model's control tokens (`<|im_end|>`); None: it has none."""
        if self._control is None and self.token_budget.control_texts:
            texts = sorted(self.token_budget.control_texts, key=len, reverse=True)
            self._control = re.compile("|".join(re.escape(t) for t in texts))
        return self._control

    @property
    def token_budget(self) -> Budget:
        assert self.budget is not None
        return self.budget

    @property
    def identity(self) -> ModelIdentity:
        return self.identity_override or self.runner.identity

    @property
    def limits(self) -> RunnerLimits:
        return self.limits_override or self.runner.limits

    @property
    def upstream(self) -> bool:
        """Served by an upstream engine (the identity is the configured one; upstream.AsyncUpstream)."""
        return self.identity_override is not None

    def resolve(self, requested: str | None, *, param: str = "model") -> ModelIdentity:
        """Accept no model, `name`, or `name@version`; anything else is model_not_found."""
        ident = self.identity
        if requested is None or requested in (ident.name, ident.ref):
            return ident
        if requested.startswith(ident.name + "@"):  # a pinned version this server does not have
            raise ApiError(
                "model_not_found", f"no such version of {ident.name}; available versions: {ident.version}",
                param=param, code="model_version_not_found",
            )
        raise ApiError(
            "model_not_found", f"no such model; this server serves {ident.ref}", param=param,
            code="model_not_found",
        )

    async def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        if len(text) > _LARGE_TEXT:
            return await asyncio.to_thread(
                self.runner.tokenize, text, add_special=add_special, parse_special=parse_special
            )
        return self.runner.tokenize(text, add_special=add_special, parse_special=parse_special)


def check_text(text: str, param: str) -> int:
    """Refuse text that is not valid Unicode (a lone surrogate from a JSON escape), naming the parameter.

    Returns the text's length in UTF-8 bytes.
    """
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ApiError(
            "invalid_request", f"{param} contains an unpaired UTF-16 surrogate", param=param,
            code="invalid_string",
        ) from None
