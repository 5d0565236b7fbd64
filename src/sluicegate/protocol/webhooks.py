"""`/v1/webhook-endpoints` and the delivery log: schemas."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from sluicegate.protocol.common import ResponseModel, StrictModel

EventType = Literal["batch.completed", "batch.failed", "batch.cancelled", "batch.expired"]


class WebhookEndpointCreate(StrictModel):
    url: str = Field(min_length=1, max_length=2048, description="http(s) URL that receives the events; it must "
                     "resolve to public addresses (docs/webhooks.md)")
    event_types: list[EventType] = Field(min_length=1, max_length=4, description="the events to receive")


class WebhookEndpointOut(ResponseModel):
    id: str
    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    url: str
    event_types: list[str]
    created_at: str = Field(description="RFC 3339, UTC")
    status: Literal["enabled", "disabled"]
    disabled_reason: str | None = None
    secret: str | None = Field(None, description="`whsec_...`: shown once, in the answer that created it")


class WebhookEndpointList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[WebhookEndpointOut]


class WebhookEndpointDeleted(ResponseModel):
    id: str
    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    deleted: Literal[True] = True


class WebhookDeliveryOut(ResponseModel):
    id: str
    object: Literal["webhook_delivery"] = "webhook_delivery"
    event_id: str = Field(description="the webhook-id header: the same on every retry")
    event_type: str
    endpoint_id: str
    subject: str | None = Field(description="what the event is about (a batch's id)")
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    last_status_code: int | None
    last_error: str | None
    created_at: str
    delivered_at: str | None
    next_attempt_at: str | None = Field(description="pending: when the next attempt is due")
    log: list[dict[str, Any]] = Field(description="every attempt: at, status_code, error, duration_ms")


class WebhookDeliveryList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[WebhookDeliveryOut]
