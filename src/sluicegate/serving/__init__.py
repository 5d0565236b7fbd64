"""Per-surface request handling: validate, budget, submit to the engine, shape the result. No FastAPI."""
