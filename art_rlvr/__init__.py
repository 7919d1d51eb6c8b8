"""art_rlvr: RL from verifiable rewards, GEPA and expert iteration on OpenPipe ART.

Names are resolved lazily: `import art` costs ~20 s (it imports torch), and the CLI should
reject a bad config key before paying that.
"""

import importlib
import os
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm must not fetch at import

_EXPORTS = {
    "DEFAULT_BASE_MODEL": "art_rlvr.backend.model_source",
    "TorchBackend": "art_rlvr.backend.torch_backend",
    "LoraSettings": "art_rlvr.backend.torch_backend",
    "RunConfig": "art_rlvr.config",
    "parse_args": "art_rlvr.config",
    "EvalReport": "art_rlvr.loops.evaluate",
    "evaluate": "art_rlvr.loops.evaluate",
    "Score": "art_rlvr.rewards",
    "make_reward": "art_rlvr.rewards",
    "SamplingConfig": "art_rlvr.rollouts",
    "gather_groups": "art_rlvr.rollouts",
    "rollout": "art_rlvr.rollouts",
    "rollout_group": "art_rlvr.rollouts",
    "Scenario": "art_rlvr.scenario",
    "Task": "art_rlvr.scenario",
    "builtin_scenarios": "art_rlvr.scenario",
    "load_task": "art_rlvr.scenario",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'art_rlvr' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return __all__
