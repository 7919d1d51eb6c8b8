"""GEPAConfig: every knob of a GEPA run, validated and frozen (RunConfig maps onto it)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from art_rlvr.llm import LLMSettings


class GEPAConfig(BaseModel):
    """Reflective prompt evolution over ART rollouts.

    Budget: one metric call is one scored rollout (a reward evaluation), so a scenario evaluated
    with `rollouts_per_problem=k` costs k. `max_metric_calls` covers everything the optimizer
    evaluates (seed, minibatches, Pareto set); the final val report of the seed and best prompts
    is counted separately (`report_rollouts`), as it decides nothing.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # reflection LM: None means the embedded model itself, through its own endpoint
    reflection_model: str | None = None
    reflection_api_base: str | None = None
    reflection_api_key_env: str | None = None
    reflection_timeout_s: float = Field(default=120.0, gt=0)
    reflection_max_retries: int = Field(default=4, ge=0, le=20)
    reflection_backoff_s: float = Field(default=1.0, ge=0)
    reflection_backoff_max_s: float = Field(default=60.0, ge=0)
    reflection_temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    reflection_max_tokens: int = Field(default=1024, ge=16)

    # budget and stopping
    max_metric_calls: int = Field(default=400, ge=1)
    max_iterations: int | None = Field(default=None, ge=0)
    max_reflection_attempts: int = Field(default=3, ge=1, le=10)
    max_consecutive_errors: int = Field(default=5, ge=1)
    max_perfect_streak: int = Field(default=3, ge=1)

    # data and rollouts
    traces_per_iteration: int = Field(default=4, ge=1)
    rollouts_per_problem: int = Field(default=2, ge=1)
    pareto_size: int = Field(default=8, ge=1)
    max_tokens: int = Field(default=32, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=5.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)

    # search
    pool_size: int = Field(default=8, ge=2)
    # accept a child only if its minibatch mean beats the parent's by more than this (a
    # negative value also admits slightly worse children: exploration)
    min_improvement_threshold: float = Field(default=0.0, ge=-1.0, le=1.0)
    seed_prompt: str | None = None
    use_merge: bool = False
    max_merge_attempts: int = Field(default=3, ge=0)
    seed: int = 0
    max_prompt_chars: int = Field(default=2000, ge=16)
    max_reflection_examples: int = Field(default=8, ge=1)
    max_shown_rejections: int = Field(default=5, ge=0)

    # leak check: the record field that holds the gold answer (read only by the leak check)
    leak_check: bool = True
    answer_field: str = "answer"

    # final report (greedy, outside the budget)
    report_val_limit: int | None = Field(default=50, ge=0)  # 0: no report, None: whole split
    report_max_tokens: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _consistent(self) -> GEPAConfig:
        if self.reflection_api_base and not self.reflection_model:
            raise ValueError("reflection_api_base needs reflection_model (e.g. 'openai/<name>')")
        if self.seed_prompt is not None and len(self.seed_prompt) > self.max_prompt_chars:
            raise ValueError(
                f"seed_prompt is {len(self.seed_prompt)} chars, over max_prompt_chars="
                f"{self.max_prompt_chars}"
            )
        return self

    def reflection_settings(self) -> LLMSettings | None:
        """The external reflector, or None for the embedded model."""
        if self.reflection_model is None:
            return None
        return LLMSettings(
            model=self.reflection_model,
            api_base=self.reflection_api_base,
            api_key_env=self.reflection_api_key_env,
            **self.reflection_overrides(),
        )

    def reflection_overrides(self) -> dict[str, float | int]:
        return {
            "timeout_s": self.reflection_timeout_s,
            "max_retries": self.reflection_max_retries,
            "backoff_initial_s": self.reflection_backoff_s,
            "backoff_max_s": self.reflection_backoff_max_s,
            "temperature": self.reflection_temperature,
            "max_tokens": self.reflection_max_tokens,
        }

    def evaluation_cost(self, scenarios: int) -> int:
        return scenarios * self.rollouts_per_problem
