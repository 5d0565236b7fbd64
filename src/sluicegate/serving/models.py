"""The served model: identity, limits, tokeniser and engine, and `name@version` resolution."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from sluicegate.backends.base import ModelIdentity, ModelRunner, RunnerLimits
from sluicegate.engine import AsyncEngine
from sluicegate.serving.budget import Budget
from sluicegate.serving.errors import ApiError

_LARGE_TEXT = 16_384  # characters; longer texts are tokenised off the event loop


@dataclass(slots=True)
class ServedModel:
    runner: ModelRunner
    engine: AsyncEngine
    budget: Budget | None = None  # None: the runner's window and default limits (computed here)

    def __post_init__(self) -> None:
        if self.budget is None:
            self.budget = Budget.for_runner(self.runner)

    @property
    def token_budget(self) -> Budget:
        assert self.budget is not None
        return self.budget

    @property
    def identity(self) -> ModelIdentity:
        return self.runner.identity

    @property
    def limits(self) -> RunnerLimits:
        return self.runner.limits

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
