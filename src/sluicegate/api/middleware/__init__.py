"""Pure ASGI middleware: request context (id, timing, access log) and the body limit."""
