"""GEPAConfig: every knob of a GEPA run, validated and frozen (RunConfig maps onto it)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from art_rlvr.llm.settings import LLMRole, refuse_renamed, role_over_defaults
from art_rlvr.rollouts.sampling import GroupSize, MaxTokens, Temperature, TopP


class GEPAConfig(BaseModel):
    """Reflective prompt evolution over ART rollouts.

    Budget: one metric call is one scored rollout (a reward evaluation), so a scenario evaluated
    with `group_size=k` costs k. `max_metric_calls` covers everything the optimizer
    evaluates (seed, minibatches, Pareto set); the final val report of the seed and best prompts
    is counted separately (`report_rollouts`), as it decides nothing.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # the reflection LM (model unset: the embedded model itself, through its own endpoint)
    reflection: LLMRole = Field(
        default_factory=LLMRole, description="the reflection LM: reflection.model=..., etc."
    )

    # budget and stopping
    max_metric_calls: int = Field(
        default=400,
        ge=1,
        description="the budget: one metric call is one scored rollout; never exceeded",
    )
    max_iterations: int | None = Field(
        default=None, ge=0, description="stop after N iterations; default none"
    )
    max_reflection_attempts: int = Field(
        default=3,
        ge=1,
        le=10,
        description="replies asked for per iteration when a proposal breaks a rule",
    )
    max_consecutive_errors: int = Field(
        default=5, ge=1, description="stop after N reflection errors in a row"
    )
    max_perfect_streak: int = Field(
        default=3,
        ge=1,
        description="stop after N minibatches in a row on which the parent is already perfect",
    )

    # data and rollouts
    traces_per_iteration: int = Field(
        default=4, ge=1, description="scenarios in the reflection minibatch"
    )
    group_size: GroupSize = Field(
        default=2, description="rollouts per scenario and prompt (one trajectory group)"
    )
    pareto_size: int = Field(
        default=8, ge=1, description="Pareto-set scenarios (a seeded slice of train)"
    )
    max_tokens: MaxTokens = Field(default=32, description="completion tokens per rollout")
    temperature: Temperature = Field(default=1.0, description="rollout sampling temperature")
    top_p: TopP = Field(default=1.0, description="rollout nucleus sampling")

    # search
    pool_size: int = Field(default=8, ge=2, description="frontier / candidate pool cap")
    # accept a child only if its minibatch mean beats the parent's by more than this (a
    # negative value also admits slightly worse children: exploration)
    min_improvement_threshold: float = Field(
        default=0.0,
        ge=-1.0,
        le=1.0,
        description="accept a child only if its minibatch mean beats its parent's by more",
    )
    seed_prompt: str | None = Field(
        default=None,
        description="where the search starts; default system_prompt, else the scenario's",
    )
    use_merge: bool = Field(default=False, description="GEPA's merge of two frontier prompts")
    max_merge_attempts: int = Field(default=3, ge=0, description="merges tried per run")
    seed: int = Field(default=0, description="seeds the minibatches and parent selection")
    max_prompt_chars: int = Field(default=2000, ge=16, description="longer proposals are refused")
    max_reflection_examples: int = Field(
        default=8, ge=1, description="traces shown to the reflection LM per iteration"
    )
    max_episode_chars: int = Field(
        default=1500,
        ge=200,
        description="a multi-turn episode shown to the reflection LM is trimmed to this length",
    )
    max_shown_rejections: int = Field(
        default=5, ge=0, description="earlier rejected proposals shown, so they are not repeated"
    )

    # leak check: the record field that holds the gold answer (read only by the leak check)
    leak_check: bool = Field(
        default=True, description="refuse a proposal that contains a shown example's gold answer"
    )
    answer_field: str = Field(
        default="answer",
        description="the record field with the gold answer (read only by the leak check)",
    )

    # final report (greedy, outside the budget)
    report_val_limit: int | None = Field(
        default=50,
        ge=0,
        description="val scenarios in the final seed-vs-best report (not budgeted; 0: none)",
    )
    report_max_tokens: int | None = Field(
        default=None, ge=1, description="max_tokens of that report; default max_tokens"
    )

    @model_validator(mode="before")
    @classmethod
    def _reflection(cls, data: Any) -> Any:
        refuse_renamed(data, "GEPAConfig")
        return role_over_defaults(data, "reflection", {})

    @model_validator(mode="after")
    def _consistent(self) -> GEPAConfig:
        if self.seed_prompt is not None and len(self.seed_prompt) > self.max_prompt_chars:
            raise ValueError(
                f"seed_prompt is {len(self.seed_prompt)} chars, over max_prompt_chars="
                f"{self.max_prompt_chars}"
            )
        return self

    def evaluation_cost(self, examples: int) -> int:
        return examples * self.group_size
