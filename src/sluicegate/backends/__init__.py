"""Model runners: the only layer that touches a model's weights."""

from sluicegate.backends.base import BatchItem, ModelIdentity, ModelRunner, RunnerLimits

__all__ = ["BatchItem", "ModelIdentity", "ModelRunner", "RunnerLimits"]
