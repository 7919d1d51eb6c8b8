"""EIConfig: every knob of an expert-iteration run, validated and frozen.

Imported by `art_rlvr.config` (the CLI validates keys before `import art`), so this module may
import pydantic and `art_rlvr.llm` (which imports litellm lazily) but nothing heavy.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from art_rlvr.llm import LLMSettings


class EIConfig(BaseModel):
    """Expert iteration: best-of-N self-distillation, with optional teacher hints.

    One round: `scenarios_per_round` train scenarios, `expert_samples_per_x` clean attempts
    each; solved scenarios keep their best correct attempts; unsolved ones (with
    `enable_teacher_hints`) get a non-leaking teacher hint and `hinted_samples_per_x` hinted
    attempts; every success is relabelled to the clean prompt and distilled (`distill`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # schedule
    rounds: int = Field(default=8, ge=0)
    scenarios_per_round: int = Field(default=16, ge=1)
    expert_samples_per_x: int = Field(default=6, ge=1)
    keep_per_x: int = Field(default=1, ge=1)
    eval_every_rounds: int = Field(default=2, ge=1)

    # distillation: "sft" (model.train_sft, assistant tokens only) or "rl" (backend.train on
    # groups of relabelled successes next to failed clean attempts; off-policy, see README)
    distill: Literal["sft", "rl"] = "sft"
    sft_learning_rate: float = Field(default=1e-3, gt=0.0)
    sft_batch_size: int = Field(default=8, ge=1)
    sft_epochs: int = Field(default=2, ge=1, le=20)

    # sampling (handed down from the run's keys on the command line)
    seed: int = 0
    max_tokens: int = Field(default=32, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=5.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)

    # teacher hints
    enable_teacher_hints: bool = False
    teacher_model: str | None = None  # None: the embedded model through its own endpoint
    teacher_api_base: str | None = None
    teacher_api_key_env: str | None = None
    teacher_timeout_s: float = Field(default=120.0, gt=0)
    teacher_max_retries: int = Field(default=4, ge=0, le=20)
    teacher_backoff_s: float = Field(default=1.0, ge=0)
    teacher_backoff_max_s: float = Field(default=60.0, ge=0)
    teacher_temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    teacher_max_tokens: int = Field(default=256, ge=8)
    teacher_concurrency: int = Field(default=4, ge=1, le=64)
    max_hint_chars: int = Field(default=300, ge=16)
    max_hint_attempts: int = Field(default=3, ge=1, le=10)
    hinted_samples_per_x: int | None = Field(default=None, ge=1)  # None: expert_samples_per_x
    answer_field: str = "answer"  # the record field holding the gold answer (teacher + leak check)
    solution_field: str | None = "solution"  # a reference solution, shown to the teacher if present
    hint_reliance: bool = True  # score log p(y | hinted) - log p(y | clean) where the backend can
    log_excerpts: int = Field(default=2, ge=0)

    @field_validator("sft_learning_rate")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> EIConfig:
        if self.teacher_api_base and not self.teacher_model:
            raise ValueError("teacher_api_base needs teacher_model (e.g. 'openai/<name>')")
        if not self.answer_field:
            raise ValueError("answer_field must name a record field")
        return self

    @property
    def hinted_samples(self) -> int:
        return self.hinted_samples_per_x or self.expert_samples_per_x

    def teacher_settings(self) -> LLMSettings | None:
        """The external teacher, or None for the embedded model."""
        if self.teacher_model is None:
            return None
        return LLMSettings(
            model=self.teacher_model,
            api_base=self.teacher_api_base,
            api_key_env=self.teacher_api_key_env,
            **self.teacher_overrides(),
        )

    def teacher_overrides(self) -> dict[str, float | int]:
        return {
            "timeout_s": self.teacher_timeout_s,
            "max_retries": self.teacher_max_retries,
            "backoff_initial_s": self.teacher_backoff_s,
            "backoff_max_s": self.teacher_backoff_max_s,
            "temperature": self.teacher_temperature,
            "max_tokens": self.teacher_max_tokens,
        }
