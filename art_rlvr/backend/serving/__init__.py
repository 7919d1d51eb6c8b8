"""The OpenAI-compatible HTTP server over the engine, its request checks and served log."""
