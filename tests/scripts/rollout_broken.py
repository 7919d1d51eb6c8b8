"""A rollout module that fails to import (tests/rollouts/test_rollout_functions.py)."""

raise RuntimeError("broken at import")
