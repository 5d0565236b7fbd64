"""`GET /v1/models` and `GET /v1/models/{id}` in OpenAI's shapes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sluicegate.protocol.common import ResponseModel


class OpenAIModel(ResponseModel):
    id: str = Field(description="the served name; `name@version` is accepted wherever a model is named")
    object: Literal["model"] = "model"
    created: int = Field(description="when this server process started serving it (Unix seconds)")
    owned_by: str = "sluicegate"


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIModel]
