"""art_rlvr: RL from verifiable rewards, GEPA and expert iteration on OpenPipe ART.

Names are resolved lazily: `import art` costs ~20 s (it imports torch), and the CLI should
reject a bad config key before paying that.
"""

import os
import warnings

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm must not fetch at import
# weave (imported by ART) reports errors and a session to sentry.io at exit unless this is
# false; a run talks to nothing the user did not name. Set it to true to opt back in.
os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
# torch's OpenMP threads spin before they sleep (libgomp: 300,000 spins by default). Two such
# processes on the same cores (two runs, a run beside a notebook's backend) then spin on cores
# the other needs: a pair of evaluations took 5.4x one alone. libgomp drops to 100-1,000 spins
# itself when it sees more threads than cores in its own process; 1,000 here makes the pair take
# 1.2x, one run alone ~4 % longer (benchmarks/shared_cores.py). Read when torch loads: only
# if art_rlvr is imported first (the CLI always is).
os.environ.setdefault("GOMP_SPINCOUNT", "1000")

from art_rlvr._lazy import lazy_exports

# Known third-party warnings we cannot fix, silenced by their exact text (nothing else is):
# peft reads `model.is_gradient_checkpointing`, which transformers 5 deprecates on every access
# (peft/peft_model.py; a peft release will switch to `is_activation_checkpointing`).
warnings.filterwarnings(
    "ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning
)

_EXPORTS = {
    "DEFAULT_BASE_MODEL": "art_rlvr.backend.model_source",
    "TorchBackend": "art_rlvr.backend.torch_backend",
    "LoraSettings": "art_rlvr.backend.adapters",
    "BackendUnavailable": "art_rlvr.backends",
    "build_backend": "art_rlvr.backends",
    "check_requirements": "art_rlvr.backends",
    "RunConfig": "art_rlvr.config",
    "parse_args": "art_rlvr.config",
    "EvalReport": "art_rlvr.evaluation",
    "evaluate": "art_rlvr.evaluation",
    "Score": "art_rlvr.core",
    "Reply": "art_rlvr.core",
    "Episode": "art_rlvr.core",
    "make_reward": "art_rlvr.rewards",
    "SamplingConfig": "art_rlvr.sampling",
    "gather_groups": "art_rlvr.rollouts",
    "rollout": "art_rlvr.rollouts",
    "rollout_group": "art_rlvr.rollouts",
    "run_episode": "art_rlvr.rollouts",
    "tool": "art_rlvr.tools",
    "attach_outcome": "art_rlvr.outcome",
    "feedback_of": "art_rlvr.outcome",
    "is_correct": "art_rlvr.outcome",
    "setup_weave": "art_rlvr.observe.tracing",
    "Scenario": "art_rlvr.scenario",
    "Task": "art_rlvr.scenario",
    "builtin_scenarios": "art_rlvr.scenario",
    "load_task": "art_rlvr.scenario",
}

__all__, __getattr__, __dir__ = lazy_exports("art_rlvr", _EXPORTS)
