"""The keyword arguments of ART's `backend.train` that TorchBackend does not implement: the ones
ART's own backends know (ignored, with a warning naming them) and anything else (a typo, or an
option from a newer ART; warned as unknown). Both warn rather than raise, as ART passes what it
passes, and training goes on with TorchBackend's semantics."""

from __future__ import annotations

import warnings
from collections.abc import Mapping

IGNORED_ART_OPTIONS = frozenset(
    {
        "normalize_advantages",
        "adam_params",
        "kl_penalty_reference_step",
        "kl_ref_adapter_path",
        "kl_penalty_source",
        "advantage_balance",
        "importance_sampling_level",
        "max_negative_advantage_importance_sampling_weight",
        "mask_prob_ratio",
        "kimi_k2_tau",
        "precalculate_logprobs",
        "plot_tensors",
        "truncated_importance_sampling",
        "scale_learning_rate_by_reward_std_dev",
        "logprob_calculation_chunk_size",
        "packed_sequence_length",
        "num_trajectories_learning_rate_multiplier_power",
        "optimizer_save_interval",
        "final_training_step",
        "grad_accumulation_sequences",
    }
)


def warn_unknown(unknown: Mapping[str, object]) -> None:
    """Warn (at the caller of `train`) about options given that TorchBackend does not use."""
    ignored = sorted(k for k in unknown if k in IGNORED_ART_OPTIONS)
    strange = sorted(k for k in unknown if k not in IGNORED_ART_OPTIONS)
    if ignored:
        warnings.warn(f"TorchBackend ignores ART options {ignored}", stacklevel=3)
    if strange:
        warnings.warn(f"TorchBackend.train: unknown keyword arguments {strange}", stacklevel=3)
