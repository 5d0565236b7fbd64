"""Pydantic schemas per surface, and the one place each converts to engine types."""
