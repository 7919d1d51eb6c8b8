"""RLConfig: the rl phase's own settings (the `rl` section: `rl.learning_rate=...`).

The words users have always typed (`learning_rate=`, `n_batches=`, `eval_every=`, ...) are the
same keys: `RunConfig` reads them into this section, so config.json shows them under `rl`.
Light (pydantic only): the CLI validates keys before ART loads.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from art_rlvr.core.types import Loss, LrSchedule


class RLConfig(BaseModel):
    """GRPO training of the rl phases (tinker-cookbook math_rl style knobs), and what watches
    it: evaluation cadence, the early stop on a val plateau, the reward-hacking alarm."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    groups_per_batch: int = Field(default=6, ge=1, description="scenarios per RL step")
    n_batches: int = Field(default=24, ge=0, description="RL steps (mode=rl)")
    learning_rate: float = Field(
        default=2e-4, gt=0.0, allow_inf_nan=False, description="the optimiser's learning rate"
    )
    lr_schedule: LrSchedule = Field(
        default="constant",
        description="the learning rate over the run's RL steps: constant, linear (to lr/N at "
        "the last of N steps, as TRL's and tinker-cookbook's) or cosine",
    )
    loss_fn: Loss = Field(default="cispo", description="cispo or ppo")
    kl_penalty_coef: float = Field(
        default=0.0, ge=0.0, description="KL penalty against the base model"
    )
    scale_rewards: bool = Field(
        default=False,
        description="divide group advantages by their standard deviation (on in ART and TRL; "
        "off learned more here: docs/results.md)",
    )
    eval_every: int = Field(
        default=8, ge=1, description="validation every N steps (step 0 and the last always)"
    )
    patience: int | None = Field(
        default=None,
        ge=1,
        description="mode=rl: stop after N evaluations without a val improvement; default never",
    )
    min_delta: float = Field(
        default=0.0, ge=0.0, description="the improvement that counts for patience"
    )
    alarm_reward_rise: float = Field(
        default=0.05, ge=0.0, description="reward-hacking alarm: train reward up by this much ..."
    )
    alarm_val_drop: float = Field(
        default=0.05, ge=0.0, description="... while val accuracy falls by this much"
    )
