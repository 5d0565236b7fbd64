"""Validation errors as the envelope: the code lives in serving/validation.py (the serving adapters and the
job system validate request bodies too); re-exported here for the API layer."""

from sluicegate.serving.validation import error_from_details, plain_name, validation_error

__all__ = ["error_from_details", "plain_name", "validation_error"]
