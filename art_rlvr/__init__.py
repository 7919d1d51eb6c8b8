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
# torch's OpenMP threads spin before they sleep (libgomp: 300,000 spins by default). Alone, a
# decode step wants them awake (at 1,000 spins a 36-row step took 1.6x its time at 30,000);
# beside another busy process spinning threads take cores it needs (a pair of evaluations took
# 4.5x one alone at 30,000, 1.1x at 1,000). So: 30,000 here, and while other processes use our
# cores TorchBackend makes libgomp throttle to 100 (art_rlvr/backend/runtime/spin.py). Read when
# torch loads: only if art_rlvr is imported first (the CLI always is); the throttle works either
# way.
os.environ.setdefault("GOMP_SPINCOUNT", "30000")
# MKL (torch's fp32 matrix products on x86) picks its kernels and splits its work by matrix size
# and thread count. On AVX-512 cores a row's result then changed with the number of rows and with
# 1 or 2 threads, which broke the engine's batch invariance (seeded runs differed run to run) and
# its thread tuner. Strict conditional numerical reproducibility keeps each output's sum in one
# order: every row count from 1 to 256 and both thread counts gave the same bits, no slower
# (2026-11-25, docs/results.md). MKL reads it at its first call, so it holds even where torch
# was imported first, unless torch had already multiplied matrices.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

from art_rlvr.core.lazy import lazy_exports

# Known third-party warnings we cannot fix, silenced by their exact text (nothing else is):
# peft reads `model.is_gradient_checkpointing`, which transformers 5 deprecates on every access
# (peft/peft_model.py; a peft release will switch to `is_activation_checkpointing`).
warnings.filterwarnings(
    "ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning
)

_EXPORTS = {
    "DEFAULT_BASE_MODEL": "art_rlvr.backend",
    "TorchBackend": "art_rlvr.backend",
    "LoraSettings": "art_rlvr.backend",
    "BackendChoice": "art_rlvr.backend",
    "BackendUnavailable": "art_rlvr.backend",
    "RunConfig": "art_rlvr.config.run_config",
    "parse_args": "art_rlvr.config.run_config",
    "EvalReport": "art_rlvr.eval.evaluate",
    "evaluate": "art_rlvr.eval.evaluate",
    "Score": "art_rlvr.core.types",
    "Reply": "art_rlvr.core.types",
    "Episode": "art_rlvr.core.types",
    "make_reward": "art_rlvr.scenarios.rewards",
    "SamplingConfig": "art_rlvr.rollouts.sampling",
    "gather_groups": "art_rlvr.rollouts.rollout",
    "rollout": "art_rlvr.rollouts.rollout",
    "rollout_group": "art_rlvr.rollouts.rollout",
    "run_episode": "art_rlvr.rollouts.loop",
    "tool": "art_rlvr.rollouts.tools",
    "attach_outcome": "art_rlvr.core.outcome",
    "feedback_of": "art_rlvr.core.outcome",
    "is_correct": "art_rlvr.core.outcome",
    "setup_weave": "art_rlvr.observe.tracing",
    "Example": "art_rlvr.scenarios.scenario",
    "Scenario": "art_rlvr.scenarios.scenario",
    "builtin_scenarios": "art_rlvr.scenarios.scenario",
    "load_scenario": "art_rlvr.scenarios.scenario",
}

__all__, __getattr__, __dir__ = lazy_exports("art_rlvr", _EXPORTS)
