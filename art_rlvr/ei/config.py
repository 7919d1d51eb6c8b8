"""EIConfig: every knob of an expert-iteration run, validated and frozen.

Imported by `config.run_config` (the CLI validates keys before `import art`), so this module may
import pydantic and `art_rlvr.llm.client` (which imports litellm lazily) but nothing heavy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from art_rlvr.llm.settings import LLMRole, refuse_renamed, role_over_defaults
from art_rlvr.rollouts.sampling import GroupSize, MaxTokens, Temperature, TopP
from art_rlvr.scenarios.scenario import tool_choice_problem

if TYPE_CHECKING:
    from art_rlvr.scenarios.scenario import Scenario

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
    rounds: int = Field(default=8, ge=0, description="expert-iteration rounds (mode=ei)")
    scenarios_per_round: int = Field(default=16, ge=1, description="train scenarios per round")
    group_size: GroupSize = Field(default=6, description="clean attempts per scenario")
    keep_per_x: int = Field(
        default=1, ge=1, description="correct attempts kept per solved scenario"
    )
    eval_every_rounds: int = Field(
        default=2,
        ge=1,
        description="greedy val evaluations every N rounds (round 0 and the last always)",
    )

    # distillation: "sft" (model.train_sft, assistant tokens only) or "rl" (backend.train on
    # groups of relabelled successes next to failed clean attempts; off-policy, see README)
    distill: Literal["sft", "rl"] = Field(
        default="sft", description="sft (model.train_sft) or rl (backend.train, off-policy)"
    )
    sft_learning_rate: float = Field(
        default=1e-3, gt=0.0, allow_inf_nan=False, description="SFT learning rate"
    )
    sft_batch_size: int = Field(default=8, ge=1, description="SFT batch size")
    sft_epochs: int = Field(default=2, ge=1, le=20, description="SFT epochs per round")

    # sampling (handed down from the run's keys on the command line)
    seed: int = Field(default=0, description="seeds the round's scenarios and sampling")
    max_tokens: MaxTokens = Field(default=32, description="completion tokens per attempt")
    temperature: Temperature = Field(default=1.0, description="attempt sampling temperature")
    top_p: TopP = Field(default=1.0, description="attempt nucleus sampling")
    search_tool_choice: str | None = Field(
        default=None,
        description=(
            "tool_choice of the attempts (a tool's name: a model that never calls the tool "
            "finds successes); distilled episodes train and are evaluated without it"
        ),
    )

    # teacher hints
    enable_teacher_hints: bool = Field(
        default=False, description="hint the scenarios the student cannot solve"
    )
    # the teacher LM (model unset: the embedded model itself, through its own endpoint)
    teacher: LLMRole = Field(
        default_factory=lambda: LLMRole.model_validate(TEACHER_DEFAULTS),
        description="the teacher LM: teacher.model=..., etc.",
    )
    teacher_concurrency: int = Field(default=4, ge=1, le=64, description="teacher calls in flight")
    max_hint_chars: int = Field(default=300, ge=16, description="hints are cut at a word boundary")
    max_hint_attempts: int = Field(
        default=3, ge=1, le=10, description="teacher replies asked for before a scenario is dropped"
    )
    hinted_samples_per_x: int | None = Field(
        default=None, ge=1, description="hinted attempts per hinted scenario; default group_size"
    )
    answer_field: str = Field(
        default="answer",
        description="the record field with the gold answer (teacher and leak check only)",
    )
    solution_field: str | None = Field(
        default="solution",
        description="a reference solution shown to the teacher, if the record has it",
    )
    hint_reliance: bool = Field(
        default=True, description="score log p(y | hinted) - log p(y | clean) (TorchBackend only)"
    )
    log_excerpts: int = Field(
        default=2, ge=0, description="hints and relabelled examples shown in run.log per round"
    )

    @model_validator(mode="before")
    @classmethod
    def _teacher(cls, data: Any) -> Any:
        refuse_renamed(data, "EIConfig")
        return role_over_defaults(data, "teacher", TEACHER_DEFAULTS)

    @model_validator(mode="after")
    def _consistent(self) -> EIConfig:
        if not self.answer_field:
            raise ValueError("answer_field must name a record field")
        return self

    @property
    def hinted_samples(self) -> int:
        return self.hinted_samples_per_x or self.group_size


def record_field(x: Any, path: str) -> Any:
    """A record's field by name, or a nested one by a dotted path (`data.answer`, as a
    verifiers task's record holds it); None where there is none."""
    for part in path.split("."):
        if not isinstance(x, dict) or part not in x:
            return None
        x = x[part]
    return x


def start_problem(
    config: EIConfig, scenario: Scenario, system_prompt: str | None = None
) -> str | None:
    """Why expert iteration cannot run on `task` under the run's `system_prompt` (an empty
    train split, a teacher without the gold answer field, a search tool_choice the scenario has
    no tool for, a rollout function without a context and no system prompt to put the hint
    in), or None. Pure and light: the CLI asks before any model loads, the loop again when it
    starts."""
    fn, prompt = scenario.rollout_fn, system_prompt or scenario.default_system_prompt
    if fn is not None and not fn.takes_context and not prompt:
        return (
            f"rollout function {fn.ref!r} takes (model, record) and the scenario has no "
            "system_prompt: expert iteration sends a hinted attempt its hint in the system "
            "message its client sends (replacing the function's own), so set the scenario's "
            "system_prompt (the clean one), or add a third parameter `context` and send "
            "`context.system_prompt`"
        )
    train = scenario.splits["train"]
    if not train:
        return f"scenario {scenario.name} has an empty train split; EI needs one"
    if config.enable_teacher_hints and record_field(train[0].x, config.answer_field) is None:
        return (
            f"answer_field={config.answer_field!r} is not a field of {scenario.name} records "
            f"(fields: {', '.join(sorted(train[0].x))}; a nested one as data.answer); the "
            "teacher needs the gold answer"
        )
    tools = scenario.environment.tools if scenario.environment is not None else ()
    if problem := tool_choice_problem(config.search_tool_choice, tools):
        return f"ei.search_tool_choice: {problem} (scenario {scenario.name})"
    return None
