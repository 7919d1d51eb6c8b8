"""Typed run records: every line of `metrics.jsonl` and the `summary.json` of a run.

Writers (the loops, `run.py`) build these models and readers (the report, `compare`, the
end-of-run summary) parse them back through the same models, so a key is spelt in one place.
The JSON on disk stays flat, as runs have always written it; a record from an older run that
lacks a newer optional field still parses. Events whose extra keys are the backend's own
training metrics (`train/loss`, ...) allow extras: ART backends report what they report.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

EPISODE_COUNTS = ("turns", "tool_calls", "tool_errors", "illegal_actions", "turn_cap_hit")


def episode_means(metrics: Iterable[Mapping[str, object]]) -> dict[str, float]:
    """Means over episodes of the multi-turn counts (`turns_per_episode`, ...), each over the
    episodes that report it: none for single-turn rollouts, whose records stay as they were."""
    rows = list(metrics)
    found = {
        key: [float(v) for m in rows if isinstance(v := m.get(key), int | float)]
        for key in EPISODE_COUNTS
    }
    return {f"{key}_per_episode": statistics.fmean(v) for key, v in found.items() if v}


class _Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def line(self) -> dict[str, object]:
        """The flat JSON object written to metrics.jsonl."""
        return self.model_dump(mode="json")


class _Timed(_Event):
    wall_seconds: float = 0.0  # since the start of this session
    cpu_seconds: float = 0.0


class EvalEvent(_Timed):
    """A held-out evaluation at a checkpoint step (in mode=ei also the round it came before)."""

    event: Literal["eval"] = "eval"
    split: str
    step: int  # the model's step (a run written before 2026-11-24 by mode=ei: the round)
    round: int | None = None  # mode=ei: the round
    accuracy: float
    reward_mean: float
    format: float = 0.0
    tokens_per_completion: float = 0.0
    errors: int = 0
    first_error: str | None = None
    tag: str = ""
    # a sampled evaluation (eval_samples=n): pass@k by k, and which policy it scored
    samples: int = 1
    pass_at: dict[int, float] = Field(default_factory=dict)
    pass_all: dict[int, float] = Field(default_factory=dict)  # pass^k: all k samples correct
    policy: str | None = None  # an external model's litellm string; None: the run's own model
    completion_tokens: int | None = None
    cost_usd: float | None = None  # litellm's price, where it knows the model's; else None
    # a mixture (scenario=arith,gsm8k): accuracy (pass@1) per scenario; `accuracy` is their mean
    by_scenario: dict[str, float] = Field(default_factory=dict)

    @property
    def index(self) -> int:
        """Where the evaluation sits on its run's axis: the round in mode=ei, else the step."""
        return self.round if self.round is not None else self.step


class TrainEvent(_Timed):
    """One RL step: its batch statistics and the backend's `train/*` metrics (extras)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    event: Literal["train"] = "train"
    step: int
    reward_mean: float = 0.0
    reward_std: float = 0.0
    accuracy: float = 0.0
    format: float = 0.0
    tokens_per_completion: float = 0.0
    frac_all_correct: float = 0.0
    frac_all_wrong: float = 0.0
    frac_mixed: float = 0.0
    trajectories: float = 0.0
    groups: float = 0.0
    recovered_after_kill: float | None = None
    seconds: float = 0.0

    def train_metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in (self.model_extra or {}).items() if k.startswith("train/")}


class AlarmEvent(_Event):
    """The reward-hacking alarm, or a plateau's early stop (`event` says which)."""

    event: Literal["alarm", "early_stop"]
    kind: str
    step: int
    message: str


class GepaEvent(_Timed):
    """One GEPA proposal (or the seed's evaluation) and its verdict."""

    event: Literal["gepa"] = "gepa"
    kind: str
    iteration: int
    attempt: int | None = None  # the reflection attempt; none for the seed and merges
    parents: list[int] = Field(default_factory=list)
    accepted: bool = False
    score_before: float | None = None
    score_after: float | None = None
    pareto_mean: float | None = None
    candidate: int | None = None
    reason: str | None = None
    metric_calls: int = 0
    rejection: str | None = None
    round: int | None = None  # the schedule's round (GEPA + RL)


