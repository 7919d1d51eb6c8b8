"""The types and helpers every layer shares: no ART, no torch, nothing to load."""
