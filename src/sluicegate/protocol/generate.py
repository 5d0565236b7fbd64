"""`POST /v1/generate`: the native surface."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from sluicegate.engine.types import SamplingParams
from sluicegate.protocol.common import ModelInfo, ResponseModel, StageTiming, StopList, StrictModel, Usage
from sluicegate.protocol.rules import WHOLE_NUMBER_RULE

MAX_SEED = 2**63 - 1


GENERATE_DESCRIPTION = (
    "Refused rules this schema cannot state: prompt plus `max_new_tokens` over the model's window "
    "(`context_length_exceeded`), a prompt over the server's prompt-token limit (`prompt_too_long`), "
    f"`max_new_tokens` over the server's limit (`out_of_range`). {WHOLE_NUMBER_RULE}"
)


class GenerateOptions(StrictModel):
    """The native sampling options: `/v1/generate`'s fields besides the prompt and the model, and a
    prediction's `options` (protocol/predictions.py), so both surfaces validate them alike."""

    max_new_tokens: int = Field(16, ge=1, le=1 << 17, description="at most this many new tokens")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 is greedy")
    top_k: int = Field(0, ge=0, le=1 << 20, description="0 is off")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="same seed, same tokens, in any process")
    stop: StopList | None = Field(None, description="up to 4 strings that end the generation (not returned)")
    parse_special: bool = Field(True, description="read control-token text in the prompt (`<|im_start|>`) as "
                                "the model's control tokens, as /v1/completions and /tokenize do (false: as text)")

    def to_sampling_params(self) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
            top_p=self.top_p, seed=self.seed, stop=tuple(self.stop or ()),
        )

    def warnings(self, *, n_vocab: int | None = None) -> list[str]:
        """Harmless-but-ineffective combinations: accepted, and said so (never silently)."""
        out: list[str] = []
        if self.temperature == 0.0:
            for name, off in (("top_k", 0), ("top_p", 1.0)):
                if getattr(self, name) != off:
                    out.append(f"{name} has no effect at temperature 0 (greedy decoding)")
            if self.seed is not None:
                out.append("seed has no effect at temperature 0 (greedy decoding)")
        elif n_vocab is not None and self.top_k >= n_vocab:
            out.append(f"top_k has no effect: it is at least the vocabulary size ({n_vocab})")
        return out


class GenerateRequest(GenerateOptions):
    model_config = ConfigDict(json_schema_extra={"description": GENERATE_DESCRIPTION})

    prompt: str = Field(min_length=1, description="text to continue; control-token text is the model's control "
                        "tokens unless parse_special is false")
    model: str | None = Field(None, min_length=1, max_length=256, description="`name` or `name@version`")


class GenerateResponse(ResponseModel):
    id: str = Field(description="equals the X-Request-Id header")
    object: Literal["generation"] = "generation"
    created: int
    model: ModelInfo
    text: str
    token_ids: list[int]
    finish_reason: Literal["length", "stop", "eos", "cancelled"]
    seed: int | None = Field(description="the seed the sampler used (drawn by the server when not given)")
    usage: Usage
    warnings: list[str]
    timing: StageTiming
