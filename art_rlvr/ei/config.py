"""EIConfig: every knob of an expert-iteration run, validated and frozen.

Imported by `art_rlvr.config` (the CLI validates keys before `import art`), so this module may
import pydantic and `art_rlvr.llm` (which imports litellm lazily) but nothing heavy.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from art_rlvr.llm import LLMRole, flat_role_aliases, renamed

TEACHER_DEFAULTS = {"max_tokens": 256}  # a hint is short


class EIConfig(BaseModel):
    """Expert iteration: best-of-N self-distillation, with optional teacher hints.

    One round: `scenarios_per_round` train scenarios, `group_size` clean attempts
    each; solved scenarios keep their best correct attempts; unsolved ones (with
    `enable_teacher_hints`) get a non-leaking teacher hint and `hinted_samples_per_x` hinted
    attempts; every success is relabelled to the clean prompt and distilled (`distill`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # schedule
    rounds: int = Field(default=8, ge=0)
    scenarios_per_round: int = Field(default=16, ge=1)
    group_size: int = Field(default=6, ge=1)  # clean attempts per scenario
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
    # the teacher LM (model unset: the embedded model itself, through its own endpoint)
    teacher: LLMRole = Field(
        default_factory=lambda: LLMRole(**TEACHER_DEFAULTS),
        description="the teacher LM: teacher.model=..., etc.",
    )
    teacher_concurrency: int = Field(default=4, ge=1, le=64)
    max_hint_chars: int = Field(default=300, ge=16)
    max_hint_attempts: int = Field(default=3, ge=1, le=10)
    hinted_samples_per_x: int | None = Field(default=None, ge=1)  # None: group_size
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

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        data = renamed(data, {"expert_samples_per_x": "group_size"}, "EIConfig")
        return flat_role_aliases(data, "teacher", "EIConfig", TEACHER_DEFAULTS)

    @model_validator(mode="after")
    def _consistent(self) -> EIConfig:
        if not self.answer_field:
            raise ValueError("answer_field must name a record field")
        return self

    @property
    def hinted_samples(self) -> int:
        return self.hinted_samples_per_x or self.group_size

    @property
    def expert_samples_per_x(self) -> int:
        """The old name of `group_size`, for code written against it."""
        return self.group_size
