"""HTTP: the FastAPI app factory, middleware, routers and SSE framing."""
