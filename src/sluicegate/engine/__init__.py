"""The engine: continuous-batching scheduler, sampler, detokenizer, prefix cache. No HTTP, no pydantic."""

from sluicegate.engine.client import AsyncEngine
from sluicegate.engine.core import Engine, EngineOverloaded, EngineStopped
from sluicegate.engine.forecast import DeadlineTooShort
from sluicegate.engine.scheduler import SchedulerConfig
from sluicegate.engine.types import (
    EngineRequest,
    FinishReason,
    Priority,
    RequestOutput,
    SamplingParams,
    Timing,
    TokenLogprob,
)

__all__ = [
    "AsyncEngine",
    "DeadlineTooShort",
    "Engine",
    "EngineOverloaded",
    "EngineRequest",
    "EngineStopped",
    "FinishReason",
    "Priority",
    "RequestOutput",
    "SamplingParams",
    "SchedulerConfig",
    "Timing",
    "TokenLogprob",
]
