"""Evaluation: greedy and sampled reports, pass@k, the resumable journal, external policies."""
