"""The generation engine: continuous batching, batch-invariant forwards, sampling, grammars."""