class GepaDoneEvent(_Timed):
    """The end of a GEPA run: its summary's numbers (extras, as the optimizer reports them)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    event: Literal["gepa_done"] = "gepa_done"


class PromptChangeEvent(_Event):
    """GEPA + RL: the schedule adopted a new system prompt after a GEPA phase."""

    event: Literal["prompt_change"] = "prompt_change"
    round: int
    phase: int
    step: int
    old: str
    new: str
    old_pareto_mean: float | None = None
    new_pareto_mean: float | None = None
    origin: str | None = None
    old_val_accuracy: float | None = None
    new_val_accuracy: float | None = None


class EIRoundEvent(_Timed):
    """One expert-iteration round: its `RoundStats` fields and `train/*` metrics (extras)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    event: Literal["ei_round"] = "ei_round"
    round: int
    step: int
    trained: bool | None = None
    seconds: float = 0.0

    def stat(self, name: str, default: float = 0.0) -> float:
        value = (self.model_extra or {}).get(name)
        return float(value) if isinstance(value, int | float) else default


Event = Annotated[
    EvalEvent
    | TrainEvent
    | AlarmEvent
    | GepaEvent
    | GepaDoneEvent
    | PromptChangeEvent
    | EIRoundEvent,
    Field(discriminator="event"),
]
EVENT = TypeAdapter(Event)


class RolloutsFailed(RuntimeError):
    """Every rollout of an evaluation (or a step) raised: an error with its cause, never an
    accuracy of 0.0. The CLI exits 1 with it and summary.json records it as `failed`."""


class RecordError(ValueError):
    """A metrics line that parses as JSON but is no known event."""


def parse_event(data: dict[str, object]) -> Event:
    try:
        return EVENT.validate_python(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise RecordError(f"not a run event ({where}: {first['msg']}): {data!r:.200}") from None


def parse_events(lines: list[str]) -> list[Event]:
    """metrics.jsonl lines -> events; a line torn by a kill mid-write is skipped."""
    out = []
    for line in lines:
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        out.append(parse_event(data))
    return out


class RunSummary(BaseModel):
    """summary.json: what every mode reports, plus that mode's own detail (extras)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    mode: str
    phases: list[str] | None = None  # the labels of the run's phases (a mode: its preset's)
    scenario: str
    seed: int
    base_model: str | None = None
    wall_seconds: float = 0.0
    peak_rss_mb: float = 0.0
    val_accuracy_before: float | None = None
    val_accuracy_after: float | None = None
    test_accuracy_after: float | None = None
    steps: int | None = None
    rounds: int | None = None
    rollouts: int | None = None
    training_tokens: int | None = None
    # steps booked after a kill whose training metrics (loss, tokens) were lost: not counted
    # in training_tokens (their metrics lines say `recovered_after_kill`)
    recovered_steps: list[int] | None = None
    seconds_per_step_median: float | None = None
    alarms: list[dict[str, object]] = Field(default_factory=list)
    early_stop: dict[str, object] | None = None
    reflection_calls: int | None = None
    reflection_errors: int | None = None
    teacher_calls: int | None = None
    teacher_errors: int | None = None  # scenarios whose teacher call failed after retries
    prompt_changes: int | None = None
    final_prompt: str | None = None
    best_prompt: str | None = None
    seed_prompt: str | None = None
    examples_distilled: int | None = None
    policy: str | None = None  # mode=eval of an external model: its litellm string
    eval_samples: int | None = None  # samples per item of a sampled evaluation
    pass_at_k: dict[int, float] | None = None  # k -> val pass@k (unbiased estimator)
    pass_all_k: dict[int, float] | None = None  # k -> val pass^k (unbiased estimator)
    completion_tokens: int | None = None  # completion tokens an evaluation spent
    cost_usd: float | None = None  # its price from litellm; None where litellm has none
    failed: str | None = None  # why the run stopped, when it failed (e.g. every rollout errored)
    correct_rule: str | None = None  # what counted as correct in its accuracies
    # a mixture: its weights, and accuracy per scenario at the first and last val evaluation
    # and on test (the overall accuracies above are the mean over scenarios)
    mixture: dict[str, float] | None = None
    val_by_scenario_before: dict[str, float] | None = None
    val_by_scenario_after: dict[str, float] | None = None
    test_by_scenario_after: dict[str, float] | None = None
