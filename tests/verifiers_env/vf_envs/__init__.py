"""Tiny verifiers 0.4 environments written in the suite (no hub, no network)."""
