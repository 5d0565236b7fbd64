"""Who may call and how much: API keys, idempotency, token-priced rate limits. Below api/, above nothing of it."""
