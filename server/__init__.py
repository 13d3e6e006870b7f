"""The OpenAI-compatible HTTP server: an adapter over the runtime's engine."""
